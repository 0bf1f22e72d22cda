"""Token-in/token-out prompts: turn k+1's prompt is turn k's prompt + its sampled ids + a delta.

Why: re-rendering the whole conversation with the chat template every turn changes tokens
the model already produced (whitespace around tool calls, re-serialised JSON, dropped
reasoning), so a trainer would learn from tokens the model never saw. Instead, only the env's
new messages (tool results, user turns) are rendered, as the *difference* between two template
renders, and appended to the exact ids of the previous turns.

Modes, decided once per (tokenizer, tools) before any episode runs (`ChatRenderer.mode`):

- ``concat``: appending deltas gives exactly the tokens a fresh render of the conversation
  gives, so one episode trains as one sequence (`Trajectory.flatten`).
- ``per_turn``: the template rewrites history (drops reasoning, moves the system prompt,
  changes earlier turns) so deltas cannot be rendered consistently, or writes a turn without
  the reasoning the model sampled (DeepSeek-R1-Distill's, even for the last turn); every
  turn's prompt is a fresh render and each turn is its own training sample. ``reason`` says
  what differed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import ConfigError
from ._model_dir import generation_eos_ids

Message = dict[str, Any]
RolloutMode = Literal["concat", "per_turn"]

#: An assistant text no template rewrites; used to find where an assistant turn's content ends.
_SENTINEL = "\u2063agentgym-turn-end\u2063"
#: A tool to render with when a template cannot render without tools.
_PLACEHOLDER_TOOL = {
    "type": "function",
    "function": {
        "name": "noop",
        "description": "Does nothing.",
        "parameters": {"type": "object", "properties": {}},
    },
}


#: Where a thinking model's reasoning ends (it opens with ``<think>``, in the turn or the prompt).
_THINK_CLOSE = "</think>"
#: A turn of a thinking model, to see whether the template keeps its reasoning.
_REASONING_PROBE = {
    "role": "assistant",
    "content": "<think>\nI weigh both options first.\n</think>\n\nDone.",
}


#: A call of the placeholder tool, with an id of Mistral's shape (9 letters and digits), which
#: every template accepts.
_PLACEHOLDER_CALL = {"id": "a1b2c3d4e", "type": "function",
                     "function": {"name": "noop", "arguments": {}}}  # fmt: skip
#: What the env sends in each role a template may refuse (`ChatRenderer._refused_role`).
_ROLE_USES = {"system": "its system prompt", "tool": "tool results"}


@dataclass(frozen=True)
class ModeDecision:
    """Which rollout mode a template gets, and why (shown by `agentgym check` and logged)."""

    mode: RolloutMode
    reason: str


class TemplateError(ConfigError):
    """The chat template cannot render what the engine needs (no template, no tool support)."""


#: Plain text every LLM tokenizer writes back as it was.
_VOCABULARY_PROBE = "The answer is 42, said Ada."
#: Where a tokenizer's vocabulary lives, for the error that says it is missing.
TOKENIZER_FILES = "tokenizer.json, or vocab.json + merges.txt, or tokenizer.model"


def require_vocabulary(tokenizer: Any) -> None:
    """Refuse a tokenizer that cannot write plain text back.

    Why: a folder with only ``tokenizer_config.json`` (the vocabulary files left behind)
    loads without complaint, then encodes every text to nothing or to unknown tokens; every
    template check would then pass on empty ids, and a rollout would sample from empty prompts.
    """
    ids = tokenizer.encode(_VOCABULARY_PROBE, add_special_tokens=False)
    back = tokenizer.decode(ids, skip_special_tokens=True)
    if back.strip() != _VOCABULARY_PROBE:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"the tokenizer {name!r} cannot write text ({_VOCABULARY_PROBE!r} comes back as "
            f"{back!r}): its vocabulary is missing; use the model's full tokenizer files "
            f"({TOKENIZER_FILES}), not tokenizer_config.json alone"
        )


def template_messages(
    messages: Sequence[Message], as_text: bool = False, calls_without_content: bool = False
) -> list[Message]:
    """Messages as a chat template expects them: tool-call arguments as dicts or JSON text.

    Most HF templates want dicts; some concatenate the arguments as text (``as_text``, e.g.
    DeepSeek V3's), written as the parsers render them (non-ASCII kept as is), so a render
    of history is the text the env's parser writes. ``calls_without_content``: a turn of calls
    alone gets content None, not "" (the OpenAI form; some templates write calls only then).
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [{**c, "function": _function(c["function"], as_text)} for c in calls]
            message = {**message, "tool_calls": calls}
            if calls_without_content and message.get("content") == "":
                message["content"] = None
        out.append(message)
    return out


def _function(function: dict[str, Any], as_text: bool) -> dict[str, Any]:
    arguments = function.get("arguments", {})
    if as_text:
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
    elif isinstance(arguments, str) and arguments:
        arguments = json.loads(arguments)
    return {**function, "arguments": arguments}


class ChatRenderer:
    """Builds prompt token ids for a tokenizer's chat template, by delta where possible.

    Args:
        tokenizer: a `transformers` tokenizer with a chat template.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``),
            passed to every render.
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat template; pick an instruct/chat model or set "
                "tokenizer.chat_template before rolling out"
            )
        require_vocabulary(tokenizer)
        self.tokenizer = tokenizer
        self.template_kwargs = dict(chat_template_kwargs or {})
        self._arguments_as_text = False
        self._calls_without_content = False
        self.stop_token_ids = _stop_token_ids(tokenizer)
        #: Each stop token's text, as it appears in a render (what SFT trains a turn through).
        self.stop_texts = tuple(
            text for text in (tokenizer.decode([i]) for i in sorted(self.stop_token_ids)) if text
        )
        self._turn_end = self._find_turn_end()
        #: The part of the turn end a model samples: its first stop token, if it opens it.
        self._sampled_stop = next(
            (text for text in self.stop_texts if self._turn_end.startswith(text)), ""
        )
        self._refuse_unending_turns()
        self._calls_without_content = self._writes_calls_only_without_content()

    # ---- rendering ---------------------------------------------------------------------
    def render_text(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, generation: bool
    ) -> str:
        """The template's text for ``messages`` (with the assistant header if ``generation``).

        Tool-call arguments go in as dicts; a template that fails on dicts but renders JSON
        text is given JSON text from then on.
        """
        try:
            return self._render(messages, tools, generation, self._arguments_as_text)
        except Exception as exc:  # jinja raises anything: report it as the template's fault
            if not self._arguments_as_text and any(m.get("tool_calls") for m in messages):
                try:
                    text = self._render(messages, tools, generation, as_text=True)
                except Exception:
                    pass
                else:
                    self._arguments_as_text = True
                    return text
            fix = "check the template and chat_template_kwargs"
            if refused := self._refused_role(messages):
                fix = (f"it refuses {refused!r} messages, which the env sends "
                       f"({_ROLE_USES[refused]}): use a chat template that takes them (one made "
                       "for tool use)")  # fmt: skip
            raise TemplateError(
                f"the chat template failed to render {len(messages)} messages "
                f"({type(exc).__name__}: {exc}); {fix}"
            ) from exc

    def _refused_role(self, messages: Sequence[Message]) -> str:
        """A role of ``messages`` the template refuses outright ("" when none is to blame).

        Why: Gemma 2's template raises on a system message, Gemma 3's on a ``tool`` one, and the
        error sent users to their chat_template_kwargs. A role is blamed only where a short
        conversation renders without it and fails with it.
        """
        call = _PLACEHOLDER_CALL
        user: Message = {"role": "user", "content": "u"}
        called: list[Message] = [user, {"role": "assistant", "content": "", "tool_calls": [call]}]
        result = {"role": "tool", "tool_call_id": call["id"], "name": "noop", "content": "r"}
        probes: dict[str, tuple[list[Message], list[Message]]] = {
            "system": ([user], [{"role": "system", "content": "s"}, user]),
            "tool": (called, [*called, result]),
        }
        sent = {m.get("role") for m in messages}
        for role, (without, with_it) in probes.items():
            if role in sent and self._renders(without) and not self._renders(with_it):
                return role
        return ""

    def _renders(self, messages: list[Message]) -> bool:
        try:
            self._render(messages, [_PLACEHOLDER_TOOL], True, self._arguments_as_text)
        except Exception:  # jinja raises anything
            return False
        return True

    def _render(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        generation: bool,
        as_text: bool,
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            template_messages(messages, as_text, self._calls_without_content),
            tools=tools or None,
            add_generation_prompt=generation,
            tokenize=False,
            **self.template_kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special tokens in the text are parsed, none added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """A fresh render of the conversation with the generation prompt (turn 1, per_turn)."""
        return self.encode(self.render_text(messages, tools, generation=True))

    def delta_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        completion_ids: Sequence[int],
    ) -> list[int] | None:
        """Tokens that follow a sampled turn so the conversation continues as the template says.

        ``history`` ends with the assistant message of the sampled turn (as the env parsed it),
        ``new_messages`` are what the env appended after it. The delta starts with whatever
        closes the assistant turn that was not sampled (the end-of-turn token after a length
        cut, a stop string or another EOS; the newline after ``<|im_end|>``) and ends with the next
        assistant header. None when the template rewrites that turn once more messages
        follow it, or writes it without the reasoning it holds (`drops_reasoning`): the caller
        falls back to a fresh render (``per_turn``).
        """
        if self.drops_reasoning(history, tools):
            return None  # the ids hold reasoning no render of this conversation shows
        before = self.render_text(history, tools, generation=False)
        after = self.render_text([*history, *new_messages], tools, generation=True)
        if not after.startswith(before) or not before.endswith(self._turn_end):
            return None
        closing = self._turn_end
        if completion_ids and completion_ids[-1] in self.stop_token_ids:
            sampled_end = self.tokenizer.decode([completion_ids[-1]])
            if closing.startswith(sampled_end):
                closing = closing[len(sampled_end) :]
            # else another EOS ended the turn (Qwen2.5's <|endoftext|>, from the model's
            # generation_config): it stays as sampled and the template's turn end follows whole
        return self.encode(closing + after[len(before) :])

    def visible_text(self, text: str, completion_ids: Sequence[int]) -> str:
        """The turn's text as the env should read it: without the sampled end-of-turn token.

        Decoding keeps special tokens (tool-call tags often are special), so a turn that
        stopped on EOS would otherwise end in e.g. ``<|im_end|>``.
        """
        if completion_ids and completion_ids[-1] in self.stop_token_ids:
            stop = self.tokenizer.decode([completion_ids[-1]])
            if text.endswith(stop):
                return text[: len(text) - len(stop)]
        return text

    # ---- the mode decision ---------------------------------------------------------------
    def decide_mode(
        self, conversation: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> ModeDecision:
        """``concat`` when deltas rebuild a fresh render of ``conversation`` token for token.

        ``conversation`` should hold several tool turns (assistant text before a call
        included) as the env produces them; each assistant turn is taken as sampled exactly
        as the template renders it, which is the best case for the template. Exactly the
        engine's delta path is exercised. Reasoning is the exception: a template that writes a
        turn without the ``<think>`` block its message holds, even as the last message, shows
        every later prompt reasoning a fresh render never has, so it gets ``per_turn``; and so
        does one that would do that to a thinking model's turn when ``conversation`` has none
        (the reference of a model that thinks may not, e.g. `agentgym check`'s generic one).
        """
        ends = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
        if not ends:
            return ModeDecision("concat", "no assistant turn to check")
        ids = self.prompt_ids(conversation[: ends[0]], tools)
        for k, end in enumerate(ends):
            sampled = self.sampled_turn_ids(conversation[: end + 1], tools)
            if sampled is None:
                return ModeDecision(
                    "per_turn",
                    f"the prompt of assistant turn {k + 1} changes once the turn is added (the "
                    "template renders a message differently when it is the last one)",
                )
            if self.drops_reasoning(conversation[: end + 1], tools):
                return ModeDecision("per_turn", _dropped_reasoning(f"assistant turn {k + 1}"))
            ids += sampled
            following = ends[k + 1] if k + 1 < len(ends) else len(conversation)
            if following == end + 1:
                break
            delta = self.delta_ids(
                conversation[: end + 1], conversation[end + 1 : following], tools, sampled
            )
            if delta is None:
                return ModeDecision(
                    "per_turn",
                    f"the template rewrites assistant turn {k + 1} once messages follow it",
                )
            ids += delta
        if conversation[-1].get("role") == "assistant":  # the unsampled rest of its turn end
            ids += self.encode(self._turn_end[len(self._sampled_stop) :])
            fresh = self.encode(self.render_text(conversation, tools, generation=False))
        else:
            fresh = self.prompt_ids(conversation, tools)
        if fresh != ids:
            at = first_difference(fresh, ids)
            return ModeDecision(
                "per_turn",
                f"history is rewritten: at token {at} a fresh render has "
                f"{self.tokenizer.decode(fresh[at : at + 12])!r} where the turns as sampled "
                f"have {self.tokenizer.decode(ids[at : at + 12])!r}",
            )
        if self._drops_thinking_turns(conversation[: ends[0]], tools):
            return ModeDecision("per_turn", _dropped_reasoning("a thinking model's turn"))
        return ModeDecision("concat", f"{len(ends)} turns rebuild the conversation exactly")

    def drops_reasoning(
        self, upto_assistant: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> bool:
        """Whether the template writes the last (assistant) message without its reasoning.

        Why: DeepSeek-R1-Distill's template strips ``<think>`` from every assistant turn, the
        last one included. Its renders then extend each other and deltas look consistent, but
        the sampled ids hold the reasoning: later prompts showed the model reasoning that a
        fresh render (what it meets when served) never has, and ``flatten()`` was no prefix of
        that render. Only reasoning counts: other text the template writes differently (JSON
        re-spaced, text before a call dropped) is what ``concat`` keeps as sampled.
        """
        reasoning = _reasoning(upto_assistant[-1].get("content"))
        return bool(reasoning) and reasoning not in self.written_turn_text(upto_assistant, tools)

    def _drops_thinking_turns(
        self, opening: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> bool:
        """Whether a turn a thinking model samples after ``opening`` would lose its reasoning.

        Why: a reference without reasoning (a generic conversation, a model that did not think
        there) cannot show it, and the template alone says the model thinks. A generation
        prompt that closes the block itself (DeepSeek V3.1 or Qwen3 with thinking off) gets
        turns without reasoning: nothing to drop, no ``per_turn`` for it. A template that
        refuses the probe turn is not judged by it: the conversation it rendered decided.
        """
        if self.render_text(opening, tools, generation=True).rstrip().endswith(_THINK_CLOSE):
            return False
        try:
            return self.drops_reasoning([*opening, _REASONING_PROBE], tools)
        except TemplateError:
            return False

    def sampled_turn_ids(
        self, upto_assistant: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> list[int] | None:
        """The last (assistant) turn's ids as a model would sample them: rendered text + stop.

        None when the template renders the finished turn as something other than a
        continuation of its generation prompt: what the model should write is then unknown.
        """
        prompt = self.render_text(upto_assistant[:-1], tools, generation=True)
        full = self.render_text(upto_assistant, tools, generation=False)
        if not full.startswith(prompt) or not full.endswith(self._turn_end):
            return None
        body = full[len(prompt) : len(full) - len(self._turn_end)]
        return self.encode(body + self._sampled_stop)

    def written_turn_text(
        self, upto_assistant: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> str:
        """The last (assistant) message as the template writes it, without its turn end.

        It starts where the model starts sampling it: where its generation prompt ends, or,
        where the template rewrites that prompt once the turn is added (Mistral v0.3 shows the
        system prompt only while a user message is last; a prompt may open an empty think
        block the finished turn lacks), where a render with a sentinel as the content first
        differs from it. So a template that is no prefix still says what the model should
        write after the prompt the engine gives it (``per_turn`` SFT samples, the check's round
        trip).
        """
        full = self.render_text(upto_assistant, tools, generation=False)
        probe = [*upto_assistant[:-1], {"role": "assistant", "content": _SENTINEL}]
        marked = self.render_text(probe, tools, generation=False)
        at = marked.find(_SENTINEL)
        prompt = self.render_text(upto_assistant[:-1], tools, generation=True)
        if full.startswith(prompt):
            start = len(prompt)
        else:
            start = at if at >= 0 else 0
            diverge = (i for i, (x, y) in enumerate(zip(full[:start], marked[:start])) if x != y)
            start = next(diverge, start)
        turn_end = marked[at + len(_SENTINEL) :] if at >= 0 else ""
        body = full[start:]
        return body[: len(body) - len(turn_end)] if turn_end and body.endswith(turn_end) else body

    def written_turn_ids(
        self, upto_assistant: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """`written_turn_text`'s ids with the stop token a model samples to end the turn."""
        text = self.written_turn_text(upto_assistant, tools)
        return self.encode(text + self._sampled_stop)

    def _refuse_unending_turns(self) -> None:
        """Refuse a template whose turn end holds none of the tokens the model stops on.

        Why: a turn ends where the model samples a stop token (its ``eos_token`` and the ids of
        ``generation_config.json``, as vLLM stops). A base model's tokenizer under a chat
        template (Qwen2.5 base stops on ``<|endoftext|>``, its template ends turns with
        ``<|im_end|>``) sampled every turn to max_tokens, and the warm start refused it with a
        message that named no fix. A template that ends a turn with no text (the next header
        follows) is left alone: the sampled stop token is then the turn's end.
        """
        end = self._turn_end.strip()
        if not end or any(text in self._turn_end for text in self.stop_texts):
            return
        stops = ", ".join(map(repr, self.stop_texts)) or "none"
        raise TemplateError(
            f"the chat template ends an assistant turn with {end!r}, but the model stops only on "
            f"{stops} (eos_token and generation_config.json's eos_token_id), so every turn "
            f"would run to max_tokens; set eos_token to {end!r} in the model's "
            "tokenizer_config.json, or use a template that ends turns with {{ eos_token }}"
        )

    def _writes_calls_only_without_content(self) -> bool:
        """Whether the template drops a turn's calls unless its content is None (not "").

        Why: the env gives a turn of calls alone the content "" (templates that add text to
        it need a string), and DeepSeek-R1-Distill's template writes calls only when the
        content is none: every call vanished from the prompts and the SFT traces, and the
        check blamed the parser. Such a template is given None for those turns.
        """

        def written(content: str | None) -> str:
            turn = {"role": "assistant", "content": content, "tool_calls": [_PLACEHOLDER_CALL]}
            try:
                return self.render_text([{"role": "user", "content": "hi"}, turn],
                                        [_PLACEHOLDER_TOOL], generation=False)  # fmt: skip
            except TemplateError:
                return ""

        return "noop" not in written("") and "noop" in written(None)

    def _find_turn_end(self) -> str:
        """What the template writes after an assistant turn's content (``<|im_end|>`` + newline)."""
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.render_text(messages, None, generation=False)
        except TemplateError:  # a tool-use-only template (Hermes-3's loops over `tools`)
            text = self.render_text(messages, [_PLACEHOLDER_TOOL], generation=False)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise TemplateError(
                "the chat template drops the assistant's content; it cannot be used for training"
            )
        return text[at + len(_SENTINEL) :]


def policy_renderer(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> ChatRenderer:
    """A policy's `ChatRenderer`, refusing chat-template kwargs the template never reads.

    Why: such a kwarg (``enable_thinkng``, or ``enable_thinking`` for a model whose template
    has no switch) changes nothing, silently; ``agentgym eval`` and the trainer refused it
    before their engines started, a policy built in Python did not. A template that cannot
    be inspected gets the benefit of the doubt.
    """
    from .._check_template import unread_template_kwargs

    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise ConfigError(
            "chat_template_kwargs must be a dict of template variables (e.g. "
            f"{{'enable_thinking': False}}), got {chat_template_kwargs!r}"
        )
    problem = unread_template_kwargs(tokenizer, chat_template_kwargs or {})
    if problem:
        raise ConfigError(f"chat_template_kwargs: {problem}")  # the message names its fix
    return ChatRenderer(tokenizer, chat_template_kwargs)


def _reasoning(content: Any) -> str:
    """The reasoning a turn's text opens with ("" when none).

    That is its ``<think>`` block's text, or the text before a ``</think>`` whose ``<think>``
    the generation prompt opened (DeepSeek-R1-Distill's, Qwen3's).
    """
    if not isinstance(content, str) or _THINK_CLOSE not in content:
        return ""
    return content.split(_THINK_CLOSE)[0].split("<think>")[-1].strip()


def _dropped_reasoning(turn: str) -> str:
    """The ``per_turn`` reason for a template that writes ``turn`` without its reasoning."""
    return (
        f"the template writes {turn} without its <think> reasoning even as the last message: "
        "the turns as sampled keep it, a fresh render of the conversation does not"
    )


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length if none)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that end a turn when sampled, as vLLM counts them.

    The tokenizer's EOS token(s) and those of the ``generation_config.json`` beside it
    (``name_or_path``: the folder or hub id it was loaded from, the model's for every policy).
    """
    ids = set(generation_eos_ids(getattr(tokenizer, "name_or_path", "") or ""))
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(eos)
    return frozenset(ids)
