"""`ToolEnv`: the multi-turn tool loop every built-in env and most user envs are made of.

One step = one assistant turn: parse its tool calls, run them, append their results, check the
stop conditions, and score the episode with the rubric when it ends. The env records each
action it was given (token ids included) in `EpisodeState.turns`, so a reward function that
asks for ``trajectory`` gets `ToolEnv.as_trajectory`, built from the env's own inputs.

Model mistakes (a malformed call, an unknown tool, bad arguments, a tool that raises or times
out, calls past ``max_tool_calls_per_turn``) become tool messages the model can read and react
to; they never end the episode, unless ``malformed_call_ends_episode`` makes a turn with only
unparseable calls its last (TRL's tool loop takes such a turn as the final answer), or a tool
raises `Forfeit` (the call destroyed what the episode is scored on: it ends, reward 0).
Infrastructure failures (`InfraError`) propagate so the rollout marks the episode
``infra_error``.

Subclasses fill named hooks: `build_prompt`, `step_reward`, `reference_turns`, and, for envs
holding resources, `setup_episode`/`teardown_episode`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import numbers
import re
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._env import Action, Env, assistant_content, assistant_message_problem, json_copy
from ._errors import ConfigError, Forfeit, InfraError, ToolError
from ._rubric import Rubric
from ._tool_calls import ToolThreads, cancel_and_wait
from ._tool_results import format_result
from ._tool_schema import example_arguments
from ._tools import Tool, as_tool, check_timeout, shown
from ._trajectory import Trajectory, Turn
from ._types import Completion, Message
from .parsers import ParsedTurn, ToolCall, ToolCallParser, get_parser
from .parsers._base import json_loads

_log = logging.getLogger(__name__)

#: The ``name`` of the tool message answering a tool call that could not be parsed: no tool
#: ran, so metrics count it as a failed call attempt, never as a tool's result.
MALFORMED_CALL = "invalid_tool_call"

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that can call tools. Call a tool when it helps; "
    "when you know the answer, reply with it and no tool call."
)


@dataclass
class EpisodeState:
    """What the env knows about the running episode; reward functions may ask for it.

    ``turns`` holds one `Turn` per step, made from the action the env was given (token ids
    when the action was a `Completion`) with the step's reward and tool errors.
    """

    task: Any = None
    task_index: int | None = None
    turn: int = 0
    completion_tokens: int = 0
    tool_call_count: int = 0
    tool_error_count: int = 0
    #: Why the episode was forfeited (a tool raised `Forfeit`): it ends, reward 0.
    forfeit: str | None = None
    done: bool = False
    #: A step was cut short while its tools ran (cancelled, or their run failed): its turn
    #: counted but its messages were never added, so the episode cannot go on.
    cut_short: bool = False
    turns: list[Turn] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


StopCondition = Callable[[EpisodeState, list[Message]], bool]


class ToolEnv(Env):
    """A conversation in which the model calls tools until it answers.

    Args:
        tools: functions or `Tool`s the model may call.
        tasks: the dataset; each task is a dict with at least ``prompt`` (the user message)
            and usually ``answer``. Any indexable sequence works (a list, a `datasets.Dataset`).
        rubric: a `Rubric` scoring the finished episode; None gives reward 0.
        parser: tool-call format of the model, a name (``hermes``, ``vllm:<name>``) or parser.
        system_prompt: shown before the task; None uses a generic tool-use prompt.
        tool_prompt: how the model learns about the tools. ``"template"``: the schemas go to
            the policy beside the messages and the model's chat template presents them (right
            for chat models served by vLLM). ``"system"``: the system prompt also lists the
            schemas and shows the call format rendered by the parser (for base models,
            templates without tool support, and scripted runs that read the prompt).
        max_turns: assistant turns before the episode is truncated.
        max_episode_tokens: completion tokens of the whole episode before truncation; counted
            from `Completion` actions (raw-text actions carry no token count). None means no
            budget. (The per-turn limit is the policy's ``max_tokens``; the rollout cuts it to
            `episode_tokens_left`.)
        stop_conditions: predicates ``(state, messages) -> bool`` ending the episode
            (terminated) after a turn, besides the final answer.
        tool_timeout: overrides every tool's own timeout (seconds, > 0) when given.
        malformed_call_ends_episode: a turn whose tool calls could not be parsed, and that has
            no call that could, ends the episode (terminated, scored by the rubric) instead of
            getting the error and another turn. Off by default: the error teaches the format.
            On, episodes end as in TRL's tool loop, which takes such a turn as the answer (for
            strict-format rewards, and for comparing the two on the same workload).
        max_tool_calls_per_turn: calls of one turn that run; each call past it gets an error
            tool message instead. Why: a turn's calls run at once, so a turn of hundreds of
            calls would flood a sandbox pool or a service (whose overload is ``infra_error``,
            an episode dropped rather than scored). None: no cap.
        max_tool_result_chars: characters of a tool message the model sees; a longer one is
            cut there, and a last line says how long it was. Why: the message is tokenized
            into the next prompt, and a model that prints in a loop (a megabyte from a code
            sandbox) took seconds to tokenize, stalling the episodes beside it, and overflowed
            any context anyway. The built-in envs' tools show less than this on their own.
            A step's ``info["tool_results_cut"]`` counts its cut results, and a run's
            ``rollout/frac_tool_results_cut`` the share. None: no cap.
    """

    #: Sync tool calls of one episode that run at once; more wait, and waiting is not timed.
    max_tool_threads: int = 8

    def __init__(
        self,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        *,
        tasks: Sequence[dict[str, Any]] = (),
        rubric: Rubric | None = None,
        parser: str | ToolCallParser = "hermes",
        system_prompt: str | None = None,
        tool_prompt: Literal["template", "system"] = "template",
        max_turns: int = 8,
        max_episode_tokens: int | None = None,
        stop_conditions: Sequence[StopCondition] = (),
        tool_timeout: float | None = None,
        malformed_call_ends_episode: bool = False,
        max_tool_calls_per_turn: int | None = 16,
        max_tool_result_chars: int | None = 32_768,
    ) -> None:
        super().__init__()
        if type(max_turns) is not int or max_turns < 1:  # 1.5 played 2 turns, None crashed
            raise ConfigError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if tool_prompt not in ("template", "system"):
            raise ConfigError(f"tool_prompt must be 'template' or 'system', got {tool_prompt!r}")
        for name, cap in (("max_tool_calls_per_turn", max_tool_calls_per_turn),
                          ("max_tool_result_chars", max_tool_result_chars),
                          ("max_episode_tokens", max_episode_tokens)):  # fmt: skip
            if cap is not None and (type(cap) is not int or cap < 1):
                raise ConfigError(f"{name} must be an int >= 1 or None, got {cap!r}")
        _check_tools(tools)
        _check_tasks(tasks)
        if rubric is not None and not callable(getattr(rubric, "score", None)):
            raise ConfigError(
                f"rubric must be an agentgym.Rubric, got {shown(rubric)}; "
                "wrap the reward functions in one: rubric=Rubric([fn, ...])"
            )
        check_timeout(tool_timeout, "tool_timeout", none_means="each tool's own timeout")
        self.tools: dict[str, Tool] = {}
        for t in map(as_tool, tools):
            if tool_timeout is not None:
                t = replace(t, timeout=tool_timeout)
            if t.name in self.tools:
                raise ConfigError(f"two tools are named {t.name!r}; tool names must be unique: "
                                  "rename one, @agentgym.tool(name=...)")  # fmt: skip
            self.tools[t.name] = t
        self.tasks = tasks
        self.rubric = rubric or Rubric()
        self.parser = get_parser(parser).for_tools([t.schema for t in self.tools.values()])
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.tool_prompt = tool_prompt
        if tool_prompt == "system" and self.tools:
            self.system_prompt += "\n\n" + describe_tools(self.tools.values(), self.parser)
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.stop_conditions = list(stop_conditions)
        self.malformed_call_ends_episode = malformed_call_ends_episode
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.max_tool_result_chars = max_tool_result_chars
        self.state = EpisodeState()
        self.state.done = True
        self._tool_schemas = [t.schema for t in self.tools.values()]
        self._tool_threads = ToolThreads(self.max_tool_threads)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse `copy`, `copy.deepcopy` and `pickle` in one line naming what to do instead.

        Why: a ToolEnv holds live things (its tool threads' lock, and in subclasses sandbox
        leases, servers, connections): a deep copy or a pickle failed deep inside with
        "cannot pickle '_thread.lock' object", and a shallow copy shared the episode, so
        stepping one copy changed the other.
        """
        raise ConfigError(
            f"{type(self).__name__} cannot be copied or pickled (it holds tool threads and may "
            "hold sandboxes or servers); make another with agentgym.make(env.spec), and pass "
            "a function that makes the env where one must cross processes (AsyncVectorEnv)"
        )

    # ---- hooks -------------------------------------------------------------------------
    def build_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The opening messages for ``task``: the system prompt, then the task's prompt."""
        if "prompt" not in task:
            raise ConfigError(
                f"the task has no 'prompt' (its keys: {sorted(task)}); give each task one, "
                "e.g. load_tasks(..., fields={'question': 'prompt'}), or override build_prompt"
            )
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + [{"role": "user", "content": task["prompt"]}]

    def step_reward(self, state: EpisodeState, new_messages: list[Message]) -> float:
        """Reward for one turn (shaping); 0 by default, the rubric scores the episode."""
        return 0.0

    def reference_turns(self, task: dict[str, Any]) -> list[str] | None:
        """A known-good script of assistant turns for ``task`` (for oracle runs and checks)."""
        return None

    async def setup_episode(self, task: dict[str, Any]) -> None:
        """Acquire per-episode resources (a sandbox lease ...); called by `areset`."""

    async def teardown_episode(self) -> None:
        """Release what `setup_episode` acquired; called when the episode ends or resets."""

    def tool_context(self) -> dict[str, Any]:
        """Values injected into tools and reward functions that ask for them by name.

        The names are fixed (``task``, ``state``, ``messages``, ``env``, ``sandbox``): a tool
        parameter with any other name is shown to the model. Override this to change what
        they hold; reach objects of your own through ``env`` (a tool asking for ``env`` can
        use ``env.db``).
        """
        return {
            "task": self.state.task,
            "state": self.state,
            "messages": self.messages,
            "env": self,
            "sandbox": getattr(self, "sandbox", None),
        }

    @property
    def episode_tokens_left(self) -> int | None:
        """Completion tokens the episode may still sample; None: no ``max_episode_tokens``.

        The rollout cuts each turn's token limit to it: without that, a turn could sample
        its whole per-turn limit past the budget, only for the episode to be truncated
        after it, and a trainer would learn from tokens the budget was there to bound.
        """
        if self.max_episode_tokens is None:
            return None
        return self.max_episode_tokens - self.state.completion_tokens

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI ``tools`` list for the policy."""
        return json_copy(self._tool_schemas)

    def as_trajectory(self) -> Trajectory:
        """The episode so far as this env saw it: what reward functions get as ``trajectory``.

        Built only from the env's inputs (the task, the actions, the messages), so it is the
        same whether the rollout engine or a person steps the env. It has no timings, seed or
        outcome: those belong to whoever plays the episode.
        """
        return Trajectory(
            env_id=getattr(self.spec, "id", type(self).__name__),
            task=json_copy(self.state.task),
            task_index=self.state.task_index,
            messages=json_copy(self.messages),
            turns=list(self.state.turns),
        )

    # ---- the loop ----------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await super().areset(seed=seed)
        if not self.state.done:
            await self.teardown_episode()
        task, index = self._pick_task({} if options is None else options)
        self.state = EpisodeState(task=task, task_index=index)
        await self.setup_episode(task)
        self.messages = self._checked_prompt(self.build_prompt(task))
        return json_copy(self.messages), {"task_index": index, "task": json_copy(task)}

    async def astep(
        self, action: Action
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self.state.done:
            raise ConfigError("the episode is over (or never started); call reset() first")
        self._refuse_if_cut_short()
        completion = _as_completion(action)  # a bad action raises before the turn counts
        parsed = self._interpret(completion)
        state = self.state
        state.turn += 1
        state.completion_tokens += completion.sampled_tokens or 0
        assistant, calls = self._assistant_message(parsed)
        tool_messages: list[Message] = []
        errors: list[str] = []
        cut = 0
        try:
            if calls or parsed.errors:  # a final answer has no tools to run
                tool_messages, errors, cut = await self._run_tools(calls, parsed.errors)
        except BaseException:  # why: a next step went on as if the cut turn had never been
            state.cut_short = True
            raise
        new_messages = [assistant, *tool_messages]
        self.messages.extend(new_messages)
        state.tool_call_count += len(calls)
        state.tool_error_count += len(errors)
        step_reward = float(self.step_reward(state, new_messages))
        turn = Turn.from_completion(
            completion, reward=step_reward, tool_errors=list(errors), tool_results_cut=cut
        )
        state.turns.append(turn)  # before scoring: the rubric's trajectory ends with this turn
        final_answer = not calls and (not parsed.errors or self.malformed_call_ends_episode)
        terminated = (
            final_answer
            or state.forfeit is not None
            or (
                bool(self.stop_conditions)  # no generator for the usual env, which has none
                and any(stop(state, self.messages) for stop in self.stop_conditions)
            )
        )
        truncated = not terminated and self._out_of_budget()
        info: dict[str, Any] = {
            "turn": state.turn, "tool_errors": errors, "tool_results_cut": cut,
            "step_reward": step_reward,
        }  # fmt: skip
        if terminated or truncated:
            info |= await self._finish()
        reward = step_reward + info.get("final_reward", 0.0)
        return json_copy(new_messages), reward, terminated, truncated, info

    async def atruncate(self) -> dict[str, Any]:
        if self.state.done:
            raise ConfigError("the episode is over (or never started); call reset() first")
        self._refuse_if_cut_short()
        return await self._finish()

    def _refuse_if_cut_short(self) -> None:
        """Why: a step cut short counted its turn without its messages; play cannot go on."""
        if self.state.cut_short:
            raise ConfigError("the episode's last step was cut short (cancelled or failed while "
                              "its tools ran); call reset() first")  # fmt: skip

    async def aclose(self) -> None:
        if not self.state.done:
            self.state.done = True
            await self.teardown_episode()

    # ---- the pieces --------------------------------------------------------------------
    def _pick_task(self, options: Any) -> tuple[dict[str, Any], int | None]:
        # options=3 raised a bare TypeError from len(); a plain dict needs no ABC check
        if type(options) is not dict and not isinstance(options, Mapping):
            raise ConfigError(
                f"reset options must be a dict whose only key is 'task', e.g. "
                f"options={{'task': 0}}, got {shown(options)}"
            )
        if len(options) > ("task" in options):  # an option besides 'task'
            unknown = sorted(set(options) - {"task"})
            raise ConfigError(f"unknown reset option(s) {unknown}; the only option is 'task'")
        choice = options.get("task")
        if isinstance(choice, dict):
            return json_copy(choice), None
        if not len(self.tasks):
            raise ConfigError(
                f"{type(self).__name__} has no tasks; "
                "pass tasks=[...] or options={'task': {...}}"
            )
        if choice is None:
            choice = int(self.np_random.integers(len(self.tasks)))
        is_index = type(choice) is int or (
            isinstance(choice, numbers.Integral) and not isinstance(choice, bool)
        )
        if not is_index or not 0 <= int(choice) < len(self.tasks):
            raise ConfigError(
                "options['task'] must be a task dict or an index in "
                f"[0, {len(self.tasks)}), got {choice!r}"
            )
        index = int(choice)
        task = self.tasks[index]
        if type(task) is dict:  # the usual task: a Mapping, nothing to check
            return json_copy(task), index
        _check_task(task, index)
        return json_copy(dict(task)), index

    def _checked_prompt(self, messages: Any) -> list[Message]:
        """`build_prompt`'s result, refused here when it is not a list of messages.

        Unchecked, a wrong one (a str) fails later and far away, in the policy or at the first
        step, with an error that names neither the hook nor the env.
        """
        if isinstance(messages, list):
            for m in messages:
                if not (isinstance(m, dict) and "role" in m):
                    break
            else:
                return messages
        raise ConfigError(
            f"{type(self).__name__}.build_prompt must return a list of messages like "
            f"[{{'role': 'user', 'content': ...}}], got {shown(messages)}"
        )

    def _interpret(self, completion: Completion) -> ParsedTurn:
        """The turn's content and calls; calls written while reasoning are not run.

        As vLLM's reasoning parsers do: a call inside the reply's opening ``<think>`` block is
        reasoning, not a call (see `_reasoning_end`). One parse of the whole reply, and one of
        the text before each ``</think>`` tried as the reasoning's end (reused to tell whether
        the reasoning held calls); a reply that opens with ``<think>`` and never closes it is
        not parsed again.
        """
        if completion.message is not None:
            return _parse_message(completion.message)
        text = completion.text
        turn = self.parser.parse(text)
        if not (turn.tool_calls or turn.errors):
            return turn
        if _THINK_CLOSE not in text and _THINK_OPEN not in text:  # no reasoning (the usual)
            return turn
        thoughts: list[ParsedTurn] = []  # the text before the </think> ending the reasoning

        def inside_call(close: int) -> bool:
            # a call cut in half by this </think>: an error the whole text does not have
            thought = self.parser.parse(text[:close])
            if any(error not in turn.errors for error in thought.errors):
                return True
            thoughts.append(thought)
            return False

        end = _reasoning_end(text, inside_call)
        if not end:
            return turn
        if not thoughts:  # opens with <think>, never closed outside a call: reasoning to its end
            return ParsedTurn(content=text.strip())
        if not (thoughts[0].tool_calls or thoughts[0].errors):
            return turn  # no call in the reasoning: the whole reply's parse stands
        rest = text[end:]
        turn = self.parser.parse(rest)
        if not (turn.tool_calls or turn.errors):
            return ParsedTurn(content=text.strip())
        gap = rest[: len(rest) - len(rest.lstrip())]  # content: the text before the call
        turn.content = (text[:end] + gap + turn.content).strip()
        return turn

    def _assistant_message(self, parsed: ParsedTurn) -> tuple[Message, list[ToolCall]]:
        if not parsed.tool_calls:  # a final answer
            return {"role": "assistant", "content": parsed.content}, []
        calls = [
            ToolCall(c.name, c.arguments, c.id or self.parser.make_call_id(self.state.turn, i))
            for i, c in enumerate(parsed.tool_calls)
        ]
        message: Message = {"role": "assistant", "content": parsed.content,
                            "tool_calls": [c.to_openai() for c in calls]}  # fmt: skip
        return message, calls

    async def _run_tools(
        self, calls: list[ToolCall], parse_errors: list[str]
    ) -> tuple[list[Message], list[str], int]:
        """The turn's tool messages, its errors and how many results were cut to be shown."""
        cap = len(calls) if self.max_tool_calls_per_turn is None else self.max_tool_calls_per_turn
        run = calls[:cap]
        if len(run) == 1:  # the common turn: no task to schedule, no gather
            results = [await self._call_tool(run[0])]
        elif run:
            running = [asyncio.ensure_future(self._call_tool(c)) for c in run]
            try:
                results = await asyncio.gather(*running)
            finally:  # one call failed or the episode was cancelled: stop the others, go on
                await cancel_and_wait(running)
        else:
            results = []
        if len(run) < len(calls):
            refused = (
                f"not run: this turn made {len(calls)} tool calls and at most {cap} run per "
                "turn; make fewer calls in one turn"
            )
            results += [(f"Error: {refused}", refused)] * (len(calls) - len(run))
        messages: list[Message] = [
            {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": content}
            for c, (content, _) in zip(calls, results)
        ]
        errors = [err for _, err in results if err]
        if parse_errors:
            shown = self._shown_parse_errors(len(calls), parse_errors)
            messages += [
                {
                    "role": "tool",
                    "tool_call_id": self.parser.make_call_id(self.state.turn, len(calls) + i),
                    "name": MALFORMED_CALL,
                    "content": f"Error: {problem}. Emit tool calls in the documented format.",
                }
                for i, problem in enumerate(shown)
            ]
            errors += shown
        limit, cut = self.max_tool_result_chars, 0
        for message in messages:  # cut here, the calls' results and the errors alike
            if limit is not None and len(message["content"]) > limit:
                message["content"], cut = _cut(message["content"], limit), cut + 1
        return messages, errors, cut

    def _shown_parse_errors(self, calls: int, parse_errors: list[str]) -> list[str]:
        """The turn's parse errors as the model reads them, one tool message each.

        One each while the turn's calls and errors together are within
        ``max_tool_calls_per_turn`` (at least one), the last of those standing for the rest.
        Why: each error was its own tool message, uncapped: ``<tool_call></tool_call>`` 2000
        times (4000 tokens) became 2000 messages, 234 KB of the next prompt.
        """
        cap = self.max_tool_calls_per_turn
        room = None if cap is None else max(cap - calls, 1)
        if room is None or len(parse_errors) <= room:
            return parse_errors
        shown, rest = parse_errors[: room - 1], parse_errors[room - 1 :]
        more = f"; and {len(rest) - 1} more" if len(rest) > 1 else ""
        return [*shown, f"{rest[0]}{more} (this turn had {len(parse_errors)} malformed tool calls)"]

    async def _call_tool(self, call: ToolCall) -> tuple[str, str | None]:
        """Run one call; return (tool message content, error or None).

        A result with no text for the model (an object whose str is its memory address) is
        the tool's error too (`format_result`), so the model reads why, not an address.
        """
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            error = f"unknown tool {call.name!r}; available tools: {known}"
            return f"Error: {error}", error
        try:
            context = self.tool_context() if tool.injected else None
            result = await tool.acall(call.arguments, context, threads=self._tool_threads)
            return format_result(result, call.name), None
        except InfraError:
            raise
        except ToolError as exc:
            if isinstance(exc, Forfeit) and self.state.forfeit is None:
                self.state.forfeit = f"{call.name}: {exc}"
            return f"Error: {exc}", str(exc)

    def _out_of_budget(self) -> bool:
        if self.state.turn >= self.max_turns:
            return True
        budget = self.max_episode_tokens
        return budget is not None and self.state.completion_tokens >= budget

    async def _finish(self) -> dict[str, Any]:
        self.state.done = True
        result = None
        try:
            if self.state.forfeit is None:  # forfeited: what the rubric reads is not the model's
                for last in reversed(self.messages):
                    if last["role"] == "assistant":
                        break
                else:
                    last = {}
                context = _RewardContext(self.tool_context())
                context["completion"] = without_reasoning(last.get("content") or "")
                context["answer"] = (self.state.task or {}).get("answer")
                context.build_trajectory = self.as_trajectory
                result = await self.rubric.score(context)
        except BaseException:
            await self.teardown_episode()
            raise
        teardown_error = await self._teardown_after_scoring()
        if self.state.forfeit is not None:  # before scoring, or a reward's read forfeited it
            info = {"final_reward": 0.0, "scores": dict.fromkeys(self.rubric.names, 0.0),
                    "reward_errors": {}, "forfeit": self.state.forfeit}  # fmt: skip
        else:
            assert result is not None  # scored: the episode was not forfeited
            info = {
                "final_reward": result.reward,
                "scores": result.scores,
                "reward_errors": result.errors,
            }
        if teardown_error:
            info["teardown_error"] = teardown_error
        return info

    async def _teardown_after_scoring(self) -> str | None:
        """`teardown_episode` once the episode is scored: its failure is recorded, not raised.

        Why: an exception there replaced the scored result, so the episode became ``error``
        and trained as its group's worst for the env's own cleanup bug. The score stands;
        ``info["teardown_error"]`` (and a warning) say what failed.
        """
        try:
            await self.teardown_episode()
        except Exception:
            _log.warning("%s: teardown_episode failed after the episode was scored",
                         type(self).__name__, exc_info=True)  # fmt: skip
            return traceback.format_exc()
        return None


class _RewardContext(dict[str, Any]):
    """What reward functions may ask for; ``trajectory`` is built when the first one asks.

    `ToolEnv.as_trajectory` copies the whole conversation, which the reward functions of most
    rubrics never read; the episode is over, so building it later gives the same record.
    """

    build_trajectory: Callable[[], Trajectory]

    def get(self, key: str, default: Any = None) -> Any:
        if key == "trajectory" and key not in self:
            self[key] = self.build_trajectory()
        return dict.get(self, key, default)  # not super(): every reward argument comes here

    def __missing__(self, key: str) -> Any:
        if key != "trajectory":
            raise KeyError(key)
        value = self[key] = self.build_trajectory()
        return value


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
#: ``</think>``s tried as the end of the reasoning: each costs one parse of the reply.
_MAX_THINK_CLOSES = 8


def _reasoning_end(text: str, inside_call: Callable[[int], bool] | None = None) -> int:
    """Where the reply's opening reasoning block ends (after its ``</think>``); 0 if it has none.

    The block opens the reply (``<think>`` first, or opened by the template in the prompt, as
    Qwen3's and DeepSeek-R1's are). Why: a tool call the model writes while thinking is not a
    call: vLLM's server, with a reasoning parser, drops it, and an env that ran it would train
    a habit that does nothing when the model is deployed.

    ``inside_call(close)``, when given, says whether the ``</think>`` at ``close`` is part of
    a call; such a one does not end the block, and the next is tried (at most
    `_MAX_THINK_CLOSES`). Why: the first ``</think>`` anywhere counted, so a call whose
    argument held one (code, HTML, docs about reasoning models) was cut in half, not run, and
    the turn became the final answer, silently. Without it the first ``</think>`` counts.
    A reply that opens with ``<think>`` and has no ``</think>`` that counts is reasoning to its
    end (max_tokens hit while thinking): ``len(text)``, as vLLM's reasoning parsers return
    such a reply as reasoning only.
    """
    opens = text.lstrip().startswith(_THINK_OPEN)
    opened = text.find(_THINK_OPEN)
    close = text.find(_THINK_CLOSE)
    for _ in range(_MAX_THINK_CLOSES):
        if close < 0:
            break
        if 0 <= opened < close and not opens:
            return 0  # text before the block: it does not open the reply
        if inside_call is None or not inside_call(close):
            return close + len(_THINK_CLOSE)
        close = text.find(_THINK_CLOSE, close + 1)
    return len(text) if opens else 0


def without_reasoning(text: str) -> str:
    """The reply as a reward reads it: without its ``<think>`` reasoning.

    Why: a reasoning model weighs candidates before it answers ("math.gcd or math.lcm?"), and
    a reward that reads the reply's last number, or refuses a reply naming two functions,
    would score the thinking instead of the answer. Removed: every ``<think>...</think>``
    block; text before a ``</think>`` that no ``<think>`` opens (templates that open the
    block in the prompt, as Qwen3's and DeepSeek-R1's do); and an unclosed ``<think>`` to the
    end (reasoning cut off before any answer). The raw text stays in ``messages``.
    """
    if _THINK_OPEN not in text and _THINK_CLOSE not in text:
        return text
    text = _THINK_BLOCK.sub("", text[_reasoning_end(text) :])
    cut = text.find(_THINK_OPEN)
    return (text if cut < 0 else text[:cut]).strip()


def _check_tools(tools: Any) -> None:
    """Refuse what is not a list of tools before its items are turned into tools."""
    if callable(tools):  # one tool, not a list of them
        name = getattr(tools, "name", None) or getattr(tools, "__name__", "tool")
        raise ConfigError(f"tools must be a list of tools, e.g. [{name}], got one")
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise ConfigError(
            f"tools must be a list of tools or functions, got {shown(tools)}; "
            "pass tools=[...], or leave it out for an env without tools"
        )


def _check_tasks(tasks: Any) -> None:
    """Refuse tasks that `reset` could not index, and a first task that is not a dict.

    Only the first task is checked here (envs are built per episode, and a dataset may be
    large); `_pick_task` checks each task it picks.
    """
    indexable = hasattr(tasks, "__len__") and hasattr(tasks, "__getitem__")
    if isinstance(tasks, (str, bytes, Mapping)) or not indexable:
        fix = (
            "a dict is one task: wrap it in a list, tasks=[{...}]"
            if isinstance(tasks, Mapping) and "prompt" in tasks
            else "pass a list of task dicts (agentgym.load_tasks reads files and datasets)"
        )
        raise ConfigError(f"tasks must be a list of task dicts, got {shown(tasks)}; {fix}")
    if hasattr(tasks, "columns") and hasattr(tasks, "to_dict"):  # tasks[0] is a column
        raise ConfigError(
            f"tasks must be a list of task dicts, got a {type(tasks).__name__}; pass "
            "df.to_dict('records')"
        )
    if len(tasks):
        _check_task(tasks[0], 0)


def _check_task(task: Any, index: int) -> None:
    if not isinstance(task, Mapping):
        raise ConfigError(
            f"task {index} is a {shown(task)}, not a dict; each task is a dict such as "
            "{'prompt': 'What is 2 + 3?', 'answer': '5'}"
        )


def describe_tools(tools: Iterable[Tool], parser: ToolCallParser) -> str:
    """System-prompt text listing the tools' schemas and an example call in the parser's format."""
    tools = list(tools)
    schemas = "\n".join(json.dumps(t.schema["function"], ensure_ascii=False) for t in tools)
    example = parser.render("", [ToolCall(tools[0].name, example_arguments(tools[0].parameters))])
    return f"Tools you can call:\n{schemas}\n\nTo call a tool, write exactly:\n{example}"


def _as_completion(action: Action) -> Completion:
    """Every kind of action as a `Completion`, the one form the env records and parses."""
    if isinstance(action, Completion):
        if action.message is not None:
            _check_message(action.message, "Completion.message's")
        return action
    if isinstance(action, str):
        return Completion(text=action)
    if isinstance(action, dict) and action.get("role") == "assistant":
        _check_message(action, "the action's")
        return Completion(text=assistant_content(action), message=action)
    raise ConfigError(
        f"action must be assistant text, an assistant message dict or a Completion; "
        f"got {type(action).__name__}"
    )


def _check_message(message: Message, whose: str) -> None:
    """Refuse an assistant message whose shape `_parse_message` cannot read, naming the field."""
    problem = assistant_message_problem(message)
    if problem:
        raise ConfigError(f"{whose} {problem}")


def _parse_message(message: Message) -> ParsedTurn:
    """A `ParsedTurn` from an OpenAI assistant message (arguments may be a JSON string).

    The message passed `_check_message`; the values in it are the model's, so arguments that
    are not a JSON object are its mistake, as they are in parsed text.
    """
    turn = ParsedTurn(content=assistant_content(message))
    for raw in message.get("tool_calls") or []:
        function = raw["function"]
        arguments = function.get("arguments", {})
        try:
            if isinstance(arguments, str):
                arguments = json_loads(arguments) if arguments.strip() else {}
            if not isinstance(arguments, dict):
                raise TypeError("arguments must be a JSON object")
        except (ValueError, TypeError) as exc:
            turn.errors.append(f"malformed arguments for {function.get('name')!r}: {exc}")
            continue
        turn.tool_calls.append(ToolCall(function["name"], arguments, raw.get("id", "")))
    return turn


def _cut(content: str, limit: int) -> str:
    """A tool message's content as the model sees it: its first ``limit`` characters, and why."""
    return (f"{content[:limit]}\n[cut: the result has {len(content):,} characters; the first "
            f"{limit:,} are shown]")  # fmt: skip
