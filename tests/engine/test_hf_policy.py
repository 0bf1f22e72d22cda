"""HFPolicy (transformers `generate`) as a rollout engine: batched turns and LoRA versions.

The trainer's ``rollout_engine: hf`` rests on these: turns queued together are sampled as one
left-padded batch and must equal the turns sampled alone; adapter versions load from folders
and every turn records the one that sampled it, as with vLLM.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentgym._errors import ConfigError
from agentgym.engine import HFPolicy
from tests.engine.episodes import make_adapter

pytestmark = pytest.mark.slow


@pytest.fixture
def greedy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(tiny_model_dir, sampling={"temperature": 0.0, "max_tokens": 16})


def test_turns_queued_together_equal_the_same_turns_sampled_alone(greedy: HFPolicy) -> None:
    prompts = [greedy.tokenizer.encode("hello there " * k) for k in (1, 4, 2)]

    async def alone() -> list:
        return [await greedy.generate_ids(p) for p in prompts]

    async def together() -> list:  # different lengths: left padding must not change a token
        return await asyncio.gather(
            *(greedy.generate_ids(p, max_tokens=16 if i else 5) for i, p in enumerate(prompts))
        )

    one_by_one, batched = asyncio.run(alone()), asyncio.run(together())
    assert batched[0].completion_ids == one_by_one[0].completion_ids[:5]  # cut at its own limit
    assert batched[0].finish_reason == "length"
    for a, b in zip(one_by_one, batched):
        assert b.prompt_ids == a.prompt_ids
        assert b.completion_ids == a.completion_ids[: len(b.completion_ids)]
        assert b.logprobs == pytest.approx(a.logprobs[: len(b.logprobs)], abs=1e-4)  # fp32


def test_seeded_turns_sample_the_same_alone_as_in_any_batch(tiny_model_dir: Path) -> None:
    """A batch drew every row from one generator seeded by its first turn's seed, so a seeded
    turn repeated only in the same batch: an eval resumed after Ctrl-C (other batches) played
    other episodes than the seeds it recorded."""
    policy = HFPolicy(tiny_model_dir, sampling={"temperature": 1.0, "top_k": 50, "max_tokens": 16})
    prompts = [policy.tokenizer.encode(f"say {word} " * 2) for word in ("abc", "xyz", "hello")]
    seeds = [101, 102, 103]

    async def alone() -> list:
        return [await policy.generate_ids(p, seed=s) for p, s in zip(prompts, seeds)]

    async def together(order: list[int]) -> list:
        done = await asyncio.gather(*(policy.generate_ids(prompts[i], seed=seeds[i])
                                      for i in order))  # fmt: skip
        return [done[order.index(i)] for i in range(len(order))]

    one_by_one = asyncio.run(alone())
    for order in ([0, 1, 2], [2, 0, 1]):
        batched = asyncio.run(together(order))
        assert [b.completion_ids for b in batched] == [a.completion_ids for a in one_by_one]
        for a, b in zip(one_by_one, batched):
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert len({tuple(a.completion_ids) for a in one_by_one}) == 3  # not one draw for all
    # the logprobs are the sampled distribution's (top-k 50 at temperature 1 here)
    first = one_by_one[0]
    assert all(lp <= 0.0 for lp in first.logprobs) and len(first.logprobs) == len(
        first.completion_ids
    )


def test_a_cancelled_turn_leaves_the_others_of_its_batch_served(greedy: HFPolicy) -> None:
    prompt = greedy.tokenizer.encode("hello there")

    async def main() -> tuple:
        doomed = asyncio.ensure_future(greedy.generate_ids(prompt))
        kept = asyncio.ensure_future(greedy.generate_ids(prompt))
        await asyncio.sleep(0)
        doomed.cancel()
        return await asyncio.gather(doomed, kept, return_exceptions=True)

    doomed, kept = asyncio.run(main())
    assert isinstance(doomed, asyncio.CancelledError)
    assert len(kept.completion_ids) > 0
    assert not any(turns.queue for turns in greedy._loops.values())  # nothing waits for a batch


def _counting_generate(policy: HFPolicy, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row count of every `generate` call the policy makes (the real call runs)."""
    rows: list[int] = []
    real = policy.model.generate

    def counted(inputs, **kwargs):
        rows.append(len(inputs))
        return real(inputs, **kwargs)

    monkeypatch.setattr(policy.model, "generate", counted)
    return rows


@pytest.mark.parametrize("straggler_wait", [1.0, 0.0])
def test_tool_turns_a_few_ticks_apart_share_one_batch(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, straggler_wait: float
) -> None:
    """Four episodes whose tools return 0, 4, 8 and 12 event-loop ticks after their first
    turns: waiting for the live ones (their sessions) samples the second turns in one call;
    with the wait off they split, which is what the wait is for."""
    policy = HFPolicy(tiny_model_dir, sampling={"temperature": 0.0, "max_tokens": 8},
                      straggler_wait=straggler_wait)  # fmt: skip
    rows = _counting_generate(policy, monkeypatch)
    prompt = policy.tokenizer.encode("hello there")

    async def episode(i: int) -> None:
        first = await policy.generate_ids(prompt, session=f"episode-{i}")
        for _ in range(4 * i):  # a tool that takes a few ticks
            await asyncio.sleep(0)
        await policy.generate_ids(prompt + first.completion_ids, session=f"episode-{i}")
        await policy.end_session(f"episode-{i}")

    async def main() -> None:
        await asyncio.gather(*(episode(i) for i in range(4)))

    asyncio.run(main())
    if straggler_wait:
        assert rows == [4, 4]
    else:
        assert rows[0] == 4 and len(rows) > 2


def test_a_slow_tool_holds_the_others_batch_only_briefly(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An episode in a slow tool is waited for at most ``straggler_wait`` (1 s): the other
    episode's next turn is sampled (alone) long before that 4 s tool returns. (With a 1 s
    tool, a CPU shared with another job made the quick turn itself outlast the tool.)"""
    policy = HFPolicy(tiny_model_dir, sampling={"temperature": 0.0, "max_tokens": 8},
                      straggler_wait=1.0)  # fmt: skip
    rows = _counting_generate(policy, monkeypatch)
    prompt = policy.tokenizer.encode("hello there")
    events: list[str] = []

    async def episode(name: str, tool_seconds: float) -> None:
        first = await policy.generate_ids(prompt, session=name)
        await asyncio.sleep(tool_seconds)  # the tool's own latency
        events.append(f"{name} tool returned")
        await policy.generate_ids(prompt + first.completion_ids, session=name)
        events.append(f"{name} second turn")
        await policy.end_session(name)

    async def main() -> None:
        await asyncio.gather(episode("quick", 0.0), episode("slow", 4.0))

    asyncio.run(main())
    assert events.index("quick second turn") < events.index("slow tool returned")
    assert rows == [2, 1, 1]


def test_turns_queued_when_the_loop_shuts_down_are_cancelled_not_left_waiting(
    greedy: HFPolicy,
) -> None:
    """The drainer is cancelled while it waits for a straggler (the loop is closing): the
    turn it holds must fail with CancelledError instead of awaiting a batch forever."""
    greedy.straggler_wait = 1.0
    prompt = greedy.tokenizer.encode("hello there")

    async def main() -> BaseException | None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(greedy.generate_ids(prompt, session="a"),
                             greedy.generate_ids(prompt, session="b"))  # fmt: skip
        held = asyncio.ensure_future(greedy.generate_ids(prompt, session="a"))
        while not greedy._loops[loop].queue:  # "b" is live and not queued: the drainer waits
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        drainer = greedy._loops[loop].drainer
        assert drainer is not None
        drainer.cancel()
        try:
            await asyncio.wait_for(held, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - the outcome is what the test checks
            return exc
        return None

    assert isinstance(asyncio.run(main()), asyncio.CancelledError)


def test_a_failing_generate_makes_its_batch_infra_errors(
    greedy: HFPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA out-of-memory cannot be had on this CPU machine: `generate` is made to raise it."""
    import agentgym
    from tests.engine.episodes import NudgeEnv

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(greedy.model, "generate", out_of_memory)
    trajectories = agentgym.rollout(NudgeEnv, greedy, tasks=[{"id": 1}, {"id": 2}])
    assert [t.status for t in trajectories] == ["infra_error", "infra_error"]  # not "error"
    assert "out of memory" in trajectories[0].error


def test_a_rollout_deadline_stops_the_batch_it_falls_in(tiny_model_dir: Path) -> None:
    """`generate` blocks the event loop, so a rollout's deadline cannot cancel an episode in
    the middle of a batch: the batch itself must stop there, and the turns it cut must not
    reach their episodes. Before, the 800 greedy tokens (the tiny model never stops) ran to
    their end, some 20 s here, and each late episode kept that turn."""
    import agentgym
    from tests.engine.episodes import NudgeEnv

    policy = HFPolicy(tiny_model_dir, sampling={"temperature": 0.0, "max_tokens": 800})
    started = time.perf_counter()
    trajectories = agentgym.rollout(NudgeEnv, policy, tasks=[{"id": 1}, {"id": 2}], deadline=1.0)
    assert [t.status for t in trajectories] == ["late", "late"]
    assert [t.turns for t in trajectories] == [[], []]
    assert time.perf_counter() - started < 6.0  # the deadline, a decoding step and the close


def test_two_event_loops_in_two_threads_each_get_their_own_turns(greedy: HFPolicy) -> None:
    import threading

    prompts = [greedy.tokenizer.encode("hello there " * k) for k in (1, 3)]
    alone = [asyncio.run(greedy.generate_ids(p)).completion_ids for p in prompts]
    got: dict[int, list[int]] = {}

    def play(i: int) -> None:  # asyncio.run in a thread: a second loop, as a caller may have
        got[i] = asyncio.run(greedy.generate_ids(prompts[i])).completion_ids

    threads = [threading.Thread(target=play, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [got.get(0), got.get(1)] == alone


def test_adapter_versions_change_outputs_and_turns_record_them(
    greedy: HFPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt = greedy.tokenizer.encode("hello there")
    base = asyncio.run(greedy.generate_ids(prompt))
    assert base.adapter_version == 0
    assert greedy.load_adapter(make_adapter(tiny_model_dir, tmp_path / "a1", seed=1)) == 1
    v1 = asyncio.run(greedy.generate_ids(prompt))
    adapter2 = make_adapter(tiny_model_dir, tmp_path / "a2", seed=2)
    assert asyncio.run(greedy.aload_adapter(adapter2, version=5)) == 5  # a resumed run's numbering
    v5 = asyncio.run(greedy.generate_ids(prompt))
    assert (v1.adapter_version, v5.adapter_version) == (1, 5)
    assert v1.completion_ids != base.completion_ids and v5.completion_ids != v1.completion_ids
    assert asyncio.run(greedy.served_adapters()) == {5}  # the old version was unloaded
    assert greedy.adapters[-1].load_seconds > 0
    with pytest.raises(ConfigError, match="not above the last one loaded"):
        greedy.load_adapter(tmp_path / "a1", version=5)
    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        greedy.load_adapter(tmp_path)


def test_an_adapter_swapped_into_the_slot_serves_what_it_does_loaded_fresh(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A sync copies the new weights into the loaded adapter (PEFT's hotswap) where they fit;
    whether copied, zero-padded to the slot's rank or added anew, the outputs must be the
    adapter's own: compared with a policy that loaded only it."""
    from agentgym.engine.tiny import save_random_adapter

    sampling = {"temperature": 0.0, "max_tokens": 12}
    policy = HFPolicy(tiny_model_dir, sampling=sampling)
    policy.load_adapter(make_adapter(tiny_model_dir, tmp_path / "a1", seed=1))
    slot = policy.adapters[-1].name
    prompt = policy.tokenizer.encode("hello there")
    cases = {  # adapter -> the name it serves under: the slot's when swapped in
        make_adapter(tiny_model_dir, tmp_path / "same-shape", seed=2): slot,
        save_random_adapter(tiny_model_dir, tmp_path / "rank-4-fewer-layers", rank=4, alpha=64,
                            targets=["q_proj"], seed=3): slot,  # fmt: skip
        make_adapter(tiny_model_dir, tmp_path / "more-layers", seed=4,
                     targets=["q_proj", "v_proj", "o_proj"]): "agentgym-v4",  # fmt: skip
    }
    for version, (adapter, name) in enumerate(cases.items(), start=2):
        assert policy.load_adapter(adapter) == version
        assert policy.adapters[-1].name == name
        assert asyncio.run(policy.served_adapters()) == {version}
        fresh = HFPolicy(tiny_model_dir, sampling=sampling, adapter=adapter)
        want = asyncio.run(fresh.generate_ids(prompt))
        assert want.adapter_version == 1  # it said 0, the base weights' version
        got = asyncio.run(policy.generate_ids(prompt))
        assert got.completion_ids == want.completion_ids, adapter.name
        ids = want.completion_ids
        assert policy.token_logprobs(prompt, ids) == pytest.approx(  # fp32
            fresh.token_logprobs(prompt, ids), abs=1e-5
        )


@pytest.mark.parametrize("where", ["/nonexistent/model", "./typo-model", "~/no-such-model"])
def test_a_local_path_without_a_model_is_refused_by_both_engines(where: str) -> None:
    # transformers and vLLM took it for a hub id: "Repo id must use alphanumeric chars"
    from agentgym.engine import VLLMPolicy

    for engine in (HFPolicy, VLLMPolicy):
        with pytest.raises(ConfigError, match=f"{where} is not a model folder"):
            engine(where)


def test_a_hub_id_is_left_to_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.engine import VLLMPolicy

    monkeypatch.chdir(tmp_path)  # no folder of that name here
    assert VLLMPolicy("Qwen/Qwen2.5-0.5B-Instruct").model == "Qwen/Qwen2.5-0.5B-Instruct"
