"""``agentgym eval --policy openai``: the server's own answer to a wrong URL, name or key.

Why: a ``--base-url`` without its ``/v1``, a ``--model`` the server does not serve or a
refused ``--api-key`` made every episode fail with a 404 or 401, filed as ``infra_error``: the
run exited 75 (which queues a retry that can never succeed) and said to fix "the model server
or sandbox". The server lists what it serves at ``/models``; asked once before any episode, it
turns each of those mistakes into one line naming the fix. A server that cannot be reached is
left to the run, which files its episodes as ``infra_error`` (down is the machinery's failure).
"""

from __future__ import annotations

from typing import Any

import httpx

from ._errors import ConfigError

#: Seconds the one ``/models`` request may take before the check gives up and lets the run go.
PROBE_TIMEOUT_S = 10.0


def check_served_model(base_url: str, model: str, api_key: str | None) -> None:
    """Refuse ``--base-url`` / ``--model`` / ``--api-key`` the server at ``base_url`` rejects."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = _get(f"{base_url.rstrip('/')}/models", headers)
    if response is None:
        return
    if response.status_code in (401, 403):
        raise ConfigError(
            f"{base_url} refused the API key ({response.status_code}); pass --api-key (or set "
            "OPENAI_API_KEY) to a key it accepts"
        )
    if response.status_code == 404:
        _refuse_a_root_without_v1(base_url, headers)
        return
    served = _served_names(response)
    if served and model not in served and f"{model}:latest" not in served:  # Ollama's tags
        raise ConfigError(
            f"--model {model} is not served at {base_url}; it serves {', '.join(served)}: "
            f"pass --model {served[0]}"
        )


def _refuse_a_root_without_v1(base_url: str, headers: dict[str, str]) -> None:
    """A 404 at ``/models`` where ``/v1/models`` answers: the URL lacks its ``/v1``."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        return
    response = _get(f"{root}/v1/models", headers)
    if response is not None and response.status_code == 200:
        raise ConfigError(
            f"--base-url {base_url} serves no OpenAI API (404 at /models); it is at "
            f"{root}/v1: pass --base-url {root}/v1"
        )


def _get(url: str, headers: dict[str, str]) -> httpx.Response | None:
    """``GET url``, or None where the server cannot be reached (the run reports that)."""
    try:
        return httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return None


def _served_names(response: httpx.Response) -> list[str]:
    """The model ids a 200 ``/models`` answer lists; empty where it is not that shape."""
    if response.status_code != 200:
        return []
    try:
        data: Any = response.json().get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
