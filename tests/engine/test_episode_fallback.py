"""An episode whose messages the template cannot render as a delta falls back to `per_turn`.

The mode check decides `concat` on a probe conversation; a real episode can still bring a
message shape the probe did not have. Then the engine must render that turn's prompt afresh
(never feed the model a concatenation the template would not produce), switch the episode to
`per_turn` for the rest of it, and say why on the trajectory.

The model is scripted (a `TokenPolicy` that answers fixed text as token ids): what is under
test is the episode's token bookkeeping, the real renderer and the rollout's record.
"""

from __future__ import annotations

from agentgym import arollout
from agentgym.engine.tiny import make_tokenizer
from tests.engine.episodes import MARKS_FIRST_USER, IdsPolicy, NudgeEnv


def scripted(template: str, text: str = "abc") -> IdsPolicy:
    """A policy answering ``text`` and EOS every turn, as token ids, with ``template``."""
    tokenizer = make_tokenizer()
    answer = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    return IdsPolicy([answer], template=template)


async def test_a_rewrite_the_check_did_not_see_switches_the_episode_to_per_turn() -> None:
    policy = scripted(MARKS_FIRST_USER)
    assert policy.mode_for([]).mode == "concat"  # the probe has one user message: no rewrite

    [trajectory] = await arollout(NudgeEnv, policy, tasks=[{}], seed=0)

    assert [len(t.completion_ids or []) for t in trajectory.turns] == [4, 4, 4]
    assert trajectory.mode == "per_turn"
    assert trajectory.info["mode_reason"] == "turn 2: the template rewrote the previous turn"
    # every prompt is what the template renders for the conversation so far: turn 2 onwards
    # the marked first message, which a concatenation of turn 1's ids would not have
    renderer, messages = policy.renderer, trajectory.messages
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    fresh = [renderer.prompt_ids(messages[:i], None) for i in starts]
    assert policy.prompts == fresh
    assert policy.prompts[1][: len(policy.prompts[0])] != policy.prompts[0]


async def test_an_episode_the_template_renders_as_deltas_stays_concat() -> None:
    policy = scripted(MARKS_FIRST_USER.replace("'(first) '", "''"))

    [trajectory] = await arollout(NudgeEnv, policy, tasks=[{}], seed=0)

    assert trajectory.mode == "concat"
    assert "mode_reason" not in trajectory.info
    ids, _, _ = trajectory.flatten()  # one sequence: each prompt extends the one before
    assert ids[: len(policy.prompts[-1])] == policy.prompts[-1]
