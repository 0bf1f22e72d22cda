"""`Env`: the Gymnasium contract for conversations, async-first with a sync adapter.

Observation: OpenAI-format chat messages. `reset` returns the opening conversation (system,
user); `step` returns only the messages the step appended, starting with the assistant message
as the env understood it, so ``reset_obs + sum(step_obs)`` is always the whole conversation
(also available as `Env.messages`). Action: the assistant turn, as raw text (parsed by the
env's tool-call parser), an already-parsed assistant message dict, or a `Completion` from a
policy (which also carries token counts).

Subclasses implement `areset` (calling ``await super().areset(seed=seed)`` first, which seeds
`np_random` as Gymnasium's `reset` does, so both paths seed alike) and `astep`. The sync
`reset`/`step` run them on an event loop shared by all envs of the calling thread, so
Gymnasium tools (`check_env`, wrappers) work unchanged and an env that is never closed leaks
no loop; called where an event loop already runs (a Jupyter cell), they run that same loop
on a helper thread and wait for it. Async code (the rollout engine) awaits `areset`/`astep`
directly so that one episode's slow tool never blocks another.

Data flows one way: the env is given actions and reports, in each step's ``info``, what it
rewarded; it never reads what the engine records. Reward functions that want the episode get
a `Trajectory` the env builds from its own inputs.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import inspect
import os
import reprlib
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from ._errors import ConfigError
from ._tool_calls import cancel_and_wait
from ._types import Completion, Message

#: What `step` accepts: raw text, a parsed assistant message, or a policy `Completion`.
Action = Any
_T = TypeVar("_T")

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_SAMPLE_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!{}\"':<>/_-\n"


_ATOMS = frozenset({str, int, float, bool, type(None)})


def json_copy(value: Any) -> Any:
    """Copy nested dicts/lists (JSON-shaped data) without `copy.deepcopy`'s overhead.

    Dicts and lists (subclasses too) become new plain dicts and lists; anything else is shared,
    as immutable JSON scalars can be. Exact scalar types are tested first because this runs on
    every observation the env returns; a plain dict is copied whole in C and only its nested
    values are replaced, which is faster than building it again key by key.
    """
    kind = type(value)
    if kind is dict:
        copy = value.copy()
        for k, v in value.items():
            if type(v) not in _ATOMS:
                copy[k] = json_copy(v)
        return copy
    if kind is list:
        return [v if type(v) in _ATOMS else json_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


class MessagesSpace(spaces.Space[list[Message]]):
    """A list of chat messages, each a dict with a known ``role``."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and m.get("role") in _ROLES for m in x
        )

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        text = _random_text(self.np_random, 32)
        return [{"role": "user", "content": text}]

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: object) -> bool:
        """Equal to any `MessagesSpace`: its generator is not part of what it holds.

        Why: `gymnasium.vector.AsyncVectorEnv` compares the spaces its workers send back
        (copies, unpickled) with its own, and identity made every copy "not equivalent".
        """
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class AssistantTurnSpace(spaces.Space[Any]):
    """Raw assistant text, or an assistant message dict; samples random short text."""

    def __init__(self, max_length: int = 64, seed: int | None = None) -> None:
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        if isinstance(x, dict):
            return x.get("role") == "assistant" and not assistant_message_problem(x)
        return isinstance(x, Completion)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _random_text(self.np_random, self.max_length)

    def __repr__(self) -> str:
        return f"AssistantTurnSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        """Equal when it samples the same lengths; see `MessagesSpace.__eq__` for why."""
        if type(other) is not type(self):
            return False
        assert isinstance(other, AssistantTurnSpace)
        return other.max_length == self.max_length

    def __hash__(self) -> int:
        return hash((type(self), self.max_length))


def assistant_message_problem(message: Message) -> str:
    """What keeps an assistant message dict from being a step's action, with the fix; "" if none.

    Why: `AssistantTurnSpace.contains` took any dict with role assistant, and a shape the
    step could not read (content parts, ``tool_calls="abc"``, a call without ``function``)
    failed deep in the reward or the parser with a bare TypeError, filed as the episode's
    ``error``. `contains` and `step` share this check, so what the space holds steps. Only
    the shape is checked: what a model writes into it (a tool name, arguments that are not
    JSON) is the model's mistake, answered by a tool message as from parsed text.
    """
    content = message.get("content")
    if content is not None and not isinstance(content, str) and not _is_text_parts(content):
        return (
            "content must be a str, None or a list of text parts "
            f"[{{'type': 'text', 'text': '...'}}], got {_shown(content)}"
        )
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        return f"tool_calls must be a list of OpenAI tool calls or None, got {_shown(calls)}"
    for i, call in enumerate(calls or ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments", ""), (str, dict))
        ):
            return (
                f"tool_calls[{i}] must be {{'function': {{'name': str, 'arguments': JSON str "
                f"or dict}}}}, got {_shown(call)}"
            )
    return ""


def assistant_content(message: Message) -> str:
    """The content of an assistant message that passed `assistant_message_problem`, as one str.

    OpenAI lets content be a list of text parts; they are one reply, joined as the API joins
    them, so a reward reads the same text whichever form the reply came in.
    """
    content = message.get("content") or ""
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _is_text_parts(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    )


def _shown(value: Any) -> str:
    """A value as error messages quote it: its type and a repr cut short."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


class _SpacePerEnv:
    """A class attribute giving each env a space of its own, made on first read.

    Why: Gymnasium seeds and samples spaces per env (``env.action_space.seed(0)``); one space
    object shared by every env of a class made one env's seed change another env's samples.
    Each env's space is made afresh (not copied from the template), so it starts unseeded, as
    a Gymnasium env's does. Assigning ``self.observation_space = ...`` (or a subclass's own
    class attribute) wins.
    """

    def __init__(self, make: Callable[[], spaces.Space[Any]]) -> None:
        self.make = make
        self.template = make()

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, env: object, owner: type | None = None) -> Any:
        if env is None:
            return self.template  # read on the class
        space = self.make()
        env.__dict__[self.name] = space  # later reads find it first (a non-data descriptor)
        return space


def _random_text(rng: np.random.Generator, max_length: int) -> str:
    length = int(rng.integers(1, max_length + 1))
    return "".join(rng.choice(list(_SAMPLE_CHARS), size=length))


#: Set while `Env.reset` runs: the base `areset` then serves a subclass's own sync `reset`.
_in_sync_reset: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentgym_in_sync_reset", default=False
)


def _overrides_only_sync(cls: type, name: str) -> bool:
    """Whether ``cls`` overrides Gymnasium's sync ``name`` but not agentgym's async ``a{name}``."""
    return getattr(cls, name) is not getattr(Env, name) and getattr(cls, f"a{name}") is getattr(
        Env, f"a{name}"
    )


def _sync_only_message(cls: type, name: str) -> str:
    """The one-line refusal of an env that implements ``name`` the Gymnasium way only.

    Why: the rollout engine awaits `areset`/`astep`; an env written as a Gymnasium env (sync
    ``reset``/``step``) passed ``check_env`` but played an empty conversation in a rollout, or
    failed there with a bare NotImplementedError.
    """
    base = name.removeprefix("a")
    if name == base:
        return (
            f"{cls.__name__} overrides the sync {base}() but not async a{base}(), which the "
            f"rollout engine awaits; rename it to `async def a{base}(...)` (calling "
            f"`await super().a{base}(...)` where it called super().{base}); env.{base}() then "
            "runs it"
        )
    return f"{cls.__name__} does not implement `async def {name}(self, action)`"


class _TakesRenderMode(type):
    """Every env class takes Gymnasium's ``render_mode`` keyword, whatever its `__init__` takes.

    `gymnasium.make(id, render_mode=...)` passes it to the env class itself; an env's own
    `__init__` (a user's too) need not know it. An env whose `__init__` names ``render_mode``
    gets it, as Gymnasium envs do.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if "render_mode" not in kwargs or _takes_render_mode_itself(cls):
            return _construct(cls, args, kwargs)
        mode = kwargs.pop("render_mode")
        modes = getattr(cls, "metadata", {}).get("render_modes", ())
        if mode is not None and mode not in modes:
            raise ConfigError(
                f"{cls.__name__} has no render_mode {mode!r}; it has {list(modes)} "
                "('ansi': the conversation so far as text; 'human': printed as it grows), or None"
            )
        env = _construct(cls, args, kwargs)
        env.render_mode = mode
        return env


def _construct(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The env; options it does not take are refused as `agentgym.make` refuses them.

    Why: `gymnasium.make(id, foo=1)` calls the class itself, past the registry's checks, and
    a misspelt option raised Python's TypeError from deep inside, naming neither the options
    the env takes nor the one meant. (A function, not a method of the metaclass: a user's env
    with a method of that name would have been called instead.)
    """
    try:
        return type.__call__(cls, *args, **kwargs)
    except TypeError:
        if not args:  # options by name, as Gymnasium passes them: say which are wrong
            from ._registry import check_env_kwargs

            check_env_kwargs(cls.__name__, cls, kwargs)
        raise


def _takes_render_mode_itself(cls: type) -> bool:
    """Whether the class's own `__init__` names ``render_mode`` (a Gymnasium-style env)."""
    return "render_mode" in inspect.signature(cls.__init__).parameters  # type: ignore[misc]


class Env(gymnasium.Env[list[Message], Action], metaclass=_TakesRenderMode):
    """Base class of agentgym environments: a multi-turn conversation as a Gymnasium env.

    Rewards: ``step`` returns, as Gymnasium users expect, the sum of the step's own reward
    and, on the episode's last step, the final reward (e.g. a rubric's score). ``info`` keeps
    the parts apart, ``info["step_reward"]`` and ``info["final_reward"]`` (with per-function
    ``info["scores"]``), so a trainer reads them instead of taking the sum apart.
    """

    #: ``render_fps``: a conversation has no frame rate (it renders as text, when asked), but
    #: Gymnasium's env checker warns on every check of an env with render modes and no fps.
    metadata: dict[str, Any] = {"render_modes": ["ansi", "human"], "render_fps": 1}
    observation_space: spaces.Space[Any] = _SpacePerEnv(MessagesSpace)  # type: ignore[assignment]
    action_space: spaces.Space[Any] = _SpacePerEnv(AssistantTurnSpace)  # type: ignore[assignment]
    _pending_seed: int | None = None  # a seed the generator has yet to be built from
    _lazy_rng: np.random.Generator | None = None  # the generator, once built
    _printed = 0  # messages of this episode already printed (render_mode "human")

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; ``options["task"]`` picks a task (an index or a task dict).

        Subclasses call ``await super().areset(seed=seed)`` before drawing from `np_random`:
        like Gymnasium's `reset`, it reseeds `np_random` when ``seed`` is given and keeps the
        current generator when it is None. The base returns an empty conversation.
        """
        if not _in_sync_reset.get() and _overrides_only_sync(type(self), "reset"):
            raise ConfigError(_sync_only_message(type(self), "reset"))
        if seed is not None:
            self._seed(seed)
        self.messages = []
        return [], {}

    def _seed(self, seed: int) -> None:
        """Gymnasium's ``reset(seed=seed)``, building the generator on its first use.

        Building it costs more than a whole env step, and most episodes never draw (the rollout
        engine names each episode's task), so `np_random` builds it from the pending seed when
        asked; the draws are the same as with an eager build. Seeds Gymnasium would refuse go
        through Gymnasium at once, so the error is raised here, as before.
        """
        if type(seed) is not int or seed < 0:
            gymnasium.Env.reset(self, seed=seed)
            self._pending_seed = None
            return
        self._lazy_rng = None
        self._np_random_seed = seed
        self._pending_seed = seed

    @property  # Gymnasium's attribute, built on its first read
    def _np_random(self) -> np.random.Generator | None:
        """Gymnasium's generator slot: a pending seed builds the generator when it is read.

        Gymnasium's env checker reads this attribute right after ``reset(seed=...)``, so it must
        not stay None for an env that never drew from `np_random`.
        """
        if self._lazy_rng is None and self._pending_seed is not None:
            seed, self._pending_seed = self._pending_seed, None
            self._lazy_rng, self._np_random_seed = seeding.np_random(seed)
        return self._lazy_rng

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        self._lazy_rng = value

    @property
    def np_random(self) -> np.random.Generator:
        """The episode's generator (Gymnasium's), built from the last seed on first use."""
        rng = self._np_random
        if rng is None:  # never seeded: an unseeded generator, as Gymnasium gives
            rng, self._np_random_seed = seeding.np_random(None)
            self._lazy_rng = rng
        return rng

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._pending_seed = None
        self._lazy_rng = value
        self._np_random_seed = -1  # Gymnasium's "seed unknown"

    async def astep(
        self, action: Action
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one assistant turn.

        Returns:
            new_messages: messages appended by this step (assistant first, then tool/user).
            reward: ``info["step_reward"]``, plus ``info["final_reward"]`` if the episode ended.
            terminated: the episode ended on its own (final answer, solved, failed).
            truncated: the episode was cut short (max turns, token budget).
            info: ``step_reward`` (may be left out by an env whose episode has no final
                reward: the returned reward is then the step's own), ``tool_errors`` (the
                model's mistakes this step, as messages), ``tool_results_cut`` (tool results
                shown only in part), ``turn``; when the episode ends also
                ``final_reward``, ``scores`` and ``reward_errors``.
        """
        which = "step" if _overrides_only_sync(type(self), "step") else "astep"
        raise NotImplementedError(_sync_only_message(type(self), which))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync adapter over `areset` (works in a notebook too); async code awaits `areset`."""
        token = _in_sync_reset.set(True)  # a Gymnasium-style reset override calls this
        try:
            reset = self._run_sync(self.areset(seed=seed, options=options))
        finally:
            _in_sync_reset.reset(token)
        self._printed = 0
        self._print_new_messages()
        return reset

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Sync adapter over `astep` (works in a notebook too); async code awaits `astep`."""
        stepped = self._run_sync(self.astep(action))
        self._print_new_messages()
        return stepped

    def render(self) -> str | None:
        """The conversation so far as text (``render_mode="ansi"``), one block per message.

        An env's state is its conversation: code reads `messages` (OpenAI-format dicts);
        this is for eyes (a notebook, a log). In ``"human"`` mode the sync `reset` and `step`
        print each new message as it comes, as Gymnasium's human mode draws during `step`;
        `render()` then prints what is not printed yet (the messages of awaited `astep` calls,
        which print nothing: the rollout engine's hot path stays free of I/O) and returns
        None. Without a render mode it says how to get one, where Gymnasium's base raised a
        bare ``NotImplementedError``.
        """
        if self.render_mode == "human":
            self._print_new_messages()
            return None
        if self.render_mode != "ansi":
            raise NotImplementedError(
                f"{type(self).__name__} was made without render_mode; make it with "
                "render_mode='ansi' for the conversation as text (or 'human' to print it as "
                "it grows), or read env.unwrapped.messages (OpenAI-format message dicts)"
            )
        return "\n\n".join(message_text(m) for m in self.messages)

    def _print_new_messages(self) -> None:
        """Print (``render_mode="human"``) the messages of this episode not printed yet."""
        if self.render_mode != "human":
            return
        for message in self.messages[self._printed :]:
            print(message_text(message), end="\n\n", flush=True)
        self._printed = len(self.messages)

    async def atruncate(self) -> dict[str, Any]:
        """End the episode from outside (its conversation outgrew the model's context).

        Returns the final ``info`` (``final_reward``, ``scores`` ... as a last `astep` would);
        the base class has no final reward and returns ``{}``.
        """
        return {}

    async def aclose(self) -> None:
        """Release per-episode resources (sandboxes, connections); safe to call twice."""

    def close(self) -> None:
        """Sync adapter over `aclose`."""
        self._run_sync(self.aclose())

    def _run_sync(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` to its end on the calling thread's sync-adapter loop.

        Inside a running event loop (a Jupyter cell, code under ``asyncio.run``) that loop
        cannot run on this thread while the running one waits, so it runs on a helper thread
        while this one blocks, as a sync call blocks: a notebook can call ``env.reset()``.
        The env's coroutines run on the same loop either way, so what it made there (locks,
        clients) keeps working. Async code should still await `areset`/`astep`: a sync call
        holds up every other task of the running loop until it returns.
        """
        running = asyncio._get_running_loop()  # None where none runs: no exception to raise
        if running is None:
            return _run_here(_thread_loop(), coro)
        if running in _adapter_loops or (loop := _thread_loop()).is_running():
            coro.close()
            raise ConfigError(
                "Env.reset/step/close called inside another sync env call (from its tool or "
                "reward, or that call was interrupted); await env.areset(...) / env.astep(...) "
                "/ env.aclose() there"
            )
        return _run_beside(loop, coro)


def message_text(message: Message) -> str:
    """``[role]`` (and a tool result's tool name) over the content, then any structured calls."""
    role = str(message.get("role", "?"))
    head = f"[{role} {message['name']}]" if role == "tool" and message.get("name") else f"[{role}]"
    content = str(message.get("content") or "")
    if content and not content.strip():  # else it prints as nothing, and hides what was written
        more = "..." if len(content) > 40 else ""
        content = f"(only whitespace, {len(content)} characters: {content[:40]!r}{more})"
    lines = [head, content]
    for call in message.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, dict) else {}
        lines.append(f"-> {function.get('name')}({function.get('arguments')})")
    return "\n".join(line for line in lines if line)


def _run_here(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    """``loop.run_until_complete(coro)``; interrupted (Ctrl-C), the call is cancelled and ended.

    Why: Ctrl-C raised out of the loop with the call still pending on it, and the env's next
    sync call ran that loop again and so resumed it: an interrupted ``step`` wrote its tool
    result into the next episode, and an interrupted ``reset`` took the sandbox the next
    episode waited for. The cancelled call's cleanup runs before the interrupt is re-raised;
    a second Ctrl-C stops that wait.
    """
    task = loop.create_task(coro)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        loop.run_until_complete(cancel_and_wait([task]))  # its error is the one raised here
        raise


def _run_beside(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on ``loop`` in a helper thread and wait for it; its error is re-raised.

    The call runs in a copy of the caller's context, so context variables set by the caller
    are seen by the env, as on the plain sync path. Interrupted (Ctrl-C in a notebook), the
    call is cancelled and awaited before the interrupt is re-raised. Why: it ran on beside the
    caller, and every later sync call of the env, ``close`` included, was refused while it did
    (forever, for a tool or a lease wait without a timeout), so its sandbox never went back.
    """
    outcome: dict[str, Any] = {}
    task = loop.create_task(coro)  # in a copy of this context; the loop is not running yet
    ended = threading.Event()  # not `join`: an interrupted join forgets the thread (bpo-45274)

    def work() -> None:
        try:
            outcome["value"] = loop.run_until_complete(task)
        except BaseException as exc:  # re-raised in the caller, KeyboardInterrupt included
            outcome["error"] = exc
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, as on the plain path
        finally:
            ended.set()

    helper = threading.Thread(target=work, name="agentgym-sync-env")
    try:  # the start too: the call may reach its await, and the Ctrl-C land, before it returns
        helper.start()
        ended.wait()
    except BaseException:
        loop.call_soon_threadsafe(task.cancel)
        if helper.ident is not None:  # it started (a thread that could not start ends nothing)
            ended.wait()
        raise
    if "error" in outcome:
        raise outcome["error"]
    value: _T = outcome["value"]
    return value


_loops = threading.local()
#: Every loop the sync adapters made: one running means the caller is inside a sync call.
_adapter_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
if hasattr(os, "register_at_fork"):  # a forked child must not run its parent's loops

    def _forget_loops() -> None:
        """Forget the parent's sync-adapter loops; the child's calls make loops of their own.

        Why: a copied loop's default executor counts the parent's threads as idle, so the
        child's ``asyncio.to_thread`` on it waited forever (a fork-mode `AsyncVectorEnv`).
        """
        global _loops
        _loops = threading.local()

    os.register_at_fork(after_in_child=_forget_loops)


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's loop for sync adapters (closed at interpreter exit)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
        _adapter_loops.add(loop)
        atexit.register(_close_unless_running, loop)
    return loop


def _close_unless_running(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop`` at exit, unless a thread left mid-call still runs it.

    Why: `agentgym check` abandons a row's thread whose episode never returns; closing its
    loop then printed "Cannot close a running event loop" as the command exited.
    """
    if not loop.is_running():
        loop.close()
