"""Policies: whatever produces the next assistant turn, token ids in and out where possible.

`Policy` is a one-method protocol, so a user's own backend (an in-process engine, a remote
service) plugs in without subclassing; a backend that keeps per-episode state (exact token
ids) also offers `start_episode`, returning a `PolicyEpisode`. Two ship here: `ScriptedPolicy`
(replays given turns; tests and oracle runs) and `OpenAIPolicy` (any OpenAI-compatible server;
with vLLM it also returns prompt and completion token ids and per-token logprobs, but the server
re-renders the conversation every turn, so it cannot promise token-exact multi-turn episodes:
use `agentgym.engine.VLLMPolicy` for training).
"""

from __future__ import annotations

import asyncio
import re
import reprlib
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._errors import ConfigError, ContextLengthError, ConversationError, ModelError
from ._http import LoopClient
from ._seeds import turn_seed
from ._types import Completion, Message

if TYPE_CHECKING:
    import httpx  # imported on first request: processes that only step envs never load it

#: How vLLM and OpenAI say that a prompt does not fit the context window.
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context_length_exceeded")


@runtime_checkable
class Policy(Protocol):
    """Produces the next assistant turn for a conversation."""

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        task: Any = None,
    ) -> Completion:
        """Return the assistant's next turn for ``messages`` given the ``tools`` schemas."""
        ...


@runtime_checkable
class PolicyEpisode(Protocol):
    """One episode's handle on a policy that keeps state across turns (token ids).

    A policy may offer ``start_episode(tools, *, task, seed) -> PolicyEpisode``; the rollout
    engine then asks the handle, not the policy, for each turn, so a token-in/token-out engine
    (`agentgym.engine.VLLMPolicy`) can extend the previous turn's exact ids instead of
    re-rendering the conversation. ``mode`` says how the episode trains: ``"concat"`` (one
    sequence) or ``"per_turn"`` (one sample per turn). A handle may also set ``mode_reason``
    when an episode switches to ``per_turn`` midway; the rollout records it in the
    trajectory's ``info``.
    """

    mode: str

    async def generate(
        self, messages: list[Message], *, max_tokens: int | None = None
    ) -> Completion:
        """The next turn; ``messages`` is the whole conversation so far."""
        ...


class RequestRefused(ModelError):
    """The backend refused the request as malformed (HTTP 400).

    Whose request it was depends on the turn: the first prompt is ours (a bad knob, a tool
    schema the server rejects: ``infra_error``); a later one was accepted until the model's
    turns, so what the model wrote made it unservable (Llama 3's template refuses two tool
    calls in one turn): `ConversationError`, the episode truncated and scored (`_StatelessEpisode`).
    """


class _StatelessEpisode:
    """The episode handle of a plain `Policy`: every turn is a fresh `Policy.generate` call."""

    mode = "per_turn"

    def __init__(self, policy: Policy, tools: list[dict[str, Any]], task: Any) -> None:
        self._policy, self._tools, self._task = policy, tools, task
        self._turns = 0

    async def generate(
        self, messages: list[Message], *, max_tokens: int | None = None
    ) -> Completion:
        try:
            completion = await self._ask(messages, max_tokens)
        except RequestRefused as exc:
            if not self._turns:
                raise
            raise ConversationError(
                f"the server refused the conversation after the model's turns: {exc}"
            ) from exc
        self._turns += 1
        return completion

    async def _ask(self, messages: list[Message], max_tokens: int | None) -> Completion:
        return await self._policy.generate(
            messages, self._tools, max_tokens=max_tokens, task=self._task
        )


class _SeededEpisode(_StatelessEpisode):
    """An `OpenAIPolicy` episode: each turn sends its own seed (`turn_seed`) to the server."""

    def __init__(
        self, policy: OpenAIPolicy, tools: list[dict[str, Any]], task: Any, seed: int
    ) -> None:
        super().__init__(policy, tools, task)
        self._server_policy, self._episode_seed = policy, seed

    async def _ask(self, messages: list[Message], max_tokens: int | None) -> Completion:
        seed = turn_seed(self._server_policy.sampling.get("seed"), self._episode_seed, self._turns)
        return await self._server_policy.generate(
            messages, self._tools, max_tokens=max_tokens, task=self._task, seed=seed
        )


def start_episode(
    policy: Policy, tools: list[dict[str, Any]], *, task: Any = None, seed: int | None = None
) -> PolicyEpisode:
    """The policy's own episode handle if it has one, else one over `Policy.generate`.

    Users' policies with only ``generate`` keep working unchanged.
    """
    start = getattr(policy, "start_episode", None)
    if start is None:
        return _StatelessEpisode(policy, tools, task)
    episode: PolicyEpisode = start(tools, task=task, seed=seed)
    return episode


class ScriptedPolicy:
    """Replays fixed assistant turns: the k-th call of an episode returns turn k.

    ``turns`` is one list for every episode, or a function of the task (e.g. an env's
    ``reference_turns``) for per-task oracles. Past the script it answers ``""`` (a final
    answer with no content), so a short script ends the episode rather than looping.

    Raises:
        ConfigError: ``turns`` is not a list of strings (a bare str would play its
            characters as turns), nor a function; a function's result is checked per turn.
    """

    def __init__(self, turns: Sequence[str] | Callable[[Any], Sequence[str]]) -> None:
        self._turns = turns if callable(turns) else _script(turns, "turns", _OR_FUNCTION)

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        task: Any = None,
    ) -> Completion:
        """The script's next turn: turn k when ``messages`` hold k assistant turns.

        ``tools`` and ``max_tokens`` are ignored (the script is fixed); ``task`` is passed to
        a ``turns`` function. Past the script's end the turn is ``""``.
        """
        if callable(self._turns):
            script = _script(self._turns(task), "the turns function's result")
        else:
            script = self._turns
        k = sum(1 for m in messages if m.get("role") == "assistant")
        return Completion(text=script[k] if k < len(script) else "", finish_reason="stop")


_OR_FUNCTION = " or a function of the task returning one"


def _script(turns: Any, what: str, alternative: str = "") -> Sequence[str]:
    """``turns`` if it is a list of strings; a ConfigError naming the mistake otherwise.

    Why: a str is a sequence of characters, so ``ScriptedPolicy("68.0")`` used to play
    ``"6"`` as its first turn, a silent wrong episode rather than an error.
    """
    if isinstance(turns, (str, bytes)):
        raise ConfigError(
            f"{what} must be a list of strings (one per assistant turn), got a "
            f"{type(turns).__name__}: wrap it in a list, [{reprlib.repr(turns)}]"
        )
    if not isinstance(turns, Sequence):
        raise ConfigError(
            f"{what} must be a list of strings (one per assistant turn){alternative}, got "
            f"{type(turns).__name__} {reprlib.repr(turns)}"
        )
    odd = [t for t in turns if not isinstance(t, str)]
    if odd:
        raise ConfigError(
            f"{what} must be a list of strings (one per assistant turn), but it holds "
            f"{type(odd[0]).__name__} {reprlib.repr(odd[0])}: write each turn as the text the "
            "model would produce"
        )
    return turns


class OpenAIPolicy:
    """A policy served by an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Tools are sent with ``tool_choice="none"`` so the server renders them into the prompt
    through the model's chat template but does not parse the reply: the env's own parser
    does, so training and evaluation see the same parsing. With ``vllm_extensions`` (the
    default) the request asks vLLM for prompt/completion token ids and keeps special tokens
    in the text (tool-call tags are often special tokens); turn it off for servers that
    reject unknown fields.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        api_key: sent as a bearer token when given.
        sampling: extra request fields (``temperature``, ``top_p``, ``seed`` ...); a
            ``max_tokens`` here is the default, a turn's own limit (the rollout's
            ``max_tokens_per_turn``) wins. A ``seed`` is a base: in a rollout, episode e's
            turn t is sent ``seed + 1000 * e + t`` (as `VLLMPolicy` samples), so a group's
            episodes differ and a run repeats where the server honours seeds.
        timeout: seconds per request.
        vllm_extensions: ask for token ids (``return_token_ids``) and raw special tokens.
        max_retries: retries of a request that failed in transit or got 429/5xx, with
            exponential backoff; after that the episode becomes ``infra_error``.
        retry_backoff: seconds before the first retry; doubles with each one.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        sampling: dict[str, Any] | None = None,
        timeout: float = 60.0,
        vllm_extensions: bool = True,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
    ) -> None:
        if max_retries < 0 or retry_backoff < 0:
            raise ConfigError(
                f"max_retries and retry_backoff must be >= 0, got {max_retries}, {retry_backoff}"
            )
        check_base_url(base_url)
        self.sampling = dict(sampling or {})
        _check_sampling(self.sampling)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.vllm_extensions = vllm_extensions
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.base_url = base_url.rstrip("/")
        self._http = LoopClient(base_url=self.base_url, headers=headers, timeout=timeout)

    def _request_body(
        self, messages: list[Message], tools: list[dict[str, Any]], max_tokens: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "logprobs": True}
        if tools:
            body |= {"tools": tools, "tool_choice": "none"}
        if self.vllm_extensions:
            body |= {"return_token_ids": True, "skip_special_tokens": False}
        body |= self.sampling
        if max_tokens is not None:  # the caller's per-turn limit, as the token policies take it
            body["max_tokens"] = max_tokens
        return body

    def start_episode(
        self, tools: list[dict[str, Any]], *, task: Any = None, seed: int | None = None
    ) -> PolicyEpisode:
        """A rollout's handle: each turn is a `generate` call with its own seed."""
        return _SeededEpisode(self, tools, task, seed or 0)

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        task: Any = None,
        seed: int | None = None,
    ) -> Completion:
        """One turn; ``seed`` (a rollout's per-turn seed) replaces the sampling's ``seed``."""
        body = self._request_body(messages, tools, max_tokens)
        if seed is not None:
            body["seed"] = seed
        response = await self._post(body)
        if response.status_code == 400 and _CONTEXT_OVERFLOW.search(response.text):
            raise ContextLengthError(
                f"the prompt outgrew the model's context: {response.text[:300]}"
            )
        if response.status_code == 400:  # whose request it was, the episode's turn says
            raise RequestRefused(
                f"{self.base_url}/chat/completions answered 400: {response.text[:500]}"
            )
        if response.status_code != 200:
            raise ModelError(
                f"{self.base_url}/chat/completions answered {response.status_code}: "
                f"{response.text[:500]}"
            )
        return _completion_from_response(response, f"{self.base_url}/chat/completions")

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        """POST with retries on transport errors and 429/5xx; other answers return as they are."""
        import httpx

        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.retry_backoff * 2 ** (attempt - 1))
            try:
                response = await self._http.get().post("/chat/completions", json=body)
            except httpx.TransportError as exc:
                failure = f"request failed: {exc!r}"
                continue
            if response.status_code not in _RETRYABLE:
                return response
            failure = f"answered {response.status_code}: {response.text[:300]}"
        raise ModelError(
            f"{self.base_url}/chat/completions {failure} (after {self.max_retries + 1} attempts)"
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool; the policy stays usable (a new pool opens on demand)."""
        await self._http.aclose()


#: The ``sampling`` knobs `SamplingConfig` also takes: checked as the in-process engines do.
_ENGINE_KNOBS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")


def _check_sampling(sampling: dict[str, Any]) -> None:
    """Refuse a knob value the server would refuse, as `SamplingConfig` refuses it.

    Why: the server answered every request 400, filed as an infrastructure failure (exit 75)
    whose advice, ``--resume``, was refused since the settings differ, and a queued job was
    retried. None is the server's default, as in the request body.
    """
    from .engine._episode import SamplingConfig  # here: agentgym.engine loads httpx

    SamplingConfig(**{k: sampling[k] for k in _ENGINE_KNOBS if sampling.get(k) is not None})


def check_base_url(base_url: str) -> None:
    """Refuse a server root that is not an http(s) URL, before any episode (`check_server_url`)."""
    check_server_url(
        base_url, "base_url (--base-url)", "http://127.0.0.1:8000/v1", "the key goes in --api-key"
    )


def check_server_url(url: str, option: str, example: str, key_hint: str) -> None:
    """Refuse a server URL that is not an http(s) server root alone, before any request.

    ``option`` names where it was given, ``example`` a good one, ``key_hint`` where a key goes.
    Otherwise every request fails, is retried, and each episode is filed as an infrastructure
    failure (a server that is down), which hides the typo.
    """
    check_url_root_alone(url, option, example, key_hint)
    parts = _split(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{option} must be an http(s) URL such as {example}, got {url!r}")


def check_url_root_alone(url: str, option: str, example: str, key_hint: str) -> None:
    """Refuse a URL with a ?query, #fragment or user:password@, without echoing it.

    A path was appended after the query (every request a 404, filed as the server's
    failure); a user:password was sent as basic auth over the key and printed in every error
    line (kept in the run database). Apart from `check_server_url` for `GRPOConfig`, which
    words its other URL refusals itself but must refuse a password before any of them echoes it.
    """
    parts = _split(url)
    if parts is not None and (parts.query or parts.fragment or "@" in url):
        raise ConfigError(
            f"{option} must be the server's root alone, such as {example}: no ?query, "
            f"#fragment or user:password@ ({key_hint})"
        )


def _split(url: Any) -> urllib.parse.SplitResult | None:
    """``url``'s parts; None for what is no URL (not text, or an unclosed ``[`` IPv6 host).

    Why None over ValueError: a job config's ``http://[::1`` reached the job API as a 500.
    """
    try:
        return urllib.parse.urlsplit(url) if isinstance(url, str) else None
    except ValueError:
        return None


def _completion_from_response(response: httpx.Response, url: str) -> Completion:
    """The turn in a 200 answer from ``url``; `ModelError` when the body is not a chat completion.

    Why: such a 200 (a proxy's HTML page, JSON cut short, ``message: null``, a logprobs entry
    without ``logprob``) is the server's failure, as a 502 is, so the episode must end
    ``infra_error`` (replayed by ``--resume``); it escaped as a JSONDecodeError, AttributeError
    or KeyError and was filed as the episode's ``error``, scored as the model's.
    """
    try:
        data = response.json()
    except ValueError:  # JSONDecodeError, or bytes that are not text
        raise ModelError(f"{url} answered 200 with no JSON: {response.text[:200]!r}") from None
    fault = _completion_fault(data)
    if fault:
        raise ModelError(f"{url} answered 200 {fault}: {str(data)[:300]}")
    choice = data["choices"][0]
    message = choice["message"]
    entries = (choice.get("logprobs") or {}).get("content") or []
    ids = choice.get("token_ids")
    return Completion(
        text=message.get("content") or "",
        message=message if message.get("tool_calls") else None,
        prompt_ids=data.get("prompt_token_ids"),
        completion_ids=ids,
        logprobs=[e["logprob"] for e in entries] or None,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=_usage_count(data) if ids is None else None,
    )


def _usage_count(data: dict[str, Any]) -> int | None:
    """The answer's ``usage.completion_tokens``: how many tokens a server without ids sampled.

    Why: without it an eval against such a server (most are) reported no token figures at
    all. A count that is no int >= 0 is left out, not refused: the turn itself is sound.
    """
    usage = data.get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    is_count = isinstance(count, int) and not isinstance(count, bool) and count >= 0
    return count if is_count else None


def _completion_fault(data: Any) -> str:
    """What keeps ``data`` from being a chat completion `Completion` can hold; "" if nothing."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "without choices[0]"
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return "without choices[0].message"
    if not isinstance(message.get("content"), str | None):
        return "with a choices[0].message.content that is not text"
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and _all(calls, dict)):
        return "with choices[0].message.tool_calls that is not a list of objects"
    logprobs = choice.get("logprobs") or {}
    entries = (logprobs.get("content") or []) if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and _is_number(e.get("logprob")) for e in entries
    ):
        return "with choices[0].logprobs not {content: [{logprob: number}, ...]}"
    ids = choice.get("token_ids")
    for name, value in (("prompt_token_ids", data.get("prompt_token_ids")),
                        ("choices[0].token_ids", ids)):  # fmt: skip
        if value is not None and not (isinstance(value, list) and _all(value, int)):
            return f"with {name} that is not a list of ints"
    if ids is not None and entries and len(ids) != len(entries):
        return f"with {len(ids)} token ids and {len(entries)} logprobs"
    if not isinstance(choice.get("finish_reason"), str | None):
        return "with a choices[0].finish_reason that is not text"
    return ""


def _all(values: list[Any], kind: type) -> bool:
    """Every value is a ``kind``, a bool not counted as an int (JSON's true is no token id)."""
    return all(isinstance(v, kind) and not isinstance(v, bool) for v in values)


def _is_number(value: Any) -> bool:
    """An int or a float, not a bool (JSON's true is no logprob)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
