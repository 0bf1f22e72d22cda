"""`RemoteVLLMPolicy`: token-in/token-out episodes on vLLM servers, one machine or many.

The same contract as the in-process `VLLMPolicy`: the prompt goes out as the episode's exact
token ids (``/v1/completions`` accepts a list of ids, so the server never re-renders the
conversation), and the sampled ids, their logprobs and the adapter version come back. Only the
transport differs, so a trainer switches engines with one knob.

Routing: through a `VLLMFleet` (client-side sticky least-loaded router, for users without a
router), or through an existing router such as vllm-router (``--policy sticky_least_loaded``):
each request then carries the episode id as ``X-Session-ID`` and the episode's end calls
``/finish_session``; adapter publishes still fan out to every server through the fleet, since
routers forward requests, not adapter loads.

Server failures (``on_server_failure``): ``"retry"`` (default) sends the turn again to another
server, which is exact, not an approximation: the prompt ids are the episode's whole state and
every healthy server serves the same adapter version. ``"fail"`` ends the episode as
``infra_error`` at once (the trainer drops it from its group's statistics). Either way the
server is routed around and the run goes on.

The servers must report the logprobs actually sampled from: start them with
``--logprobs-mode processed_logprobs`` (`serve_vllm` does).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any, Literal

from .._errors import ConfigError, ContextLengthError, ModelError
from .._types import Completion
from ._episode import (
    AdapterVersion,
    ModeChoice,
    SamplingConfig,
    TokenPolicy,
    next_adapter_version,
)
from ._fleet import VLLMFleet, server_root, stage_adapter
from ._render import ChatRenderer

_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context_length_exceeded|too long")
#: Answers after which the same request may succeed on another server.
_SERVER_FAILURE = frozenset({500, 502, 503, 504})
ServerFailurePolicy = Literal["retry", "fail"]


class RemoteVLLMPolicy(TokenPolicy):
    """A token-in/token-out policy on OpenAI-compatible vLLM servers.

    Args:
        model: the local model folder whose tokenizer and chat template the servers use
            (prompts are rendered here, as token ids).
        fleet: the servers (`VLLMFleet`), used for adapter publishes and, without
            ``router_url``, for routing.
        router_url: an existing router's URL (vllm-router); requests go there with the
            episode id as ``X-Session-ID``.
        sampling: a `SamplingConfig` or a dict of its fields.
        max_model_len: the servers' context window.
        chat_template_kwargs: extra chat-template variables.
        rollout_mode: as for `VLLMPolicy`.
        on_server_failure: ``"retry"`` on another server, or ``"fail"`` the episode.
        max_attempts: servers tried per turn under ``"retry"``.
        adapter_storage: a folder every server can read (shared storage); `load_adapter`
            copies each version there atomically first. None: the paths given are readable
            by every server already (one machine).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        fleet: VLLMFleet,
        *,
        router_url: str | None = None,
        sampling: SamplingConfig | dict[str, Any] | None = None,
        max_model_len: int = 4096,
        chat_template_kwargs: dict[str, Any] | None = None,
        rollout_mode: ModeChoice = "auto",
        on_server_failure: ServerFailurePolicy = "retry",
        max_attempts: int = 3,
        adapter_storage: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(sampling, rollout_mode)
        if on_server_failure not in ("retry", "fail"):
            raise ConfigError(
                f"on_server_failure must be 'retry' or 'fail', got {on_server_failure!r}"
            )
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        self.model = str(model)
        self.fleet = fleet
        self.router_url = server_root(router_url) if router_url else None
        self.max_model_len = max_model_len
        self.on_server_failure = on_server_failure
        self.max_attempts = max_attempts if on_server_failure == "retry" else 1
        self.adapter_storage = Path(adapter_storage) if adapter_storage else None
        self._chat_template_kwargs = chat_template_kwargs
        self._renderer: ChatRenderer | None = None

    def start(self) -> None:
        """Check that every server answers and serves the model now, not mid-run.

        Also loads the tokenizer. Raises `ConfigError` naming the fix, or `ModelError` when a
        server is unreachable.
        """

        async def check() -> None:
            try:
                for url in self.fleet.urls:
                    names = await self.fleet.served_names(url)
                    if self.fleet.model not in names:
                        raise ConfigError(
                            f"{url} serves {sorted(names)}, not {self.fleet.model!r}; give the "
                            "servers' --served-model-name as the model name"
                        )
            finally:
                await self.fleet.aclose()

        asyncio.run(check())
        _ = self.renderer

    def close(self) -> None:
        """Nothing to shut down: the servers are not ours and keep running."""

    # ---- the model's tokenizer -----------------------------------------------------------
    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer (loaded on first use)."""
        if self._renderer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model)
            self._renderer = ChatRenderer(tokenizer, self._chat_template_kwargs)
        return self._renderer

    # ---- sampling -----------------------------------------------------------------------
    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        """Sample one turn from exact prompt ids on a server, with the current adapter."""
        s = sampling or self.sampling
        version = self.fleet.adapter_version
        body = self._request_body(prompt_ids, self.turn_limit(prompt_ids, max_tokens, s),
                                  seed, s, version)  # fmt: skip
        failures: list[str] = []
        for _ in range(self.max_attempts):
            data = await self._send(body, session, failures)
            if data is not None:
                return self._completion(data, prompt_ids, version)
        raise ModelError(f"no rollout server completed the turn: {'; '.join(failures)}")

    def _request_body(self, prompt_ids: list[int], limit: int, seed: int | None,
                      s: SamplingConfig, version: int) -> dict[str, Any]:  # fmt: skip
        return {
            "model": self.fleet.served_name(version), "prompt": prompt_ids,
            "max_tokens": limit, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1, "min_p": s.min_p, "seed": seed,
            "stop": list(s.stop) or None, "include_stop_str_in_output": True,
            "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            # a version's own prefix cache: KV of another version's weights is never reused
            "cache_salt": self.fleet.served_name(version), **s.extra,
        }  # fmt: skip

    async def _send(
        self, body: dict[str, Any], session: str | None, failures: list[str]
    ) -> dict[str, Any] | None:
        """One attempt: the response's JSON, or None after a server failure (recorded)."""
        import httpx

        if self.router_url is not None:
            headers = {"X-Session-ID": session} if session else {}
            try:
                response = await self.fleet.http.get().post(
                    f"{self.router_url}/v1/completions", json=body, headers=headers
                )
            except httpx.TransportError as exc:
                self._failed(failures, f"router {self.router_url}: {exc!r}")
                return None
            return self._checked(response, self.router_url, failures)
        async with self.fleet.replica(session) as replica:
            url = f"{replica.url}/v1/completions"
            try:  # the fleet's pool: one set of connections (and its bearer token)
                response = await self.fleet.http.get().post(url, json=body)
            except httpx.TransportError as exc:
                self.fleet.mark_down(replica.url, repr(exc))
                self._failed(failures, f"{replica.url}: {exc!r}")
                return None
            if response.status_code in _SERVER_FAILURE:
                self.fleet.mark_down(replica.url, f"answered {response.status_code}")
            return self._checked(response, replica.url, failures)

    def _checked(self, response: Any, url: str, failures: list[str]) -> dict[str, Any] | None:
        if response.status_code == 200:
            data: dict[str, Any] = response.json()
            return data
        text = response.text[:300]
        if response.status_code == 400 and _CONTEXT_OVERFLOW.search(text):
            raise ContextLengthError(f"the prompt outgrew the model's context: {text}")
        if response.status_code in _SERVER_FAILURE:
            self._failed(failures, f"{url} answered {response.status_code}: {text}")
            return None
        raise ModelError(f"{url}/v1/completions answered {response.status_code}: {text}")

    def _failed(self, failures: list[str], what: str) -> None:
        failures.append(what)
        if self.on_server_failure == "fail":
            raise ModelError(f"rollout server failed ({what}); on_server_failure='fail'")

    def _completion(self, data: dict[str, Any], prompt_ids: list[int], version: int) -> Completion:
        try:
            choice = data["choices"][0]
            ids = list(choice["token_ids"])
        except (KeyError, IndexError, TypeError) as exc:
            raise ModelError(
                f"the server's answer has no token ids (a vLLM server is needed): {str(data)[:300]}"
            ) from exc
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or None
        return Completion(
            text=self.renderer.visible_text(choice.get("text") or "", ids),
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason"),
            adapter_version=version,
        )

    async def end_session(self, session: str) -> None:
        """Forget the episode's pin (and tell the router, which keeps its own)."""
        self.fleet.finish_session(session)
        if self.router_url is not None:
            import httpx

            try:
                await self.fleet.http.get().post(
                    f"{self.router_url}/finish_session", params={"session_id": session},
                    headers={"X-Session-ID": session},
                )  # fmt: skip
            except httpx.TransportError:
                pass  # the router's pin expires on its own; the episode's result stands

    # ---- adapters -----------------------------------------------------------------------
    @property
    def adapter_version(self) -> int:
        """The version new turns sample with (0: the base model)."""
        return self.fleet.adapter_version

    @property
    def adapters(self) -> list[AdapterVersion]:
        """Versions every healthy server serves, oldest first."""
        return self.fleet.adapters

    async def aload_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Publish adapter folder ``path`` to every server as ``version`` (default: next)."""
        version = next_adapter_version(path, self.adapter_version, version)
        if self.adapter_storage is not None:
            path = stage_adapter(path, self.adapter_storage, version, self.fleet.namespace)
        await self.fleet.publish(Path(path).resolve(), version)
        return version

    def load_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """`aload_adapter` from synchronous code (a training loop between steps)."""
        return asyncio.run(self.aload_adapter(path, version))

    async def served_adapters(self) -> set[int]:
        """Versions served by every healthy server (a publish that reached one is not enough)."""
        per_server = await self.fleet.served_versions()
        return set.intersection(*per_server.values()) if per_server else set()

    async def aclose(self) -> None:
        """Close the connection pool (it reopens on demand; the servers keep running)."""
        await self.fleet.aclose()
