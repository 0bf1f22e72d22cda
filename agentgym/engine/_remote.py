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
import logging
import math
import os
import re
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal

from .._errors import ConfigError, ContextLengthError, ModelError
from .._policies import check_server_url
from .._types import Completion
from ._episode import (
    AdapterVersion,
    ModeChoice,
    SamplingConfig,
    TokenPolicy,
    next_adapter_version,
)
from ._fleet import NO_ADAPTER_API, VLLMFleet, server_root, stage_adapter
from ._render import ChatRenderer, policy_renderer

log = logging.getLogger(__name__)
_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context_length_exceeded|too long")
#: Answers after which the same request may succeed on another server.
_SERVER_FAILURE = frozenset({500, 502, 503, 504})
ServerFailurePolicy = Literal["retry", "fail"]
#: Why a turn ends: its own stop, its limit, or vLLM's repetition detection (the model's own
#: output, so never a server failure the model could use to leave its group). vLLM's "abort"
#: and "error" (and anything else) mean the server cut it short.
_FINISHED = frozenset({"stop", "length", "repetition"})
#: Where a user gave each kind of URL (eval option / training config key).
_URL_OPTIONS = {
    "server": "--server / rollout_servers",
    "router": "--router-url / rollout_router_url",
}


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
        publishes_adapters: `load_adapter` will be called (a trainer): `start` then also
            checks that every server has the runtime adapter API, so a server started without
            it is refused before the run, not after its first optimiser step.
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
        publishes_adapters: bool = False,
    ) -> None:
        super().__init__(sampling, rollout_mode)
        if on_server_failure not in ("retry", "fail"):
            raise ConfigError(
                f"on_server_failure must be 'retry' or 'fail', got {on_server_failure!r}"
            )
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        for url in fleet.urls:
            _check_url(url, "server")
        if router_url:
            _check_url(router_url, "router")
        self.model = str(model)
        self.fleet = fleet
        self.router_url = server_root(router_url) if router_url else None
        self.max_model_len = max_model_len
        self.on_server_failure = on_server_failure
        self.max_attempts = max_attempts if on_server_failure == "retry" else 1
        self.adapter_storage = Path(adapter_storage) if adapter_storage else None
        self.publishes_adapters = publishes_adapters
        self._chat_template_kwargs = chat_template_kwargs
        self._renderer: ChatRenderer | None = None
        self._vocab_size: int | None = None

    def start(self) -> None:
        """`check_servers`, then load the tokenizer and the vocabulary size."""
        self.check_servers()
        _ = self.renderer, self.vocab_size  # read from disk now, not on a turn's event loop

    def check_servers(self) -> None:
        """Check that every server (and the router) answers and serves the model now, not mid-run.

        With ``publishes_adapters``, also that each can load adapters. Raises `ConfigError`
        naming the fix, or `ModelError` when a server is unreachable.
        """

        async def check() -> None:
            for url in self.fleet.urls:
                names = await self._names_at_start(url, "server")
                self._require_model(url, names)
                if self.publishes_adapters:
                    await self._prepare_for_adapters(url, names)
            if self.router_url is not None:
                await self._check_router(self.router_url)

        self._run_then_close(check())

    async def _prepare_for_adapters(self, url: str, served: set[str]) -> None:
        """``url`` must load adapters; the versions a killed process of this run left go."""
        if not await self.fleet.serves_adapters(url):
            raise ConfigError(f"{url} {NO_ADAPTER_API}")
        stale = await self.fleet.unload_earlier_processes(url, served)
        if stale:
            log.info("unloaded %s from %s: this run's earlier process left them", stale, url)

    def unload_published(self) -> None:
        """Unload the versions this policy published from the servers (the run is over)."""
        self._run_then_close(self.fleet.unload_published())

    def _run_then_close(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` from sync code on a loop of its own, then close the fleet's pool there.

        The pool (and any probe) belongs to that loop: left open when `asyncio.run` ends it,
        its sockets and tasks would be dropped unclosed.
        """

        async def run() -> None:
            try:
                await work
            finally:
                await self.fleet.aclose()

        asyncio.run(run())

    async def _names_at_start(self, url: str, what: str) -> set[str]:
        """What ``url`` serves; unreachable is a `ModelError` that names the fix.

        Why here: a typo'd or stopped URL found mid-run ends every episode ``infra_error``.
        """
        try:
            return await self.fleet.served_names(url)
        except ModelError as exc:
            option = _URL_OPTIONS[what]
            raise ModelError(
                f"{exc}; start that {what}, or fix or drop its URL ({option})"
            ) from exc

    def _require_model(self, url: str, names: set[str]) -> None:
        if self.fleet.model not in names:
            raise ConfigError(
                f"{url} serves {sorted(names)}, not {self.fleet.model!r}; give the "
                "servers' --served-model-name as the model name (--model NAME; train: "
                "rollout_model_name)"
            )

    async def _check_router(self, url: str) -> None:
        """The router must answer and route to the model, before any episode is played.

        Without this check a wrong router URL ran the whole eval or step, every turn failing
        in transit, every episode ``infra_error``.
        """
        self._require_model(url, await self._names_at_start(url, "router"))

    def close(self) -> None:
        """Nothing to shut down: the servers are not ours and keep running."""

    # ---- the model's tokenizer -----------------------------------------------------------
    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer (loaded on first use)."""
        if self._renderer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model)
            self._renderer = policy_renderer(tokenizer, self._chat_template_kwargs)
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
            turn = await self._attempt(body, prompt_ids, version, session, failures)
            if turn is not None:
                return turn
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
            "cache_salt": self.fleet.served_name(version), **s.extra_for(limit),
        }  # fmt: skip

    async def _attempt(
        self, body: dict[str, Any], prompt_ids: list[int], version: int, session: str | None,
        failures: list[str],
    ) -> Completion | None:  # fmt: skip
        """One try on one server (or the router): the turn, or None after a server failure.

        The fleet's replica is held only while its request is in flight, so a failure, a
        malformed answer or a cancellation all give the slot back.
        """
        if self.router_url is not None:
            headers = {"X-Session-ID": session} if session else {}
            return await self._ask(self.router_url, False, body, headers, prompt_ids, version,
                                   failures)  # fmt: skip
        async with self.fleet.replica(session) as replica:
            return await self._ask(replica.url, True, body, {}, prompt_ids, version, failures)

    async def _ask(
        self, url: str, replica: bool, body: dict[str, Any], headers: dict[str, str],
        prompt_ids: list[int], version: int, failures: list[str],
    ) -> Completion | None:  # fmt: skip
        """Send the turn to ``url``; ``replica``: a fleet server, routed around when it fails."""
        import httpx

        try:  # the fleet's pool: one set of connections (and its bearer token)
            response = await self.fleet.http.get().post(
                f"{url}/v1/completions", json=body, headers=headers
            )
        except httpx.TransportError as exc:  # refused, reset mid-answer, timed out
            self._server_failed(url, replica, failures, repr(exc))
            return None
        if response.status_code != 200:
            self._refused(response, url, replica, version, failures)
            return None
        try:
            data = _json(response)
            turn = self._completion(data, prompt_ids, body["max_tokens"], version)
        except _MalformedAnswer as exc:
            self._server_failed(url, replica, failures, str(exc))
            return None
        served = data.get("model")  # vLLM names the adapter it really sampled with
        if isinstance(served, str) and not self._same_weights(served, body["model"], version):
            what = f"answered as {served!r} to a request for {body['model']!r}"
            self._server_failed(url, replica, failures, what)
            return None
        return turn

    def _refused(
        self, response: Any, url: str, replica: bool, version: int, failures: list[str]
    ) -> None:
        """A non-200 answer: a server failure (recorded, to retry), or an error to raise.

        404 for a version the fleet still keeps means that server lost the adapter (it was
        restarted): it is routed around until a probe loads the kept versions back.
        """
        status, text = response.status_code, response.text[:300]
        if status == 400 and _CONTEXT_OVERFLOW.search(text):
            raise ContextLengthError(f"the prompt outgrew the model's context: {text}")
        lost = status == 404 and self._kept(version)
        if status not in _SERVER_FAILURE and not lost:
            raise ModelError(f"{url}/v1/completions answered {status}: {text}")
        self._server_failed(url, replica, failures, f"answered {status}: {text}")

    def _kept(self, version: int) -> bool:
        """Whether every healthy server should serve ``version`` now."""
        return version == 0 or any(a.version == version for a in self.fleet.adapters)

    def _server_failed(self, url: str, replica: bool, failures: list[str], what: str) -> None:
        """Record a failure of ``url`` (routed around if it is a fleet server)."""
        if replica:
            self.fleet.mark_down(url, what)
        self._failed(failures, f"{url}: {what}")

    def _failed(self, failures: list[str], what: str) -> None:
        failures.append(what)
        if self.on_server_failure == "fail":
            raise ModelError(f"rollout server failed ({what}); on_server_failure='fail'")

    def _same_weights(self, served: str, asked: str, version: int) -> bool:
        """Whether an answer named ``served`` was sampled with the weights ``asked`` names.

        Another name is another adapter (a server that kept an old version, or lost the new
        one): the answer is a server failure, retried elsewhere, never a turn that would train
        on tokens of other weights. For the base model vLLM answers with its first
        ``--served-model-name``, which may differ from the one asked; any name that is not
        one of this run's adapters is the base model then.
        """
        if served == asked:
            return True
        return version == 0 and self.fleet.version_of(served) is None

    def _completion(self, data: Any, prompt_ids: list[int], limit: int, version: int) -> Completion:
        """The turn in a 200 answer, checked; raises `_MalformedAnswer` for anything else.

        Every field a trainer reads is checked against what was asked: an answer that does
        not add up is a broken server, never a turn (token-exactness is the contract).
        """
        choice = _choice(data)
        ids = _token_ids(choice, self.vocab_size)
        logprobs = _logprobs(choice, len(ids))
        finish = _finish_reason(choice, len(ids), limit)
        counted = _usage(data).get("completion_tokens")
        if isinstance(counted, int) and counted != len(ids):
            raise _MalformedAnswer(f"{len(ids)} token ids where usage counts {counted} (cut)")
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != list(prompt_ids):
            raise _MalformedAnswer("the answer was sampled from another prompt than the one sent")
        text = choice.get("text")
        return Completion(
            text=self.renderer.visible_text(text if isinstance(text, str) else "", ids),
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            adapter_version=version,
        )

    @property
    def vocab_size(self) -> int:
        """Token ids the model can sample (read once from the model folder's config).

        The embedding rows, padding included, and at least the tokenizer's length.
        """
        if self._vocab_size is None:
            from transformers import AutoConfig

            size = len(self.renderer.tokenizer)
            try:
                text_config = AutoConfig.from_pretrained(self.model).get_text_config()
                size = max(size, int(getattr(text_config, "vocab_size", 0) or 0))
            except (OSError, ValueError):  # a tokenizer-only folder: the tokenizer bounds it
                pass
            self._vocab_size = size
        return self._vocab_size

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


def _check_url(url: str, what: str) -> None:
    """Refuse a ``what`` URL that is not an http(s) server root alone, as `OpenAIPolicy` does.

    Why: a user:password in it was printed in every "is unreachable" line, and so kept in the
    run database's error tail.
    """
    check_server_url(url, _URL_OPTIONS[what], "http://127.0.0.1:8000",
                     "a key goes in VLLMFleet(api_key=...)")  # fmt: skip


class _MalformedAnswer(ModelError):
    """A 200 answer that is not a valid turn: the server is broken, the turn is not recorded."""


def _json(response: Any) -> Any:
    """The answer's JSON; a body that is not JSON (cut short, an HTML error page) is malformed."""
    try:
        return response.json()
    except ValueError as exc:
        raise _MalformedAnswer(f"answered 200 with no JSON: {response.text[:200]!r}") from exc


def _choice(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _MalformedAnswer(f"answered 200 with {type(data).__name__} JSON: {str(data)[:200]}")
    if "error" in data or data.get("object") == "error":  # an error dressed as a success
        raise _MalformedAnswer(f"answered 200 with an error: {str(data)[:300]}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _MalformedAnswer(f"answered 200 without a choice: {str(data)[:300]}")
    choice: dict[str, Any] = choices[0]
    return choice


def _usage(data: dict[str, Any]) -> dict[str, Any]:
    usage = data.get("usage")
    return usage if isinstance(usage, dict) else {}


def _token_ids(choice: dict[str, Any], vocab_size: int) -> list[int]:
    """The sampled ids, each a token of the vocabulary."""
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise _MalformedAnswer(
            f"the answer has no token ids (a vLLM server is needed): {str(choice)[:300]}"
        )
    bad = [i for i in ids if type(i) is not int or not 0 <= i < vocab_size]
    if bad:
        raise _MalformedAnswer(f"token ids outside the vocabulary of {vocab_size}: {bad[:5]}")
    return ids


def _logprobs(choice: dict[str, Any], count: int) -> list[float]:
    """One finite logprob per sampled id (the request asked for them: none is malformed)."""
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != count:
        got = len(logprobs) if isinstance(logprobs, list) else "no"
        raise _MalformedAnswer(f"{got} logprobs for {count} token ids")
    if not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
        for x in logprobs
    ):
        raise _MalformedAnswer(f"logprobs that are not finite numbers: {logprobs[:5]}")
    return [float(x) for x in logprobs]


def _finish_reason(choice: dict[str, Any], count: int, limit: int) -> str:
    """``stop``, or ``length`` exactly at the turn's limit; more tokens than asked is malformed."""
    finish = choice.get("finish_reason")
    if finish not in _FINISHED:
        raise _MalformedAnswer(f"the turn was cut short (finish_reason {finish!r})")
    if count > limit or (finish == "length" and count != limit):
        raise _MalformedAnswer(f"finish_reason {finish!r} after {count} of {limit} tokens")
    return str(finish)
