"""What every token-in/token-out policy shares: the rollout-mode decision and episode handles.

A backend (vLLM in-process, transformers) only has to sample one turn from exact prompt ids
(`TokenPolicy.generate_ids`); this module turns that into the `Policy` contract, with one
`TokenEpisode` per episode that keeps the ids of every turn so the next prompt extends them.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Self

from .._errors import ConfigError, ContextLengthError, ConversationError
from .._seeds import turn_seed
from .._types import Completion, Message
from ._model_dir import read_adapter_config
from ._render import ChatRenderer, ModeDecision, RolloutMode, TemplateError

log = logging.getLogger(__name__)
ModeChoice = Literal["auto", "concat", "per_turn"]


@dataclass(frozen=True)
class AdapterVersion:
    """One loaded LoRA adapter: the version number turns record, and its load time."""

    version: int
    name: str
    path: str
    load_seconds: float


def next_adapter_version(path: str | os.PathLike[str], last: int, version: int | None) -> int:
    """The version an adapter load gets (default ``last + 1``), after checking the request.

    Raises `ConfigError` when ``path`` is not a whole PEFT adapter folder or ``version`` is not
    above ``last``: an engine that reuses a number would skip reloading it and serve stale
    weights under the new version's name.
    """
    read_adapter_config(path)  # a whole PEFT adapter folder
    return version_after(last, version)


def version_after(last: int, version: int | None) -> int:
    """``version`` (default ``last + 1``), refused unless above ``last`` (see above)."""
    version = last + 1 if version is None else version
    if version <= last:
        raise ConfigError(
            f"adapter version {version} is not above the last one loaded ({last}); "
            "every version needs a fresh number"
        )
    return version


@dataclass
class SamplingConfig:
    """How turns are sampled; the same knobs as vLLM's `SamplingParams`.

    Attributes:
        temperature: softmax temperature; logprobs are reported after it (and after top_p,
            top_k, min_p), i.e. of the distribution actually sampled.
        top_p: nucleus mass; 1.0 keeps every token (right for importance sampling).
        top_k: keep the k most likely tokens; 0 or -1 disables.
        min_p: drop tokens below ``min_p`` times the top probability; 0 disables.
        max_tokens: new tokens per turn (a turn is cut with finish reason ``length``).
        stop: strings ending a turn; they stay in the text (e.g. ``["</tool_call>"]``; one
            string is taken as a list of it).
        extra: more fields of vLLM's ``SamplingParams`` (``allowed_token_ids``, ``logit_bias``
            ...); backends other than vLLM refuse them.
        seed: when set, episode e's turn t samples with seed ``seed + 1000 * e + t`` (mod
            2**63): runs repeat exactly whatever else the engine is batching. None draws fresh
            randomness.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p"):
            if not _is_number(getattr(self, name)):
                raise ConfigError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not 0 <= self.temperature < math.inf or not 0 < self.top_p <= 1 or not (
            0 <= self.min_p <= 1
        ):  # NaN fails every comparison: refused here, not sampled with
            raise ConfigError(
                f"sampling needs a finite temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1; got "
                f"temperature={self.temperature}, top_p={self.top_p}, min_p={self.min_p}"
            )
        if not _is_int(self.top_k) or self.top_k < -1:  # -5 was silently "no top-k"
            raise ConfigError(
                f"top_k must be an int >= 1, or 0 / -1 for no top-k; got {self.top_k!r}"
            )
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"seed must be an int or None, got {self.seed!r}")
        self.stop = _stop_strings(self.stop)
        if not isinstance(self.extra, Mapping):
            raise ConfigError(
                f"extra must be a dict of vLLM SamplingParams fields, got {self.extra!r}"
            )
        owned = sorted(set(self.extra) & _ENGINE_OWNED)
        if owned:
            raise ConfigError(
                f"extra sets {', '.join(map(repr, owned))}, which the engine sets itself; "
                "give SamplingConfig's own fields (temperature, top_p, top_k, min_p, "
                "max_tokens, stop, seed) instead, and leave the others to the engine"
            )

    def extra_for(self, max_tokens: int) -> dict[str, Any]:
        """``extra`` for a turn of at most ``max_tokens``: a ``min_tokens`` above it is cut.

        Why: a turn cut to what the episode's budget or the context has left asked for more
        ``min_tokens`` than it may sample, which vLLM refuses: the episode ended ``error``.
        """
        if self.extra.get("min_tokens", 0) <= max_tokens:
            return self.extra
        return {**self.extra, "min_tokens": max_tokens}

    @classmethod
    def from_dict(cls, knobs: Mapping[str, Any]) -> SamplingConfig:
        """From a dict of fields; an unknown key is one `ConfigError` naming the close one."""
        if not isinstance(knobs, Mapping):
            raise ConfigError(
                f"sampling must be a SamplingConfig or a dict of its fields "
                f"{[f.name for f in fields(cls)]}, got {knobs!r}"
            )
        _refuse_unknown_knobs(knobs)
        return cls(**knobs)


def _refuse_unknown_knobs(knobs: Mapping[str, Any]) -> None:
    """One `ConfigError` for the first key that is not a `SamplingConfig` field."""
    known = [f.name for f in fields(SamplingConfig)]
    for key in knobs:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {known}"
            raise ConfigError(f"unknown sampling knob {key!r}{hint}")


class TokenPolicy:
    """Base of policies that sample from token ids; subclasses implement `generate_ids`.

    Args:
        sampling: a `SamplingConfig` or a dict of its fields.
        rollout_mode: ``"auto"`` decides per tool set from the chat template (see
            `ChatRenderer`); ``"concat"`` refuses a template that cannot do it; ``"per_turn"``
            always renders fresh prompts.
    """

    def __init__(
        self,
        sampling: SamplingConfig | dict[str, Any] | None = None,
        rollout_mode: ModeChoice = "auto",
    ) -> None:
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            sampling = SamplingConfig.from_dict(sampling)  # a dict, or one clear error
        self.sampling = sampling or SamplingConfig()
        self._check_sampling(self.sampling)
        if rollout_mode not in ("auto", "concat", "per_turn"):
            raise ConfigError(
                f"rollout_mode must be 'auto', 'concat' or 'per_turn', got {rollout_mode!r}"
            )
        self.rollout_mode = rollout_mode
        #: Context window in tokens; subclasses set it from their engine's.
        self.max_model_len = 4096
        self._modes: dict[str, ModeDecision] = {}

    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer."""
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.renderer.tokenizer

    # ---- lifecycle: ``with policy:`` starts it and closes it ------------------------------
    def start(self) -> None:
        """Make the policy ready now, not on first use; nothing to do by default.

        An in-process engine starts here; a server policy checks its servers.
        """

    def close(self) -> None:
        """Release what `start` took; nothing by default."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        """Sample one turn that continues ``prompt_ids`` exactly (``sampling``: this call's).

        ``session`` names the episode, so a backend of several servers can keep its turns on
        one (its prefix cache); a single engine ignores it.
        """
        raise NotImplementedError

    async def end_session(self, session: str) -> None:
        """The episode ``session`` ended (a router forgets it); nothing to do for one engine."""

    def turn_limit(
        self, prompt_ids: Sequence[int], max_tokens: int | None, sampling: SamplingConfig
    ) -> int:
        """New tokens this turn may take: the asked limit, cut to what the context has left.

        Raises `ContextLengthError` when the prompt alone fills the context: the rollout ends
        the episode as ``truncated`` and scores it.
        """
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len}"
                " (raise max_model_len, up to the model's positions, for longer episodes)"
            )
        limit = sampling.max_tokens if max_tokens is None else max_tokens  # 0 is no "not given"
        if limit < 1:  # an env's budget spent: the episode ends truncated, as on a full context
            raise ContextLengthError(f"the episode's token budget is spent (turn limit {limit})")
        return min(limit, room)

    def with_sampling(self, **changes: Any) -> TokenPolicy:
        """The same model and engine with other sampling knobs (e.g. greedy evaluation).

        Nothing is copied or restarted: the view forwards every turn to this policy.
        Raises `ConfigError` for an unknown knob or a value the backend cannot sample with.
        """
        _refuse_unknown_knobs(changes)  # not replace()'s TypeError
        sampling = replace(self.sampling, **changes)
        self._check_sampling(sampling)
        return _SamplingView(self, sampling)

    def _check_sampling(self, sampling: SamplingConfig) -> None:
        """Refuse knobs this backend would ignore (`ConfigError`); every knob works here."""

    def mode_for(
        self, tools: list[dict[str, Any]], example: Sequence[Message] = ()
    ) -> ModeDecision:
        """The rollout mode episodes with these tools get, and why (decided once, cached).

        ``example`` is a conversation with several tool turns as the env produces them (an
        env's reference episode); without one, a generic two-call conversation is used.
        """
        key = repr(tools)
        if key not in self._modes:
            self._check_opening_fits(tools, example)
            decision = choose_mode(self.renderer, self.rollout_mode, tools, example)
            log.info("rollout mode %s: %s", decision.mode, decision.reason)
            self._modes[key] = decision
        return self._modes[key]

    def _check_opening_fits(self, tools: list[dict[str, Any]], example: Sequence[Message]) -> None:
        """Refuse an env whose opening prompt alone fills the context.

        Why: each episode would end as ``truncated`` before its first turn, with no turn and
        no hint in the summary (a dozen tool schemas outgrow 4,096 tokens).
        """
        if problem := opening_prompt_problem(self.renderer, example, tools, self.max_model_len):
            raise ConfigError(f"{problem}; raise max_model_len (--max-model-len) to what the "
                              "model allows")  # fmt: skip

    def start_episode(
        self, tools: list[dict[str, Any]], *, task: Any = None, seed: int | None = None
    ) -> TokenEpisode:
        """A handle that keeps one episode's exact token ids across its turns."""
        return TokenEpisode(self, tools, self.mode_for(tools).mode, seed)

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        task: Any = None,
    ) -> Completion:
        """One turn on a fresh render of ``messages`` (no episode state: not token-exact)."""
        prompt = self.renderer.prompt_ids(messages, tools)
        return await self.generate_ids(prompt, max_tokens=max_tokens)


def choose_mode(
    renderer: ChatRenderer,
    rollout_mode: ModeChoice,
    tools: list[dict[str, Any]],
    example: Sequence[Message] = (),
) -> ModeDecision:
    """The mode a ``rollout_mode`` choice gives this template and these tools, and why.

    One function for the engine (`TokenPolicy.mode_for`) and a dry run, so the plan a user
    reads before a run says what the run will do. ``example`` as in `TokenPolicy.mode_for`.

    Raises:
        ConfigError: ``rollout_mode="concat"`` with a template that cannot keep history.
    """
    if rollout_mode == "per_turn":
        return ModeDecision("per_turn", "rollout_mode='per_turn' was asked for")
    decision = renderer.decide_mode(example or probe_conversation(tools), tools)
    if rollout_mode == "concat" and decision.mode != "concat":
        raise ConfigError(
            "rollout_mode='concat' but the chat template cannot do it: "
            f"{decision.reason}; use rollout_mode='auto' or 'per_turn'"
        )
    return decision


class TokenEpisode:
    """One episode's token state: the exact ids of every turn so far.

    ``mode`` starts as the template's mode; an episode whose messages the template cannot
    render as a delta (a message shape the mode check did not see) switches to ``per_turn``
    from that turn on and says why in ``mode_reason``: it never trains on tokens the model
    did not see.
    """

    def __init__(
        self, policy: TokenPolicy, tools: list[dict[str, Any]], mode: RolloutMode, seed: int | None
    ) -> None:
        self.policy = policy
        self.tools = tools
        self.mode: RolloutMode = mode
        self.mode_reason = ""
        self._episode_seed = seed or 0
        self._turn = 0
        self._ids: list[int] = []
        self._last_ids: list[int] = []
        self._seen = 0
        self.session = uuid.uuid4().hex

    @property
    def max_tokens(self) -> int:
        """The turn limit its policy samples with when the caller asks for none."""
        return self.policy.sampling.max_tokens

    async def generate(
        self, messages: list[Message], *, max_tokens: int | None = None
    ) -> Completion:
        """The next turn; ``messages`` is the whole conversation so far, as the env has it.

        Raises `ConversationError` when the chat template refuses the conversation after the
        model's turns (it rendered the first prompt): what the model wrote is to blame, so the
        episode is truncated and scored, not an error of the env.
        """
        try:
            prompt = self._next_prompt(messages)
        except TemplateError as exc:
            if self._turn == 0:
                raise
            raise ConversationError(
                f"the chat template refused the conversation after the model's turns: {exc}"
            ) from exc
        seed = turn_seed(self.policy.sampling.seed, self._episode_seed, self._turn)
        completion = await self.policy.generate_ids(
            prompt, max_tokens=max_tokens, seed=seed, sampling=self.policy.sampling,
            session=self.session,
        )  # fmt: skip
        self._turn += 1
        self._last_ids = list(completion.completion_ids or [])
        self._ids = prompt + self._last_ids
        self._seen = len(messages)
        return completion

    async def aclose(self) -> None:
        """The episode is over: the policy may forget it (the rollout calls this, always)."""
        await self.policy.end_session(self.session)

    def _next_prompt(self, messages: list[Message]) -> list[int]:
        renderer = self.policy.renderer
        if self._turn == 0 or self.mode == "per_turn":
            return renderer.prompt_ids(messages, self.tools)
        if len(messages) <= self._seen or messages[self._seen].get("role") != "assistant":
            # a delta renders what follows the sampled turn's assistant message: without that
            # message where the step starts, it would drop the env's new messages
            return self._per_turn(
                messages, "the env's step did not start with the sampled turn's assistant message"
            )
        history, new = messages[: self._seen + 1], messages[self._seen + 1 :]
        delta = renderer.delta_ids(history, new, self.tools, self._last_ids)
        if delta is None:
            return self._per_turn(messages, "the template rewrote the previous turn")
        return self._ids + delta

    def _per_turn(self, messages: list[Message], why: str) -> list[int]:
        """Switch the episode to ``per_turn`` from this turn on; this turn's fresh prompt."""
        self.mode = "per_turn"
        self.mode_reason = f"turn {self._turn + 1}: {why}"
        return self.policy.renderer.prompt_ids(messages, self.tools)


class _SamplingView(TokenPolicy):
    """A policy that samples through another one with its own `SamplingConfig`."""

    def __init__(self, parent: TokenPolicy, sampling: SamplingConfig) -> None:
        self._parent = parent  # before __init__ checks the sampling with it
        super().__init__(sampling, parent.rollout_mode)
        self.max_model_len = parent.max_model_len
        self._modes = parent._modes

    @property
    def renderer(self) -> ChatRenderer:
        return self._parent.renderer

    @property
    def max_num_seqs(self) -> int | None:
        """The parent engine's batch, if it has one: `arollout` sizes its concurrency by it.

        Without it a greedy eval through a view of a `VLLMPolicy` ran 256 episodes at once
        (the default) where the policy itself ran twice its batch (512 on the CPU build),
        and a view of a closed policy played every episode to an error instead of refusing.
        """
        return getattr(self._parent, "max_num_seqs", None)

    def _check_sampling(self, sampling: SamplingConfig) -> None:
        self._parent._check_sampling(sampling)  # a view of a view: the backend's refusals

    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        return await self._parent.generate_ids(
            prompt_ids, max_tokens=max_tokens, seed=seed, sampling=sampling or self.sampling,
            session=session,
        )  # fmt: skip

    async def end_session(self, session: str) -> None:
        await self._parent.end_session(session)

    async def aclose(self) -> None:
        """Close the parent's connection pools, if it has any (they reopen on demand)."""
        close = getattr(self._parent, "aclose", None)
        if close is not None:
            await close()


#: Sampling fields a policy sets from `SamplingConfig` or for itself: not for ``extra``. Given
#: there, vLLM got the field twice (a TypeError in every turn) or the engine lost what it
#: relies on (the sampled token's logprob, one completion per request, the stop string).
_ENGINE_OWNED = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "n",
     "logprobs", "output_kind", "detokenize", "include_stop_str_in_output",
     "skip_special_tokens", "spaces_between_special_tokens", "model", "prompt",
     "cache_salt", "return_token_ids"}
)  # fmt: skip


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stop_strings(stop: Any) -> list[str]:
    """``stop`` as a list of strings: one string is one stop string, not its characters.

    Why: ``stop="</tool_call>"`` went through ``list(stop)`` into the engine as eleven
    one-character stop strings, and every turn ended at its first ``<``.
    """
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ConfigError(
            f"stop must be a list of non-empty strings (e.g. ['</tool_call>']), got {stop!r}"
        )
    return list(stop)


def probe_conversation(tools: list[dict[str, Any]]) -> list[Message]:
    """A generic conversation: two tool turns (text before the second call) and an answer."""
    name = tools[0]["function"]["name"] if tools else "lookup"

    def call(i: int) -> dict[str, Any]:
        arguments = {"query": f"q{i}"}
        function = {"name": name, "arguments": arguments}
        return {"id": f"call{i}", "type": "function", "function": function}

    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": "", "tool_calls": [call(1)]},
        {"role": "tool", "tool_call_id": "call1", "name": name, "content": "first"},
        {"role": "assistant", "content": "Checking again.", "tool_calls": [call(2)]},
        {"role": "tool", "tool_call_id": "call2", "name": name, "content": "second"},
        {"role": "assistant", "content": "The answer is 42."},
    ]


def opening_prompt_problem(
    renderer: ChatRenderer,
    conversation: Sequence[Message],
    tools: list[dict[str, Any]],
    max_model_len: int,
) -> str:
    """Why every episode would end before its first turn ("" when the opening prompt fits).

    The opening prompt is ``conversation`` up to its first assistant turn. One rule for the
    engine (when it starts), `agentgym eval` and `agentgym train`'s pre-flight (on the
    tokenizer, before any model loads), each naming its own fix.
    """
    opening = list(itertools.takewhile(lambda m: m.get("role") != "assistant", conversation))
    if not opening:
        return ""
    length = len(renderer.prompt_ids(opening, tools or None))
    if length < max_model_len:
        return ""
    return (f"the env's opening prompt is {length} tokens, and max_model_len is "
            f"{max_model_len}: every episode would end before its first turn")  # fmt: skip
