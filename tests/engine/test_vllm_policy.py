"""VLLMPolicy on the real vLLM CPU build with the tiny local model (no download).

One engine serves the whole module (starting one takes 20-90 s on two cores).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.engine import HFPolicy, SamplingConfig, VLLMPolicy, _cpu_lora, _engine_spin
from tests.conftest import require
from tests.engine.conftest import child_pids, kill_engine
from tests.engine.episodes import NudgeEnv, letters_only, make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Any:
    require("vllm")
    with VLLMPolicy(
        tiny_model_dir,
        sampling=SamplingConfig(temperature=1.0, max_tokens=12, seed=0),
        dtype="float32",
        max_model_len=2048,
        enable_lora=True,
        max_lora_rank=8,
    ) as p:
        yield p
        start = time.monotonic()
        p.close()
    # vLLM kills an engine core still there 5 s after close() asked it to stop; before its
    # processes skipped their last garbage collection, every close took those 5 s
    assert time.monotonic() - start < 4.0, "the engine's processes did not exit on their own"


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(tiny_model_dir, dtype="float32")


def test_three_turn_episode_is_token_exact(policy: VLLMPolicy) -> None:
    letters = policy.with_sampling(extra=letters_only(policy))  # a view: the engine is shared
    [trajectory] = agentgym.rollout(NudgeEnv, letters, tasks=[{"id": 1}])
    assert trajectory.status == "truncated", trajectory.error
    assert trajectory.mode == "concat"
    assert len(trajectory.turns) == 3
    for before, after in zip(trajectory.turns, trajectory.turns[1:]):
        sampled = before.prompt_ids + before.completion_ids
        assert after.prompt_ids[: len(sampled)] == sampled  # the next prompt extends them exactly
    tok = policy.tokenizer
    for turn in trajectory.turns:  # the text the env read is the text of the sampled ids
        assert tok.decode(turn.completion_ids, skip_special_tokens=True) == turn.text
    ids, mask, _ = trajectory.flatten()
    last_assistant = max(i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant")
    fresh = tok.apply_chat_template(trajectory.messages[: last_assistant + 1], tokenize=False)
    fresh_ids = tok.encode(fresh, add_special_tokens=False)
    assert fresh_ids[: len(ids)] == ids  # flatten() == a fresh tokenization of the conversation
    assert tok.decode(fresh_ids[len(ids) :]) in ("\n", "<|im_end|>\n")
    assert sum(mask) == sum(len(t.completion_ids) for t in trajectory.turns)


def test_a_stop_string_ending_inside_a_token_keeps_text_and_ids_alike(policy: VLLMPolicy) -> None:
    """``stop=["<tool"]`` ends inside the one token ``<tool_call>``: vLLM cuts its text there
    but keeps the token in the ids, and the env read ``...<tool`` while the trainer learnt
    ``...<tool_call>``. The turn's text is its ids' text, as with `HFPolicy`."""
    tok = policy.tokenizer
    allowed = [tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "x")]  # no eos: it stops there
    view = policy.with_sampling(stop=["<tool"], extra={"allowed_token_ids": allowed})
    [trajectory] = agentgym.rollout(NudgeEnv, view, tasks=[{"id": 1}], seed=1)
    cut = [t for t in trajectory.turns if t.text.endswith("<tool_call>")]
    assert cut, [t.text for t in trajectory.turns]  # the stop string ended some turn
    for turn in trajectory.turns:
        assert tok.decode(turn.completion_ids, skip_special_tokens=True) == turn.text
    said = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    assert said == [t.text for t in trajectory.turns]


def test_a_view_sizes_a_rollout_by_its_engines_batch(policy: VLLMPolicy) -> None:
    """A view had no ``max_num_seqs``: a rollout through it ran `DEFAULT_CONCURRENCY` (256)
    episodes at once where the policy itself ran twice the engine's batch."""
    view = policy.with_sampling(temperature=0.0).with_sampling(top_k=5)  # a view of a view
    assert view.max_num_seqs == policy.max_num_seqs > 0


async def test_logprobs_are_the_sampling_distributions_and_match_transformers(
    policy: VLLMPolicy, hf: HFPolicy
) -> None:
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 12 + 30?"}], [])
    completion = await policy.with_sampling(temperature=0.7).generate_ids(
        prompt, max_tokens=16, seed=5
    )
    reference = hf.token_logprobs(prompt, completion.completion_ids, temperature=0.7)
    assert len(completion.logprobs) == len(completion.completion_ids) == 16
    # fp32 on both sides; different kernels (vLLM's CPU attention vs eager torch): 2e-3 nats
    assert completion.logprobs == pytest.approx(reference, abs=2e-3)
    raw = hf.token_logprobs(prompt, completion.completion_ids, temperature=1.0)
    assert completion.logprobs != pytest.approx(raw, abs=2e-3)  # not the pre-temperature ones


async def test_a_new_adapter_version_is_served_while_the_engine_runs(
    policy: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "hello"}], [])
    greedy = policy.with_sampling(temperature=0.0)
    base = await greedy.generate_ids(prompt, max_tokens=12)
    v1 = await policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "a1", seed=1))
    first = await greedy.generate_ids(prompt, max_tokens=12)
    v2 = await policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "a2", seed=2))
    second = await greedy.generate_ids(prompt, max_tokens=12)
    assert (base.adapter_version, first.adapter_version, second.adapter_version) == (0, v1, v2)
    assert v2 == v1 + 1
    assert len({tuple(c.completion_ids) for c in (base, first, second)}) == 3
    assert v2 in await policy.served_adapters()
    assert policy.adapters[-1].load_seconds > 0
    # what the engine served under v2 is what the v2 weights produce in transformers
    oracle = HFPolicy(tiny_model_dir, adapter=tmp_path / "a2", sampling={"temperature": 0})
    expected = await oracle.generate_ids(prompt, max_tokens=12)
    assert second.completion_ids == expected.completion_ids


async def test_old_versions_leave_the_engine_and_one_still_running_keeps_its_weights(
    policy: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """No ``remove_lora`` round trip: vLLM's cache evicts inside the load that needs room, so
    the engine holds at most ``max_loras`` versions, and a request that started on an old
    version finishes on that version's weights (vLLM re-reads an evicted one's folder)."""
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "hello"}], [])
    greedy = policy.with_sampling(temperature=0.0, extra={"ignore_eos": True})
    old = await policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "old", seed=4))
    alone = await greedy.generate_ids(prompt, max_tokens=256)
    running = asyncio.ensure_future(greedy.generate_ids(prompt, max_tokens=256))
    await asyncio.sleep(0)  # one pass of the loop: the request is submitted, not timed
    with pytest.raises(ConfigError, match=f"backs adapter version {old}, which turns in flight"):
        await policy.aload_adapter(tmp_path / "old")  # weights saved over it would reach `running`
    still_running = []
    for seed in (5, 6):  # two newer versions: the old one is past max_loras (2)
        adapter = make_adapter(tiny_model_dir, tmp_path / f"v{seed}", seed)
        newest = await policy.aload_adapter(adapter)
        still_running.append(policy._in_flight.get(old, 0))
    assert still_running == [1, 1]  # both loads happened while the old version was sampling
    assert old in [a.version for a in policy.adapters]  # kept while a request uses it
    done = await running
    assert (done.adapter_version, done.completion_ids) == (old, alone.completion_ids)
    served = await policy.served_adapters()
    assert newest in served and len(served) <= policy.max_loras
    await policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "last", seed=7))
    assert old not in [a.version for a in policy.adapters]  # idle now: forgotten
    await policy.aload_adapter(tmp_path / "old")  # its folder may serve again: nothing uses it
    assert len(await policy.served_adapters()) <= policy.max_loras


async def test_a_cancelled_adapter_load_is_recorded_as_the_engine_loaded_it(
    policy: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's engine loads an adapter it was asked for even when the caller leaves: the
    policy never recorded it, and the next load under its number served the old weights."""
    before = policy.adapter_version
    loading = asyncio.create_task(
        policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "cut", seed=11))
    )
    await asyncio.sleep(0)  # the load is submitted to the engine's loop
    loading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loading
    assert policy.adapter_version == before + 1  # waited for, and recorded
    assert before + 1 in await policy.served_adapters()
    after = await policy.aload_adapter(make_adapter(tiny_model_dir, tmp_path / "next", seed=12))
    assert after == before + 2 and after in await policy.served_adapters()


async def test_an_adapter_on_every_linear_layer_samples_what_transformers_computes(
    policy: VLLMPolicy, hf: HFPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One adapter per batch runs agentgym's CPU LoRA path (`_cpu_lora`), packed q/k/v and
    gate/up slices included: its logprobs are the adapter's, as transformers + PEFT compute.
    Two versions one after the other: the path caches fused weights per layer, and the second
    version must not be served the first one's."""
    assert os.environ[_cpu_lora.ENV_VAR] == "1"  # VLLMPolicy set it for the engine it started
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 12 + 30?"}], [])
    sampled = []
    for seed in (3, 4):
        adapter = make_adapter(tiny_model_dir, tmp_path / f"all{seed}", seed=seed,
                               targets="all-linear")  # fmt: skip
        await policy.aload_adapter(adapter)
        completion = await policy.with_sampling(temperature=0.7).generate_ids(
            prompt, max_tokens=16, seed=5
        )
        oracle = HFPolicy(tiny_model_dir, adapter=adapter, dtype="float32")
        reference = oracle.token_logprobs(prompt, completion.completion_ids, temperature=0.7)
        assert completion.logprobs == pytest.approx(reference, abs=2e-3)  # as the base model's
        base = hf.token_logprobs(prompt, completion.completion_ids, temperature=0.7)
        assert completion.logprobs != pytest.approx(base, abs=2e-3)  # the adapter mattered
        sampled.append(completion.logprobs)
    # same prompt, seed and temperature: equal only if the second version ran the first's weights
    assert sampled[0] != pytest.approx(sampled[1], abs=2e-3)


def test_the_cpu_build_runs_eager_without_chunked_prefill_unless_asked() -> None:
    """Compiling lengthens every start (3-27 s, for a tiny model's batch 7-37% faster:
    bench/engine_lifecycle_bench.py), and a seeded prompt split across steps kills its engine."""
    require("vllm")
    assert VLLMPolicy._cpu_safe({"max_num_seqs": 8}, None) == {
        "enable_chunked_prefill": False, "enforce_eager": True, "max_num_seqs": 8}  # fmt: skip
    asked = {"enable_chunked_prefill": True, "enforce_eager": False}
    assert VLLMPolicy._cpu_safe(asked, None) == asked


def test_each_engine_gets_its_own_kv_cache_size(
    policy: VLLMPolicy, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kv_cache_gib went through os.environ.setdefault: the first engine of a process decided
    every later one's cache, and a variable set by the user silently beat the argument."""
    require("vllm")
    cache = policy._engine.vllm_config.cache_config  # started with the default
    assert cache.kv_cache_memory_bytes == int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")) * 2**30
    half = VLLMPolicy(tiny_model_dir, kv_cache_gib=0.5)
    assert half._cpu_safe(half._engine_args, half._kv_cache_gib)["kv_cache_memory_bytes"] == 2**29
    with pytest.raises(agentgym.ConfigError, match="above 0"):
        VLLMPolicy(tiny_model_dir, kv_cache_gib=0)
    with pytest.raises(agentgym.ConfigError, match="not both"):
        VLLMPolicy(tiny_model_dir, kv_cache_gib=2, engine_kwargs={"kv_cache_memory_bytes": 1})
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    with pytest.raises(agentgym.ConfigError, match="unset the variable or leave kv_cache_gib out"):
        VLLMPolicy(tiny_model_dir, kv_cache_gib=2)
    from_env = VLLMPolicy(tiny_model_dir)  # vLLM applies the variable itself
    assert "kv_cache_memory_bytes" not in from_env._cpu_safe(
        from_env._engine_args, from_env._kv_cache_gib
    )


def test_the_engines_processes_stop_busy_waiting_soon_after_a_turn(policy: VLLMPolicy) -> None:
    """vLLM's processes poll for a second after each message; agentgym's plugin makes it 20 ms
    on the CPU build, so a trainer's optimiser step right after the rollouts gets the cores."""
    psutil = require("psutil")
    assert os.environ[_engine_spin.ENV_VAR] == str(_engine_spin.SPIN_SECONDS)
    engine = [  # the engine core and its worker (vLLM titles them), not other test processes
        p for p in psutil.Process().children(recursive=True) if "VLLM::" in " ".join(p.cmdline())
    ]
    assert len(engine) >= 2, [p.cmdline() for p in engine]

    def cpu_seconds() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in engine)

    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "hello"}], [])
    asyncio.run(policy.generate_ids(prompt, max_tokens=4))
    before = cpu_seconds()
    time.sleep(0.5)  # the window measured (not a wait for something to happen)
    spent = cpu_seconds() - before
    assert spent < 0.2, f"vLLM's processes used {spent:.2f} s of CPU in the 0.5 s after a turn"


def test_the_worker_is_a_fork_of_the_engine_core_placed_where_vllm_asked(
    policy: VLLMPolicy,
) -> None:
    """agentgym's plugin makes the engine core fork its worker (vLLM-CPU spawns it, importing
    vLLM a second time); the fork must then run on the CPUs vLLM chose for a spawned one."""
    psutil = require("psutil")
    below = psutil.Process().children(recursive=True)  # a second engine's core: the forkserver's
    core = [p for p in below if "VLLM::EngineCore" in " ".join(p.cmdline())]
    assert len(core) == 1, [p.cmdline() for p in below]
    (worker,) = core[0].children()
    # a fork keeps its parent's auxiliary vector (randomised at each exec: a spawned process
    # gets a new one)
    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0"
    auxv = Path(f"/proc/{worker.pid}/auxv").read_bytes()
    assert auxv == Path(f"/proc/{core[0].pid}/auxv").read_bytes(), "the worker was spawned"
    if len(core[0].cpu_affinity()) > 1:  # vLLM keeps a CPU for the engine core: not the worker's
        assert set(worker.cpu_affinity()) < set(core[0].cpu_affinity())


def test_group_samples_differ_and_a_waiting_episode_does_not_hold_the_others(
    policy: VLLMPolicy,
) -> None:
    async def run() -> list[agentgym.Trajectory]:
        release = asyncio.Event()
        finished: list[agentgym.Trajectory] = []

        def on_episode(trajectory: agentgym.Trajectory) -> None:
            finished.append(trajectory)
            if len(finished) == 4:  # every fast episode is done: let the slow one go on
                release.set()

        return await asyncio.wait_for(
            agentgym.arollout(
                lambda: NudgeEnv(release), policy, tasks=["fast", "slow"], group_size=4,
                on_episode=on_episode,
            ),
            timeout=300,
        )  # fmt: skip

    trajectories = asyncio.run(run())
    fast = [t for t in trajectories if t.task == "fast"]
    assert all(t.status == "truncated" for t in trajectories)
    assert len({tuple(t.turns[0].completion_ids) for t in fast}) == 4  # G distinct samples


def test_an_engine_killed_mid_run_ends_episodes_as_infra_errors(tiny_model_dir: Path) -> None:
    """The engine's processes die (as an out-of-memory kill would take them): the episode is
    the machinery's failure, `infra_error`, which trainers drop, never the model's `error`.
    Its error says the policy is done for (every later rollout failed at once with "the vLLM
    engine failed: EngineDeadError(...)", which did not say so)."""
    require("vllm")
    before = child_pids()
    with VLLMPolicy(tiny_model_dir, sampling={"max_tokens": 8}, dtype="float32",
                    max_model_len=1024) as doomed:  # fmt: skip
        kill_engine(before)
        for _ in range(2):  # the rollout that meets the death, and one after it
            [trajectory] = agentgym.rollout(NudgeEnv, doomed, tasks=[{"id": 1}])
            assert trajectory.status == "infra_error", trajectory.error
            assert "the vLLM engine died" in (trajectory.error or "")
            assert "make a new VLLMPolicy" in (trajectory.error or "")


async def test_a_cancelled_turn_aborts_its_engine_request(policy: VLLMPolicy) -> None:
    """Cancelled while the engine generates it, a turn's request is aborted there."""
    engine, loop = policy._engine, asyncio.get_running_loop()
    long_turn = policy.with_sampling(extra={"ignore_eos": True})  # a view: the engine is shared
    taken, aborted = asyncio.Event(), []
    real_add, real_abort = engine.add_request, engine.abort

    async def add_request(request_id, *args, **kwargs):  # on the engine's loop
        queue = await real_add(request_id, *args, **kwargs)
        loop.call_soon_threadsafe(taken.set)
        return queue

    async def abort(request_id, *args, **kwargs):
        await real_abort(request_id, *args, **kwargs)
        aborted.append(request_id)
        loop.call_soon_threadsafe(taken.set)  # wakes the check below again

    engine.add_request, engine.abort = add_request, abort
    try:
        turn = asyncio.create_task(long_turn.generate_ids([1, 2, 3], max_tokens=2000))
        await taken.wait()  # the engine is generating it; the turn waits for the final output
        taken.clear()
        assert not turn.done() and engine.get_num_unfinished_requests() == 1
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        await asyncio.wait_for(taken.wait(), 30)  # the abort ran on the engine's loop
    finally:
        del engine.add_request, engine.abort
    assert len(aborted) == 1
    assert engine.get_num_unfinished_requests() == 0
    assert not any(policy._in_flight.values())  # no version counts the turn as running
    done = await policy.generate_ids([1, 2, 3], max_tokens=4)  # the engine goes on serving
    assert len(done.completion_ids) == 4
