"""Rubric: weighted reward functions that ask for what they need by argument name.

A reward function declares parameters from `Rubric.INJECTABLE` (``task``, ``messages``,
``completion``, ``answer``, ``state``, ``sandbox``, ``env``, ``trajectory``) and gets exactly
those (in a `ToolEnv`, ``completion`` is the final reply without its ``<think>`` reasoning,
see `without_reasoning`; ``messages`` keep the raw text); one with ``**kwargs`` gets all of
them. Any other parameter must have a default, which it keeps (so a `functools.partial` with
bound keywords, or a knob like ``threshold=0.5``, works). Every function's score is logged
under its name (its ``__name__``, or one given in ``names``); names must be unique, so no
score silently overwrites another. Weight-0 functions are metrics only.

A function that raises, or returns something that is not a number within ±`MAX_ABS_REWARD`
(None, NaN, inf, 1e300, text such as "1.0"), is *recorded* (its score is None and the rubric
reports the error): silently scoring 0 would corrupt the training signal, and a NaN would
turn every advantage of its group into NaN. An
`InfraError` (a sandbox or backend failure) propagates instead, so the episode becomes
``infra_error`` and is not scored at all.

A sync function runs on the event loop, where every other episode waits for it: right for a
comparison of strings (microseconds; a thread costs about 80 us), wrong for a judge called
through a blocking HTTP client or a subprocess. Those go on worker threads (``threaded``),
under an optional ``timeout``, and one that holds the loop for `BLOCKING_REWARD_SECONDS` or
more (in two of its last `LOOP_WINDOW` calls at least, and in half of them) is named in a
warning, once, with that fix. The same ``timeout`` bounds each async
function: a judge that never answers would otherwise hold its episode, and the rollout or
evaluation waiting on it, forever.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import resource
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._errors import ConfigError, InfraError, ToolTimeoutError
from ._tool_calls import (
    call_failure,
    cancel_and_wait,
    cancellations,
    describe_failure,
    original,
    run_coroutine,
    run_in_thread,
)
from ._trajectory import MAX_ABS_REWARD
from ._warn_once import warn_once

log = logging.getLogger(__name__)

#: A sync reward function call that holds the event loop this long is named. Lower than a
#: tool's `BLOCKING_STEP_SECONDS` (0.1 s): it runs once for every episode, so a judge of
#: 50 ms under 64 episodes at once held the loop 3.2 s a step, 50 ms at a time; a reward
#: that compares strings takes microseconds.
BLOCKING_REWARD_SECONDS = 0.02
#: How many recent calls of a function on the loop `_holds_the_loop` judges.
LOOP_WINDOW = 8
#: `resource.getrusage`'s per-thread counts (Linux); None elsewhere: there the wall time alone.
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
#: The kills of abandoned threaded calls under way: held, so none is collected mid-run.
_kills: set[asyncio.Future[None]] = set()


@dataclass
class RubricResult:
    """Weighted total, per-function scores, and the errors of functions that raised."""

    reward: float
    scores: dict[str, float | None]
    errors: dict[str, str] = field(default_factory=dict)


class Rubric:
    """A weighted sum of reward functions (sync or async).

    Args:
        funcs: the reward functions.
        weights: one per function; None weighs each 1.0. Weight 0 logs without rewarding.
        names: one per function, the keys of its score; None uses each ``__name__``
            (a `functools.partial` has none, and lambdas all share ``<lambda>``: name those).
        threaded: the sync functions (by name; True: all of them) that run on a worker
            thread, so the episodes beside theirs go on while they wait (a judge over HTTP
            with a blocking client, a subprocess); an episode's threaded functions start
            together. The rest run on the event loop, in order.
        timeout: seconds a threaded or async function may take; past it the call counts as
            raised (its score None, the episode ``error`` and scored, not ``infra_error``:
            the model's reply can make a judge slow). An async function is cancelled where it
            waits; a thread is abandoned (it cannot be killed). None: no limit.

    Example:
        >>> rubric = Rubric([lambda completion: 1.0], names=["always_one"])
        >>> rubric.names
        ['always_one']
    """

    INJECTABLE = frozenset(
        {"task", "messages", "completion", "answer", "state", "sandbox", "env", "trajectory"}
    )

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]] = (),
        weights: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
        *,
        threaded: bool | Collection[str] = False,
        timeout: float | None = None,
    ) -> None:
        if callable(funcs):  # Rubric(fn): "'function' object is not iterable"
            raise ConfigError("Rubric takes a list of reward functions: Rubric([fn])")
        self.funcs = list(funcs)
        self.weights = [1.0] * len(self.funcs) if weights is None else _checked_weights(weights)
        #: The keys of the scores, one per function, in order.
        self.names = [_name_of(fn) for fn in self.funcs] if names is None else list(names)
        for what, values in (("weights", self.weights), ("names", self.names)):
            if len(values) != len(self.funcs):
                raise ConfigError(
                    f"Rubric got {len(self.funcs)} functions but {len(values)} {what}; "
                    "give one each"
                )
        _check_unique(self.names)
        self._params = [self._injected(name, fn) for name, fn in zip(self.names, self.funcs)]
        #: Per function, the injectable parameters it asks for without a default.
        self._required = [_required(fn, self.INJECTABLE) for fn in self.funcs]
        self._threaded = self._checked_threaded(threaded)
        self._any_threaded = any(self._threaded)
        self._async = [_is_async(fn) for fn in self.funcs]
        self.timeout = _checked_timeout(timeout, self._any_threaded or any(self._async))
        #: Per function run on the loop: whether each of its recent calls held the loop itself.
        self._loop_window: list[deque[bool]] = [deque(maxlen=LOOP_WINDOW) for _ in self.funcs]

    def _checked_threaded(self, threaded: bool | Collection[str]) -> list[bool]:
        """Per function, whether it runs on a thread; names that are not sync functions refused."""
        sync = [name for name, fn in zip(self.names, self.funcs) if not _is_async(fn)]
        if isinstance(threaded, bool):
            chosen = set(sync) if threaded else set()
        else:
            chosen = {threaded} if isinstance(threaded, str) else set(threaded)
            wrong = sorted(chosen - set(sync))
            if wrong:
                raise ConfigError(
                    f"Rubric threaded names {wrong}, which are not its sync functions "
                    f"({sorted(sync)}); an async one waits without holding the event loop already"
                )
        return [name in chosen for name in self.names]

    def asking_for(self, name: str) -> list[str]:
        """The names of the functions that ask for ``name`` without a default value.

        Why: a task without the field (``answer``) gives them None, and each of their
        episodes ends ``error``; a trainer refuses such tasks before it trains on them.
        """
        return [n for n, required in zip(self.names, self._required) if name in required]

    def _injected(self, name: str, fn: Callable[..., Any]) -> tuple[str, ...]:
        """The context values ``fn`` asks for: its injectable parameters, or all with **kwargs."""
        signature = inspect.signature(fn).parameters.values()
        positional = [p.name for p in signature if p.kind is p.POSITIONAL_ONLY]
        if positional or _is_generator(fn):  # each failed every episode, scored None
            why = (f"takes {positional} positionally only, and rewards are passed by name"
                   if positional else "is a generator: it must return a number")  # fmt: skip
            raise ConfigError(f"reward function {name!r} {why}")
        params = tuple(p.name for p in signature if p.name in self.INJECTABLE)
        unknown = [
            p.name for p in signature
            if p.name not in params and p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]  # fmt: skip
        if unknown:
            trl = {"completions", "prompts"} & set(unknown)
            raise ConfigError(
                f"reward function {name!r} asks for {unknown}; "
                f"it may ask only for {sorted(self.INJECTABLE)} (others need a default)"
                + ("; a TRL reward function (lists in, a list out) needs wrapping: "
                   "docs/trainer.md, Coming from TRL" if trl else "")
            )
        if any(p.kind is p.VAR_KEYWORD for p in signature):
            return tuple(sorted(self.INJECTABLE))
        return params

    async def score(self, context: Mapping[str, Any]) -> RubricResult:
        """Run every function with the arguments it asked for from ``context``.

        The threaded ones start first, side by side (two judges of an episode wait together,
        not one after the other); the rest then run in order, and the scores are read in order.
        """
        scores: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        total = 0.0
        pending = cancellations()
        started = self._start_threaded(context) if self._any_threaded else {}
        every = enumerate(zip(
            self.names, self.funcs, self.weights, self._params, self._threaded, self._async
        ))  # fmt: skip
        try:
            for i, (name, fn, weight, params, threaded, is_async) in every:
                try:
                    if threaded:
                        value = await started[name]
                    elif is_async:
                        kwargs = {p: context.get(p) for p in params}
                        value = await run_coroutine(fn, kwargs, name, self.timeout)
                    else:
                        began, own = time.monotonic(), _own_time()
                        value = fn(**{p: context.get(p) for p in params})
                        took = time.monotonic() - began
                        held = took >= BLOCKING_REWARD_SECONDS and not inspect.isawaitable(value) \
                            and _held_by_itself(own, _own_time())  # fmt: skip
                        self._loop_window[i].append(held)
                        if held and _holds_the_loop(self._loop_window[i]):
                            _warn_blocking(name, fn, took)
                        if type(value) is not float and inspect.isawaitable(value):
                            value = await value
                    value = _finite(value)
                except InfraError:
                    raise  # the sandbox/backend failed: the episode is infra_error, not scored
                except BaseException as exc:
                    failure = call_failure(exc, pending)
                    if failure is None:  # Ctrl-C, or the episode's cancellation
                        raise
                    scores[name] = None
                    errors[name] = "".join(traceback.format_exception(original(failure)))
                    warn_once(  # Gymnasium's step returns a number whatever happens: say it once
                        log, "reward", _said_once_key(name, fn),
                        "reward function %r raised %s; its episodes are 'error', its score "
                        "None, and they count with the reward the other functions gave (full "
                        "traceback in info['reward_errors'] and Trajectory.error; said once)",
                        name, describe_failure(failure),
                    )  # fmt: skip
                    continue
                scores[name] = value
                total += weight * value
        finally:  # an InfraError or a cancellation: the judges still waiting are let go
            if started:
                await cancel_and_wait(started.values())
        return RubricResult(reward=total, scores=scores, errors=errors)

    def _start_threaded(self, context: Mapping[str, Any]) -> dict[str, asyncio.Future[Any]]:
        """The threaded functions' calls, started at once, by name."""
        every = zip(self.names, self.funcs, self._params, self._threaded)
        return {
            name: asyncio.ensure_future(
                _run_threaded(fn, {p: context.get(p) for p in params}, name, self.timeout)
            )
            for name, fn, params, threaded in every if threaded
        }


async def _run_threaded(
    fn: Callable[..., Any], kwargs: dict[str, Any], name: str, timeout: float | None
) -> Any:
    """`run_in_thread`; once nobody waits for it (cancelled, timed out) its sandbox call dies.

    Why: the thread cannot be stopped, and one running ``verify(sandbox=pool)`` for a
    cancelled episode held its lease until the sandbox call ended on its own (35 s by
    default) while other episodes waited for a sandbox. The call's code is killed through
    the sandboxes' `CallToken` (as a cancelled ``arun`` is), the lease then returns, and that
    ``verify`` raises instead of scoring. Without the sandboxes loaded, nothing to link.
    The kill runs on a worker thread, not awaited: a `DockerSandbox`'s is a call to the
    daemon (up to the client timeout, 60 s, against a remote host that stopped answering),
    which on the loop froze every episode.
    """
    protocol = sys.modules.get("agentgym.sandboxes._protocol")
    if protocol is None:
        return await run_in_thread(fn, kwargs, name, timeout)
    token = protocol.CallToken()
    try:
        return await run_in_thread(protocol.linked_to(token, fn), kwargs, name, timeout)
    except (asyncio.CancelledError, ToolTimeoutError):  # nobody waits for the call any more
        kill = asyncio.get_running_loop().run_in_executor(None, token.cancel)
        _kills.add(kill)
        kill.add_done_callback(_kills.discard)
        raise


def _checked_timeout(timeout: float | None, any_waits: bool) -> float | None:
    if timeout is None:
        return None
    if not _finite_number(timeout) or timeout <= 0:
        raise ConfigError(f"Rubric timeout must be a number of seconds > 0, got {timeout!r}")
    if not any_waits:
        raise ConfigError(
            "Rubric timeout applies to async functions and to sync ones run on threads, and "
            "this rubric has neither: give threaded=True or their names (a sync function on "
            "the event loop cannot be interrupted)"
        )
    return float(timeout)


def _finite_number(value: object) -> bool:
    """A real number that is not a bool, NaN or infinite (a weight, a timeout)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a coroutine function, or an object whose ``__call__`` is one.

    Looked for under `functools.wraps` decorators too (a logging or retry wrapper).
    """
    call = getattr(fn, "__call__", None)  # noqa: B004 (a callable object's own method)
    return inspect.iscoroutinefunction(inspect.unwrap(fn)) or inspect.iscoroutinefunction(call)


def _is_generator(fn: Callable[..., Any]) -> bool:
    inner = inspect.unwrap(fn)
    return inspect.isgeneratorfunction(inner) or inspect.isasyncgenfunction(inner)


def _said_once_key(name: str, fn: Callable[..., Any]) -> str:
    """One function's key for `warn_once`: the same function in every env instance."""
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', name)}"


def _own_time() -> tuple[float, int | None]:
    """The calling thread's CPU seconds and voluntary waits so far (None where not counted).

    One system call where the thread's usage is counted: its user and system time add up to
    its CPU time (`time.thread_time`, a second call, read it too), and every sync reward call
    on the loop pays for this.
    """
    if _RUSAGE_THREAD is None:
        return time.thread_time(), None
    usage = resource.getrusage(_RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw


def _held_by_itself(before: tuple[float, int | None], after: tuple[float, int | None]) -> bool:
    """Whether a call that held the loop did so itself: it used the CPU, or it waited.

    A wait (I/O, a sleep, a lock) is what a thread would have taken off the loop. Why: on a
    loaded machine the scheduler set aside a call of microseconds (the quickstart's own
    ``correct_answer``) for 0.44 s, and the warning told the user to put it on a thread,
    which would not have helped.
    """
    (cpu_before, waits_before), (cpu_after, waits_after) = before, after
    if waits_before is None or waits_after is None or waits_after > waits_before:
        return True
    return cpu_after - cpu_before >= BLOCKING_REWARD_SECONDS


def _holds_the_loop(window: Collection[bool]) -> bool:
    """Whether a function held the loop in enough of its recent calls to be named: two, half.

    ``window``: whether each of its last `LOOP_WINDOW` calls held it. Why recent calls: over
    the process's life, a judge that began to block after 10,000 fast calls was never named.
    Why not one: a first call that imports or compiles something, or a call whose thread
    waited for the GIL while another thread ran (a voluntary wait, as a sleep is), held it
    once; the quickstart's own ``correct_answer`` was named so on a loaded machine. A judge
    that blocks holds it in every call.
    """
    holds = sum(window)
    return holds >= 2 and 2 * holds >= len(window)


def _warn_blocking(name: str, fn: Callable[..., Any], seconds: float) -> None:
    """Name a sync function that held the event loop long enough to stall other episodes."""
    warn_once(
        log, "reward-blocked", _said_once_key(name, fn),
        "reward function %r held the event loop for %.3f s: every other episode waited for "
        "it; run it on a thread (Rubric(..., threaded=[%r])) or make it `async def` "
        "(said once)", name, seconds, name,
    )  # fmt: skip


def _required(fn: Callable[..., Any], injectable: frozenset[str]) -> frozenset[str]:
    """The injectable parameters ``fn`` declares without a default (not through **kwargs)."""
    return frozenset(
        p.name for p in inspect.signature(fn).parameters.values()
        if p.name in injectable and p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )  # fmt: skip


def _finite(value: Any) -> float:
    """``value`` as a reward; anything but a number within `MAX_ABS_REWARD` raises.

    Raising is recording: the function's score is None and its episode ``error``. Text is
    refused, not read: a function returning text it took from the reply
    (``completion.strip()``) let the model write its own reward ("1e300").
    """
    if isinstance(value, (str, bytes, bytearray)):
        kind = type(value).__name__
        raise TypeError(f"returned {kind} {value[:40]!r}: a reward must be a number")
    reward = float(value)
    if not abs(reward) <= MAX_ABS_REWARD:  # NaN fails too
        raise ValueError(
            f"returned {reward}: a reward must be a finite number within ±{MAX_ABS_REWARD:g}"
        )
    return reward


def _checked_weights(weights: Sequence[float]) -> list[float]:
    for i, weight in enumerate(weights):
        if not _finite_number(weight):
            raise ConfigError(f"Rubric weights must be finite numbers; weight {i} is {weight!r}")
    return [float(w) for w in weights]


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        raise ConfigError(
            f"reward function {fn!r} has no __name__ to log its score under; "
            "name every function: Rubric(funcs, names=[...])"
        )
    return name


def _check_unique(names: list[str]) -> None:
    """Scores are keyed by name: a duplicate would silently drop one function's score."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"reward functions share the name(s) {duplicates}; scores are logged by name, so "
            "each needs its own: rename them or pass Rubric(funcs, names=[...])"
        )
