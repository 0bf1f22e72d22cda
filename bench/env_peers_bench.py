"""Env-loop cost of agentgym against its peers, side by side in one process, on one core.

The scripted calculator episode, as close as each framework allows: reset to the task
"What is 6 * 7?", one assistant turn calling ``multiply(a=6, b=7)``, the tool's answer, one
turn answering "The answer is 42.", and the reward 1.0 for it (every runner checks it got
1.0, so a broken runner fails instead of measuring nothing). No LLM: each framework is driven
by a scripted policy, so what is timed is the env loop alone, reported per step (2 steps an
episode, reset and reward included).

- agentgym ``ToolEnv``: hermes text parsed, arguments validated against the tool's JSON schema,
  the call run under its timeout (async tool on the event loop; sync tool on a worker thread),
  the turn recorded, the rubric run. Timed on the async path (``await env.astep``, what the
  rollout engine uses) and on the sync Gymnasium adapter (``env.step``).
- GEM 0.1.0 ``ToolEnvWrapper`` over a GEM ``Env``: its tools find the call with a regex and run
  it inline (no schema, no timeout).
- skyrl-gym 0.4.0 ``BaseTextEnv`` with a ``ToolGroup``: the env parses with a regex and runs the
  tool inline (no schema, no timeout).
- verifiers 0.3.1 ``ToolEnv``: ``rollout`` + ``rubric.score_rollout`` with a scripted client
  returning already-parsed tool calls (its tools are not validated either).

Then the concurrency figure: N episodes at once whose tool is a sync function sleeping 0.2 s;
ideal wall time is one tool call, 0.2 s. agentgym: one env per episode, ``asyncio.gather``.
GEM: its ``AsyncVectorEnv`` (a thread per env). skyrl-gym (whose env is synchronous, how to
run it concurrently is the caller's choice): each ``step`` on a ``ThreadPoolExecutor`` with a
thread per env, as GEM has. verifiers: ``asyncio.gather`` of rollouts (its sync tools run on
the event loop, so they queue; at most 8 rollouts there). Every side's envs are built before
the timer starts.

The peers are not agentgym dependencies; install them (and agentgym) into a separate venv::

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install -e . gem-llm==0.1.0 skyrl-gym==0.4.0 verifiers==0.3.1
    /tmp/peers-venv/bin/python bench/env_peers_bench.py

(``--install-peers`` prints these commands). The run's first line names the versions of
agentgym and of each peer it found installed, so another version is never timed under the
pinned one's name. Peers that are not installed are skipped, named in the output, and
agentgym runs alone. Timings are noisy on a shared machine: every runner is
timed in each repeat, interleaved, and the best repeat is reported, as wall-clock time and as
CPU time of the whole process (worker threads included). CPU time is the steadier figure when
other processes share the core; the goal line compares it. Ratios are to the fastest unseeded
peer. "seeded" rows reset with a new seed per episode, as the rollout engine does (GEM then
reseeds Python's and NumPy's global generators).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Any

import agentgym

PROMPT = "What is 6 * 7?"
ANSWER = "42"
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
FINAL = "The answer is 42."
PEERS = {"gem": "gem-llm==0.1.0", "skyrl_gym": "skyrl-gym==0.4.0", "verifiers": "verifiers==0.3.1"}
INSTALL = (
    "python3 -m venv /tmp/peers-venv\n"
    f"/tmp/peers-venv/bin/pip install -e . {' '.join(PEERS.values())}\n"
    "/tmp/peers-venv/bin/python bench/env_peers_bench.py"
)
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

#: Seconds of wall-clock time and of CPU time (all of the process's threads).
Timing = tuple[float, float]
#: A runner plays ``episodes`` episodes and returns how long it took.
Runner = Callable[[int], Timing]
#: Plays N episodes at once with a sync tool sleeping S seconds; returns the wall seconds.
Together = Callable[[int, float], float]


def _now() -> Timing:
    return time.perf_counter(), time.process_time()


def _since(start: Timing) -> Timing:
    wall, cpu = _now()
    return wall - start[0], cpu - start[1]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


async def amultiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def correct(completion: str, answer: str) -> float:
    """1.0 when the final answer contains the reference answer."""
    return float(answer in completion)


def _expect(reward: float, who: str) -> None:
    if reward != 1.0:
        raise RuntimeError(f"{who}: the scripted episode scored {reward}, not 1.0")


# ---- agentgym --------------------------------------------------------------------------------


def slow_multiply(seconds: float) -> Callable[[int, int], int]:
    """A sync ``multiply`` tool that sleeps ``seconds`` first (the concurrency figure's)."""

    def multiply(a: int, b: int) -> int:
        """Multiply two integers, slowly.

        Args:
            a: the first factor.
            b: the second factor.
        """
        time.sleep(seconds)
        return a * b

    return multiply


def agentgym_env(tool: Callable[..., Any], seconds: float = 0.0) -> agentgym.ToolEnv:
    """The calculator env; ``seconds`` > 0 makes the (sync) tool sleep that long."""
    if seconds:
        tool = agentgym.tool(slow_multiply(seconds))
    return agentgym.ToolEnv(
        [tool],
        tasks=[{"prompt": PROMPT, "answer": ANSWER}],
        rubric=agentgym.Rubric([correct]),
        system_prompt="",
    )


async def agentgym_episode(env: agentgym.ToolEnv, seed: int | None) -> None:
    await env.areset(seed=seed, options={"task": 0})
    await env.astep(CALL)
    _, reward, terminated, _, _ = await env.astep(FINAL)
    if not terminated:
        raise RuntimeError("agentgym: the episode did not end on the answer")
    _expect(reward, "agentgym")


def agentgym_async(tool: Callable[..., Any], seeded: bool = False) -> Runner:
    """Episodes on the async path (``await env.astep``), one event loop for the whole run."""
    env = agentgym_env(tool)

    async def play(episodes: int) -> Timing:
        start = _now()
        for i in range(episodes):
            await agentgym_episode(env, i if seeded else None)
        return _since(start)

    return lambda episodes: asyncio.run(play(episodes))


def agentgym_sync(tool: Callable[..., Any]) -> Runner:
    """Episodes on the sync Gymnasium adapter (``env.reset`` / ``env.step``)."""
    env = agentgym_env(tool)

    def play(episodes: int) -> Timing:
        start = _now()
        for _ in range(episodes):
            env.reset(options={"task": 0})
            env.step(CALL)
            _expect(env.step(FINAL)[1], "agentgym sync")
        return _since(start)

    return play


# ---- GEM -------------------------------------------------------------------------------------


def gem_classes(seconds: float = 0.0) -> tuple[Any, Any]:
    """GEM's calculator task env and its multiply tool (a regex finds the call)."""
    from gem.core import Env as GemEnv
    from gem.tools.base_tool import BaseTool

    class CalcTask(GemEnv):
        def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            super().reset(seed)
            return PROMPT, {}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", correct(action, ANSWER), True, False, {}

    class MultiplyTool(BaseTool):
        tool_type = name = "multiply"

        def instruction_string(self) -> str:
            return 'Call <tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}</tool_call>'

        def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
            found = _HERMES.search(action)
            if not found:
                return False, True, "", action
            try:
                call = json.loads(found.group(1))
                if call["name"] != "multiply":
                    raise ValueError(f"unknown tool {call['name']!r}")
                if seconds:
                    time.sleep(seconds)
                result = multiply(**call["arguments"])
            except Exception as exc:
                return True, True, f"Error: {exc}", action[: found.end()]
            return True, False, str(result), action[: found.end()]

    return CalcTask, MultiplyTool


def gem_runner(seeded: bool = False) -> Runner:
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    task_cls, tool_cls = gem_classes()
    env = ToolEnvWrapper(task_cls(), tools=[tool_cls()])

    def play(episodes: int) -> Timing:
        start = _now()
        for i in range(episodes):
            env.reset(seed=i if seeded else None)
            env.step(CALL)
            _, reward, terminated, _, _ = env.step(FINAL)
            if not terminated:
                raise RuntimeError("GEM: the episode did not end on the answer")
            _expect(reward, "GEM")
        return _since(start)

    return play


# ---- skyrl-gym -------------------------------------------------------------------------------


def skyrl_env_class(seconds: float = 0.0) -> Any:
    """skyrl-gym's calculator env: a ``BaseTextEnv`` with a one-tool ``ToolGroup``."""
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
    from skyrl_gym.tools.core import ToolGroup
    from skyrl_gym.tools.core import tool as skyrl_tool

    class CalcTools(ToolGroup):
        def __init__(self) -> None:
            super().__init__(name="calc")

        @skyrl_tool
        def multiply(self, a: int, b: int) -> int:
            if seconds:
                time.sleep(seconds)
            return multiply(a, b)

    class CalcEnv(BaseTextEnv):
        def __init__(self) -> None:
            super().__init__()
            self.max_turns = 4
            self.init_tool_groups([CalcTools()])
            self.chat_history: list[dict[str, str]] = []

        def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
            self.turns = 0
            self.chat_history = list(prompt)
            return prompt, {}

        def step(self, action: str) -> Any:
            self.turns += 1
            self.chat_history.append({"role": "assistant", "content": action})
            found = _HERMES.search(action)
            if found is None:  # the final answer
                return BaseTextEnvStepOutput(
                    observations=[], reward=correct(action, ANSWER), done=True, metadata={}
                )
            try:
                call = json.loads(found.group(1))
                args = call["arguments"]
                observation = self._execute_tool("calc", call["name"], [args["a"], args["b"]])
            except Exception as exc:
                observation = f"Error: {exc}"
            new_obs = {"role": "user", "content": str(observation)}
            self.chat_history.append(new_obs)
            return BaseTextEnvStepOutput(
                observations=[new_obs], reward=0.0, done=self.turns >= self.max_turns,
                metadata={"tool_name": call.get("name")},
            )  # fmt: skip

    return CalcEnv


def skyrl_runner() -> Runner:
    env = skyrl_env_class()()
    prompt = [{"role": "user", "content": PROMPT}]

    def play(episodes: int) -> Timing:
        start = _now()
        for _ in range(episodes):
            env.init(prompt)
            env.step(CALL)
            out = env.step(FINAL)
            if not out["done"]:
                raise RuntimeError("skyrl-gym: the episode did not end on the answer")
            _expect(out["reward"], "skyrl-gym")
        return _since(start)

    return play


# ---- verifiers -------------------------------------------------------------------------------


def verifiers_env(tool: Callable[..., Any]) -> tuple[Any, Any]:
    """verifiers' ``ToolEnv`` and a client that plays the two scripted turns."""
    import verifiers as vf
    from datasets import Dataset
    from verifiers.types import Response, ResponseMessage, ToolCall

    call = ToolCall(id="call_0", name="multiply", arguments='{"a": 6, "b": 7}')
    turns = [
        Response(id="r0", created=0, model="scripted", message=ResponseMessage(
            content="", tool_calls=[call], finish_reason="tool_calls", is_truncated=False)),
        Response(id="r1", created=0, model="scripted", message=ResponseMessage(
            content=FINAL, finish_reason="stop", is_truncated=False)),
    ]  # fmt: skip

    class ScriptedClient(vf.Client):
        """Answers turn k of an episode with the k-th scripted response."""

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
            return messages, {}

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(self, prompt: Any, model: str, sampling_args: Any,
                               tools: Any = None, **kwargs: Any) -> Any:  # fmt: skip
            return turns[len(kwargs["state"]["trajectory"])]

    def vf_correct(completion: Any, answer: str) -> float:
        return correct(completion[-1].content or "", answer)

    dataset = Dataset.from_list([{"question": PROMPT, "answer": ANSWER}])
    env = vf.ToolEnv(tools=[tool], dataset=dataset, rubric=vf.Rubric(funcs=[vf_correct]))
    return env, ScriptedClient(None)


VF_INPUT = {"prompt": [{"role": "user", "content": PROMPT}], "example_id": 0, "answer": ANSWER}


async def verifiers_episode(env: Any, client: Any) -> None:
    state = await env.rollout(VF_INPUT, client, "scripted", {})
    await env.rubric.score_rollout(state)
    if state["error"] is not None:
        raise RuntimeError(f"verifiers: the episode failed: {state['error']!r}")
    _expect(state["reward"], "verifiers")


def verifiers_runner() -> Runner:
    env, client = verifiers_env(amultiply)

    async def play(episodes: int) -> Timing:
        start = _now()
        for _ in range(episodes):
            await verifiers_episode(env, client)
        return _since(start)

    return lambda episodes: asyncio.run(play(episodes))


# ---- concurrency: N episodes whose sync tool sleeps ------------------------------------------


def concurrent_agentgym(n: int, seconds: float) -> float:
    envs = [agentgym_env(multiply, seconds) for _ in range(n)]

    async def play() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(agentgym_episode(env, None) for env in envs))
        return time.perf_counter() - start

    return asyncio.run(play())


def concurrent_gem(n: int, seconds: float) -> float:
    from gem.tools.tool_env_wrapper import ToolEnvWrapper
    from gem.vector.async_vector_env import AsyncVectorEnv

    task_cls, tool_cls = gem_classes(seconds)
    envs = AsyncVectorEnv(
        ["calc"] * n, [lambda: ToolEnvWrapper(task_cls(), tools=[tool_cls()])] * n
    )
    start = time.perf_counter()
    envs.reset()
    envs.step([CALL] * n)
    _, rewards, terminated, _, _ = envs.step([FINAL] * n)
    elapsed = time.perf_counter() - start
    envs.thread_pool_executer.shutdown()
    if not (all(terminated) and all(rewards == 1.0)):
        raise RuntimeError("GEM: the concurrent episodes did not all score 1.0")
    return elapsed


def concurrent_skyrl(n: int, seconds: float) -> float:
    """skyrl-gym's env is synchronous: its steps run on a thread per env, as GEM's do.

    The envs are built before the timer starts (as every other side's are), and the executor
    has ``n`` threads: on the loop's default executor (``min(32, cores + 4)`` threads, 6 on a
    2-core machine) the steps would queue, and the figure would time that executor instead.
    """
    env_cls = skyrl_env_class(seconds)
    prompt = [{"role": "user", "content": PROMPT}]
    envs = [env_cls() for _ in range(n)]

    async def episode(pool: ThreadPoolExecutor, env: Any) -> None:
        loop = asyncio.get_running_loop()
        env.init(prompt)
        await loop.run_in_executor(pool, env.step, CALL)
        _expect((await loop.run_in_executor(pool, env.step, FINAL))["reward"], "skyrl-gym")

    async def play() -> float:
        with ThreadPoolExecutor(max_workers=n) as pool:
            start = time.perf_counter()
            await asyncio.gather(*(episode(pool, env) for env in envs))
            return time.perf_counter() - start

    return asyncio.run(play())


def concurrent_verifiers(n: int, seconds: float) -> float:
    env, client = verifiers_env(slow_multiply(seconds))

    async def play() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(verifiers_episode(env, client) for _ in range(n)))
        return time.perf_counter() - start

    return asyncio.run(play())


# ---- the run ---------------------------------------------------------------------------------


def installed_peers() -> tuple[dict[str, Runner], dict[str, Together], list[str]]:
    """The peers' runners that can be built here, and the peers skipped (with the reason)."""
    runners: dict[str, Runner] = {}
    concurrent: dict[str, Together] = {}
    skipped: list[str] = []
    peers: list[tuple[str, dict[str, Callable[[], Runner]], Together]] = [
        ("gem", {"GEM ToolEnvWrapper": gem_runner,
                 "GEM ToolEnvWrapper, seeded": lambda: gem_runner(seeded=True)}, concurrent_gem),
        ("skyrl_gym", {"skyrl-gym BaseTextEnv": skyrl_runner}, concurrent_skyrl),
        ("verifiers", {"verifiers ToolEnv": verifiers_runner}, concurrent_verifiers),
    ]  # fmt: skip
    for module, builds, together in peers:
        try:
            runners |= {label: build() for label, build in builds.items()}
            concurrent[next(iter(builds))] = together
        except ImportError as exc:
            skipped.append(f"{PEERS[module]} ({exc})")
    return runners, concurrent, skipped


def versions() -> str:
    """The installed versions of agentgym and of each peer, as the run's header prints them.

    The docs name the versions they were measured with (``PEERS``); this says which ones were
    really timed, so another installed version is never reported under the pinned name.
    """
    found = []
    for dist in ["agentgym", *(pin.split("==")[0] for pin in PEERS.values())]:
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return "; ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per runner (best kept)")
    parser.add_argument("--concurrent", type=int, default=64, help="episodes run at once")
    parser.add_argument("--tool-seconds", type=float, default=0.2, help="sleep of the slow tool")
    parser.add_argument("--install-peers", action="store_true", help="print how to install")
    args = parser.parse_args()
    if args.install_peers:
        print(INSTALL)
        return
    async_tool = agentgym.tool(name="multiply")(amultiply)
    runners: dict[str, Runner] = {
        "agentgym async tool": agentgym_async(async_tool),
        "agentgym sync tool": agentgym_async(agentgym.tool(multiply)),
        "agentgym async tool, env.step": agentgym_sync(async_tool),
        "agentgym async tool, seeded": agentgym_async(async_tool, seeded=True),
    }
    peer_runners, concurrent, skipped = installed_peers()
    print(f"versions: {versions()}")
    runners |= peer_runners
    times = per_step_times(runners, args.episodes, args.repeats)
    print_table(times, [name for name in peer_runners if "seeded" not in name], args)
    print_concurrency(concurrent, args)
    if skipped:
        print("\nskipped (not installed): " + "; ".join(skipped))
        print("install them with:\n" + INSTALL)


def per_step_times(runners: dict[str, Runner], episodes: int, repeats: int) -> dict[str, Timing]:
    """Each runner's best wall and CPU seconds per step, pinned to one core, interleaved.

    The best of the repeats is the run least disturbed by the machine's other work; the
    runners take turns within each repeat, so every one sees the same load.
    """
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if cores:
        os.sched_setaffinity(0, {min(cores)})
    try:
        for run in runners.values():
            run(max(episodes // 10, 20))  # warm imports, caches and worker threads
        samples: dict[str, list[Timing]] = {name: [] for name in runners}
        for _ in range(repeats):
            for name, run in runners.items():
                wall, cpu = run(episodes)
                samples[name].append((wall / (2 * episodes), cpu / (2 * episodes)))
    finally:
        if cores:
            os.sched_setaffinity(0, cores)
    return {name: (min(w for w, _ in s), min(c for _, c in s)) for name, s in samples.items()}


def print_table(times: dict[str, Timing], peers: list[str], args: Any) -> None:
    """The table: wall and CPU ms per step, and each as a multiple of the fastest peer's."""
    print(
        f"scripted calculator episode (reset, tool call, answer, reward), one core, "
        f"{args.episodes} episodes x {args.repeats} repeats, best; python {sys.version.split()[0]}"
    )
    best = (min((times[p][0] for p in peers), default=0.0), min((times[p][1] for p in peers),
                                                                default=0.0))  # fmt: skip
    print(f"  {'runner':32s} {'wall ms/step':>12s} {'CPU ms/step':>12s}"
          + ("   x fastest peer (wall, CPU)" if peers else ""))  # fmt: skip
    for name, (wall, cpu) in times.items():
        ratio = f"   {wall / best[0]:6.2f}x {cpu / best[1]:6.2f}x" if peers else ""
        print(f"  {name:32s} {wall * 1e3:12.4f} {cpu * 1e3:12.4f}{ratio}")
    if peers:
        ours = times["agentgym async tool"][1]
        verdict = "met" if ours <= best[1] else f"NOT met ({ours / best[1]:.1f}x)"
        print(f"goal, agentgym async tool's CPU time <= the fastest peer's: {verdict}")


def print_concurrency(concurrent: dict[str, Together], args: Any) -> None:
    """Wall time of ``--concurrent`` episodes at once, each calling a slow sync tool."""
    n, seconds = args.concurrent, args.tool_seconds
    print(
        f"\n{n} episodes at once, sync tool sleeping {seconds:g} s (ideal {seconds:g} s), best of 3"
    )
    runs: dict[str, Together] = {"agentgym ToolEnv": concurrent_agentgym}
    runs |= concurrent
    threads = {"agentgym": "a worker per env", "GEM": "its AsyncVectorEnv's, one per env",
               "skyrl-gym": "a ThreadPoolExecutor of one per env",
               "verifiers": "none, on its event loop"}  # fmt: skip
    print("  (threads: " + "; ".join(f"{who} {how}" for who, how in threads.items()
                                     if any(name.startswith(who) for name in runs)) + ")")
    for name, together in runs.items():
        count = min(n, 8) if name.startswith("verifiers") else n  # its tools queue on the loop
        repeats = 1 if name.startswith("verifiers") else 3
        wall = min(together(count, seconds) for _ in range(repeats))
        note = f"  ({count} episodes: its sync tools run on the event loop)" if count != n else ""
        print(f"  {name:34s} {wall:6.3f} s{note}")


if __name__ == "__main__":
    main()
