"""``agentgym sandbox build | ls | prune | bench`` (mounted by the main CLI)."""

from __future__ import annotations

import enum
import time
from typing import Annotated

import typer
from rich.table import Column, Table
from rich.text import Text

from agentgym._cli_common import PipedConsole
from agentgym._errors import ConfigError

from . import _reap
from ._config import DEFAULT_IMAGE, check_image

app = typer.Typer(help="Build the sandbox image; list, prune and benchmark sandbox containers.",
                  no_args_is_help=True)
console = PipedConsole(markup=False)  # errors and build logs are not markup


class Method(enum.StrEnum):
    """How `build` makes the image."""

    auto = "auto"  # Dockerfile if a registry answers, else debootstrap
    debootstrap = "debootstrap"  # offline: Debian root filesystem + docker import (root)
    dockerfile = "dockerfile"  # sandboxes/Dockerfile (needs a registry)


def _log(message: str) -> None:
    console.print(Text(message, style="dim"))


HostOption = Annotated[str | None, typer.Option(
    "--host", help="Docker host: unix://, tcp:// (with --cert-dir) or ssh://. Default: this "
    "machine's daemon (DOCKER_HOST).")]  # fmt: skip
CertDirOption = Annotated[str | None, typer.Option(
    "--cert-dir", help="Folder with ca.pem, cert.pem, key.pem for a tcp:// host (mutual TLS).")]


def _client(host: str | None, cert_dir: str | None) -> object:
    """A client of the daemon the command looks at (`DockerHost` checks the address)."""
    from ._hosts import DockerHost

    if cert_dir and not (host or "").startswith("tcp://"):  # it ended in docker's traceback
        raise ConfigError("--cert-dir is for a tcp:// daemon: give --host tcp://HOST:2376 too")
    return DockerHost.parse({"url": host, "cert_dir": cert_dir} if cert_dir else host).connect()


@app.command()
def build(
    method: Annotated[Method, typer.Option(help="auto | debootstrap | dockerfile")] = Method.auto,
    tag: Annotated[str, typer.Option(help="Image tag to build.")] = DEFAULT_IMAGE,
    mirror: Annotated[str | None, typer.Option(
        help="Debian mirror (default: this machine's apt sources).")] = None,
    if_missing: Annotated[bool, typer.Option(
        "--if-missing", help="Do nothing when the tag already exists.")] = False,
) -> None:
    """Build the default sandbox image (python3 + pytest)."""
    from ._client import docker_client
    from ._image import build_image

    check_image(tag)  # `--tag ""` built for a minute, then failed as infrastructure (exit 75)

    if if_missing:
        from ._client import import_docker

        client = docker_client()  # a daemon it cannot reach is that error, not "build it"
        try:
            client.images.get(tag)
        except import_docker().errors.ImageNotFound:
            pass
        else:
            console.print(f"{tag} exists; nothing to build (drop --if-missing to rebuild)")
            return
    started = time.monotonic()
    with console.status(f"building {tag} ({method.value})"):
        image_id = build_image(tag=tag, method=method.value, mirror=mirror, log=_log)
    seconds = time.monotonic() - started
    console.print(Text.assemble(("built", "green"), f" {tag} {image_id[:19]} in {seconds:.0f} s"))


@app.command("ls")
def list_containers(host: HostOption = None, cert_dir: CertDirOption = None) -> None:
    """List agentgym containers and whether their owner process is alive."""
    containers = _reap.managed_containers(_client(host, cert_dir))
    table = Table("image", "status", "owner pid", "owner alive", "pool")
    table.columns.insert(0, Column("id", no_wrap=True, min_width=12))
    for c in containers:
        labels = c.labels
        table.add_row(c.short_id, ",".join(c.image.tags) or c.image.short_id, c.status,
                      labels.get(_reap.OWNER, "?"), "yes" if _reap.owner_alive(labels) else "no",
                      labels.get(_reap.POOL, ""))
    console.print(table)
    console.print(f"{len(containers)} container(s)")


@app.command()
def prune(
    all_: Annotated[bool, typer.Option(
        "--all", help="Remove every agentgym container, even those of live owners.")] = False,
    host: HostOption = None,
    cert_dir: CertDirOption = None,
) -> None:
    """Remove agentgym containers whose owner is gone or that expired (or all with --all)."""
    removed = _reap.reap_leaked(_client(host, cert_dir), everything=all_)
    console.print(f"removed {len(removed)} container(s)" +
                  (f": {' '.join(removed)}" if removed else ""))


@app.command()
def bench(
    image: Annotated[str, typer.Option(help="Image to benchmark.")] = DEFAULT_IMAGE,
    pool_size: Annotated[int, typer.Option(help="Warm containers in the pool.")] = 4,
    n: Annotated[int, typer.Option(help="Warm runs to time.")] = 300,
    humaneval: Annotated[bool, typer.Option(
        help="Also time verifying HumanEval's 164 canonical solutions.")] = True,
) -> None:
    """Measure warm vs cold latency, throughput and HumanEval verification time."""
    from ._bench import run_bench

    result = run_bench(image=image, pool_size=pool_size, n=n, humaneval=humaneval, log=_log)
    for line in result.lines():
        console.print(line)
