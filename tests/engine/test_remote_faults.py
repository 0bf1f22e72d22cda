"""`RemoteVLLMPolicy` and `VLLMFleet` against misbehaving servers (real HTTP on loopback).

Each stand-in (`tests.engine.fault_server`) is a FastAPI app on uvicorn that answers like vLLM
until told to misbehave. The rules checked: a turn carries the adapter version that really
sampled it; a server failure is ``infra_error`` (a `ModelError`) or retried on another
server, never a silently wrong turn; a malformed answer is never recorded as valid; a
cancelled turn gives its server slot back; bad configuration is one line naming the fix.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentgym import ContextLengthError, ModelError
from agentgym.engine import AdapterPublishError, RemoteVLLMPolicy, VLLMFleet
from tests.engine.fault_server import SAMPLED_IDS, SAMPLED_LOGPROBS, FaultServer

PROMPT = [1, 2, 3, 4]
#: Answers that are not a valid turn, whatever the status line said.
MALFORMED = (
    "no_token_ids", "no_logprobs", "short_token_ids", "short_logprobs", "truncated",
    "out_of_vocab", "negative_id", "nan_logprob", "not_json", "partial_json", "error_object",
    "early_length", "abort", "other_prompt", "reset",
)  # fmt: skip
#: Server failures: the same request may succeed on another server.
FAILURES = ("http_500", "http_503", "http_404", "hang", *MALFORMED)


def make_policy(model_dir: Path, servers: list[FaultServer], **kwargs: object) -> RemoteVLLMPolicy:
    fleet = VLLMFleet([s.url for s in servers], "tiny", timeout=3.0, cool_off=3600)
    return RemoteVLLMPolicy(model_dir, fleet, sampling={"max_tokens": 8}, **kwargs)  # type: ignore[arg-type]


def down(policy: RemoteVLLMPolicy, server: FaultServer) -> bool:
    return policy.fleet.router.replicas[server.url].down_until is not None


async def test_a_good_answer_is_recorded_exactly(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair)
    turn = await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert (turn.completion_ids, turn.logprobs) == (SAMPLED_IDS, SAMPLED_LOGPROBS)
    assert (turn.prompt_ids, turn.finish_reason, turn.adapter_version) == (PROMPT, "stop", 0)


async def test_a_turn_cut_at_max_tokens_is_length_and_valid(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair)
    turn = await policy.generate_ids(PROMPT, max_tokens=2, session="e")
    await policy.aclose()
    assert (turn.completion_ids, turn.finish_reason) == (SAMPLED_IDS[:2], "length")


@pytest.mark.parametrize("fault", FAILURES)
async def test_a_failed_answer_is_infra_error_under_fail(
    fault: str, pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    bad = pair[0]
    bad.completion_fault = fault
    policy = make_policy(tiny_model_dir, [bad], on_server_failure="fail")
    with pytest.raises(ModelError, match="on_server_failure='fail'"):
        await policy.generate_ids(PROMPT, session="e")
    assert down(policy, bad)  # routed around until it answers a probe
    assert policy.fleet.router.replicas[bad.url].in_flight == 0
    await policy.aclose()


@pytest.mark.parametrize("fault", FAILURES)
async def test_a_failed_answer_is_retried_on_another_server_exactly(
    fault: str, pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    bad, good = pair
    bad.completion_fault = fault
    policy = make_policy(tiny_model_dir, pair)
    turn = await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert (len(bad.completions), len(good.completions)) == (1, 1)  # the bad one was tried first
    assert (turn.completion_ids, turn.logprobs, turn.finish_reason) == (
        SAMPLED_IDS, SAMPLED_LOGPROBS, "stop"
    )  # fmt: skip
    assert down(policy, bad) and not down(policy, good)


async def test_a_bad_request_is_not_retried_and_the_server_stays_up(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    bad, good = pair
    bad.completion_fault = "http_400"
    policy = make_policy(tiny_model_dir, pair)
    with pytest.raises(ModelError, match="answered 400.*top_k"):
        await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert len(good.completions) == 0  # the same request would be refused anywhere
    assert not down(policy, bad)


async def test_a_context_overflow_is_a_context_length_error(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    pair[0].completion_fault = "context_400"
    policy = make_policy(tiny_model_dir, pair)
    with pytest.raises(ContextLengthError, match="maximum context length"):
        await policy.generate_ids(PROMPT, session="e")  # truncated and scored, not retried
    await policy.aclose()
    assert len(pair[1].completions) == 0 and not down(policy, pair[0])


async def test_every_server_failing_ends_the_turn_with_every_reason(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    for server in pair:
        server.completion_fault = "http_503"
    policy = make_policy(tiny_model_dir, pair)
    with pytest.raises(ModelError, match="no rollout server"):
        await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert [len(s.completions) for s in pair] == [1, 1]


async def test_a_passing_fault_through_a_router_is_retried(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    router = pair[0]  # the stand-in plays the router: one URL, no replica to mark down
    for fault in ("not_json", "http_503", "reset", "short_logprobs"):
        router.completion_fault, router.fault_times = fault, 1
        policy = make_policy(tiny_model_dir, pair[1:], router_url=router.url)
        turn = await policy.generate_ids(PROMPT, session="e")
        await policy.aclose()
        assert (turn.completion_ids, turn.logprobs) == (SAMPLED_IDS, SAMPLED_LOGPROBS), fault
    assert len(router.completions) == 8 and len(pair[1].completions) == 0


# ---- which adapter sampled ---------------------------------------------------------------
async def test_an_answer_from_another_version_is_retried_elsewhere_never_a_turn(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    bad, good = pair
    policy = make_policy(tiny_model_dir, pair)
    assert await policy.aload_adapter(adapter, 1) == 1
    bad.completion_fault = "other_model"  # answers as the base model: v1 never sampled it
    turn = await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert bad.completions[0]["model"] == good.completions[0]["model"] == "agentgym-v1"
    assert turn.adapter_version == 1  # sampled by the server that served v1
    assert down(policy, bad) and not down(policy, good)


async def test_an_answer_from_a_model_of_no_version_is_never_a_turn(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair[:1])
    await policy.aload_adapter(adapter, 1)
    pair[0].completion_fault = "unknown_model"
    with pytest.raises(ModelError, match="someone-elses-model"):
        await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert down(policy, pair[0])


async def test_the_base_model_may_answer_under_another_of_its_served_names(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    """vLLM names a base-model answer by its first --served-model-name, not the one asked."""
    pair[0].completion_fault = "unknown_model"
    policy = make_policy(tiny_model_dir, pair[:1])
    turn = await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert turn.adapter_version == 0 and not down(policy, pair[0])


async def test_a_server_that_acks_a_load_but_keeps_the_old_version_is_caught(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair[:1])
    await policy.aload_adapter(adapter, 1)
    pair[0].load_fault = "ack_keep_old"
    await policy.aload_adapter(adapter, 2)
    with pytest.raises(ModelError, match="as 'agentgym-v1' to a request for 'agentgym-v2'"):
        await policy.generate_ids(PROMPT, session="e")  # its tokens never become a turn
    await policy.aclose()


@pytest.mark.parametrize(
    ("fault", "why"), [("ack_not_listed", "does not serve"), ("http_500", "max-lora-rank")]
)
async def test_a_load_one_of_two_servers_fails_is_rolled_back_everywhere(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path, fault: str, why: str
) -> None:
    """Refused, or acknowledged but not served: traffic must not switch to v1 anywhere."""
    policy = make_policy(tiny_model_dir, pair)
    pair[1].load_fault = fault
    with pytest.raises(AdapterPublishError, match=f"v1 was not published.*{why}"):
        await policy.aload_adapter(adapter, 1)
    assert policy.adapter_version == 0
    assert pair[0].unloads == ["agentgym-v1"] and pair[0].served == {"tiny"}
    turn = await policy.generate_ids(PROMPT, session="e")
    assert turn.adapter_version == 0 and pair[0].completions[-1]["model"] == "tiny"
    await policy.aclose()


async def test_servers_without_the_runtime_lora_api_fail_at_once_naming_the_fix(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair)
    policy.fleet.load_timeout = 30
    for server in pair:
        server.load_fault = "no_route"
    started = time.monotonic()
    with pytest.raises(AdapterPublishError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
        await policy.aload_adapter(adapter, 1)
    assert time.monotonic() - started < 5  # not mistaken for shared storage catching up
    assert policy.fleet.not_found_retries == 0
    await policy.aclose()


async def test_a_server_that_lost_the_adapter_is_routed_around_and_healed(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    policy = make_policy(tiny_model_dir, pair)
    await policy.aload_adapter(adapter, 1)
    pair[0].served = {"tiny"}  # restarted: it came back without the adapter
    turn = await policy.generate_ids(PROMPT, session="e")
    assert turn.adapter_version == 1 and pair[1].completions[-1]["model"] == "agentgym-v1"
    assert down(policy, pair[0])
    policy.fleet.router.mark_down(pair[0].url, "lost v1", cool_off=0)  # due for a probe now
    await policy.generate_ids(PROMPT, session="other")
    assert "agentgym-v1" in pair[0].served and not down(policy, pair[0])
    await policy.aclose()


# ---- control plane and cancellation -------------------------------------------------------
async def test_a_garbled_model_list_is_a_model_error(pair: list[FaultServer]) -> None:
    pair[0].models_fault = "not_json"
    fleet = VLLMFleet([pair[0].url], "tiny", timeout=3.0)
    with pytest.raises(ModelError, match="/v1/models"):
        await fleet.served_names(pair[0].url)
    await fleet.aclose()


async def test_a_cancelled_turn_gives_its_server_slot_back(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    pair[0].completion_fault = "hang"
    policy = make_policy(tiny_model_dir, pair[:1])
    policy.fleet.http = type(policy.fleet.http)(timeout=30.0)  # hangs past the test otherwise
    task = asyncio.create_task(policy.generate_ids(PROMPT, session="e"))
    assert await asyncio.to_thread(pair[0].request_arrived.wait, 10)
    replica = policy.fleet.router.replicas[pair[0].url]
    assert replica.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert replica.in_flight == 0 and not down(policy, pair[0])  # a cancel is not a failure
    await policy.aclose()
