"""Templates that cut a thinking model's reasoning from the turn itself, the last one included.

DeepSeek-R1-Distill's template writes every assistant turn as ``content.split('</think>')[-1]``.
Its renders extend each other, so deltas looked consistent and the mode was ``concat``: later
prompts showed the model reasoning that a fresh render (what it meets when served) never has,
and ``flatten()`` was no prefix of that render. Such a template must get ``per_turn``, decided
up front (`ChatRenderer.decide_mode`, `agentgym check`) or, for a turn the decision could not
foresee, at run time; templates that keep the sampled turn (ChatML) or drop reasoning only from
earlier turns (Qwen3) must keep what they had. The templates are small ones written here.
"""

from __future__ import annotations

from typing import Any

import pytest

import agentgym
from agentgym import arollout
from agentgym.engine import ChatRenderer
from agentgym.engine._episode import probe_conversation
from agentgym.engine.tiny import chat_template, make_tokenizer
from tests.conftest import CALCULATE_TOOL, require
from tests.engine.episodes import IdsPolicy, NudgeEnv
from tests.engine.test_render import DROPS_THINK

TOOLS = [CALCULATE_TOOL]
#: What the scripted model reasons before each answer; no later prompt may show it.
SECRET = "secret plan"

# DeepSeek-R1-Distill-like (the template whose generation prompt leaves <think> to the model):
# reasoning is cut from every assistant turn, the last one included; calls in hermes' format.
R1_DISTILL_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (m.content or '').split('</think>')[-1] }}"
    "{%- for c in (m.tool_calls or []) %}"
    "{{- '<tool_call>\\n' + {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson + '\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The same template keeping the turn as written: nothing but the cut may give per_turn.
KEEPS_REASONING = R1_DISTILL_LIKE.replace(".split('</think>')[-1]", "")
# DeepSeek-V3.1-like with thinking off: the generation prompt closes the think block, so the
# model is not expected to reason, and reasoning is cut from every turn.
PROMPT_CLOSES_THINK = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n</think>' + m.content.split('</think>')[-1] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n</think>' }}{%- endif %}"
)


def renderer(template: str) -> ChatRenderer:
    tokenizer = make_tokenizer()
    tokenizer.chat_template = template
    return ChatRenderer(tokenizer)


def thinking_conversation() -> list[dict[str, Any]]:
    """Two answers of a thinking model, each opening with its reasoning, a nudge between."""
    return [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": f"<think>{SECRET}</think>first"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "<think>another plan</think>second"},
    ]


def thinking_policy(template: str) -> IdsPolicy:
    """A policy that reasons ``SECRET``, answers and stops, every turn."""
    tokenizer = make_tokenizer()
    turn = tokenizer.encode(f"<think>{SECRET}</think>answer", add_special_tokens=False)
    return IdsPolicy([[*turn, tokenizer.eos_token_id]], template=template)


def fresh_prompts(policy: IdsPolicy, messages: list[dict[str, Any]]) -> list[list[int]]:
    """Each turn's prompt as a fresh render of the conversation before it."""
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [policy.renderer.prompt_ids(messages[:i], None) for i in starts]


@pytest.mark.parametrize(
    ("conversation", "tools", "turn"),
    [
        (thinking_conversation(), None, "assistant turn 1"),
        (probe_conversation(TOOLS), TOOLS, "a thinking model's turn"),  # no reasoning in it
    ],
    ids=["thinking-reference", "generic-probe"],
)
def test_a_template_that_cuts_the_last_turns_reasoning_gets_per_turn(
    conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None, turn: str
) -> None:
    decision = renderer(R1_DISTILL_LIKE).decide_mode(conversation, tools)
    assert decision.mode == "per_turn"
    assert f"writes {turn} without its <think> reasoning" in decision.reason, decision.reason


@pytest.mark.parametrize(
    "template",
    [chat_template("compact"), KEEPS_REASONING, DROPS_THINK, PROMPT_CLOSES_THINK],
    ids=["chatml", "keeps-reasoning", "qwen3-earlier-turns-only", "prompt-closes-think"],
)
def test_templates_that_keep_the_last_turn_stay_concat_on_the_generic_probe(template: str) -> None:
    """No false per_turn: it costs every episode its prefix reuse and one-sequence training.
    Qwen3's cut of earlier turns is found by the deltas, as before; a prompt that closes the
    think block gets turns without reasoning, so the cut changes nothing."""
    decision = renderer(template).decide_mode(probe_conversation(TOOLS), TOOLS)
    assert decision.mode == "concat", decision.reason


def test_templates_that_keep_reasoning_stay_concat_on_a_thinking_reference() -> None:
    for template in (chat_template("compact"), KEEPS_REASONING):
        decision = renderer(template).decide_mode(thinking_conversation(), None)
        assert decision.mode == "concat", decision.reason
    qwen3 = renderer(DROPS_THINK).decide_mode(thinking_conversation(), None)  # as before
    assert qwen3.reason == "the template rewrites assistant turn 1 once messages follow it"


async def test_an_episode_of_a_thinking_model_never_shows_earlier_reasoning() -> None:
    policy = thinking_policy(R1_DISTILL_LIKE)

    [trajectory] = await arollout(NudgeEnv, policy, tasks=[{}], seed=0)

    assert trajectory.mode == "per_turn"
    assert policy.prompts == fresh_prompts(policy, trajectory.messages)
    assert not any(SECRET in policy.tokenizer.decode(p) for p in policy.prompts)


async def test_a_cut_the_decision_did_not_foresee_switches_the_episode_to_per_turn() -> None:
    """The prompt closes the think block, so the mode is concat; a model that reasons anyway
    has its reasoning cut from the turn: from then on prompts are fresh renders, and why is
    on the trajectory."""
    policy = thinking_policy(PROMPT_CLOSES_THINK)
    assert policy.mode_for([]).mode == "concat"

    [trajectory] = await arollout(NudgeEnv, policy, tasks=[{}], seed=0)

    assert trajectory.mode == "per_turn"
    assert trajectory.info["mode_reason"] == "turn 2: the template rewrote the previous turn"
    assert policy.prompts == fresh_prompts(policy, trajectory.messages)
    assert not any(SECRET in policy.tokenizer.decode(p) for p in policy.prompts[1:])


@pytest.mark.parametrize(
    ("template", "mode"),
    [(R1_DISTILL_LIKE, "per_turn: the template writes a thinking model's turn without its "
                       "<think> reasoning"),
     (KEEPS_REASONING, "concat")],
    ids=["cuts-reasoning", "keeps-reasoning"],
)  # fmt: skip
def test_agentgym_check_says_the_mode_the_engine_gives(template: str, mode: str) -> None:
    """`agentgym check --tokenizer` decides as the engine does: its reference episode has no
    reasoning (the template opens no think block), yet an R1-like model's episodes go per_turn."""
    require("transformers")
    tokenizer = make_tokenizer()
    tokenizer.chat_template = template
    found = {r.name: r for r in agentgym.check("calculator", tokenizer=tokenizer,
                                                tool_prompt="system")}  # fmt: skip
    assert found["rollout mode"].detail.startswith(mode), found["rollout mode"].detail
