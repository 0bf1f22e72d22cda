"""The one place that imports the ``docker`` SDK, lazily, with errors that name the fix."""

from __future__ import annotations

from typing import Any

from agentgym._errors import SandboxError

INSTALL_HINT = "pip install 'agentgym[sandbox]'"


def import_docker() -> Any:
    """Return the ``docker`` module, or raise `SandboxError` naming the extra to install."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SandboxError(
            f"the Docker sandbox needs the `docker` package: {INSTALL_HINT}"
        ) from exc
    return docker


def docker_client(timeout: float = 60.0) -> Any:
    """A connected ``docker.DockerClient`` from the environment (``DOCKER_HOST`` or the socket).

    Raises `SandboxError` when the daemon does not answer a ping.
    """
    docker = import_docker()
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:
        raise SandboxError(
            f"cannot reach the Docker daemon ({type(exc).__name__}: {exc}); start dockerd "
            "or set DOCKER_HOST"
        ) from exc
    return client
