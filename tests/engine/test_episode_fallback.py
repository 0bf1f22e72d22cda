"""An episode whose messages the template cannot render as a delta falls back to `per_turn`.

The mode check decides `concat` on a probe conversation; a real episode can still bring a
message shape the probe did not have. Then the engine must render that turn's prompt afresh
(never feed the model a concatenation the template would not produce), switch the episode to
`per_turn` for the rest of it, and say why on the trajectory.

The model is scripted (a `TokenPolicy` that answers fixed text as token ids): what is under
test is the episode's token bookkeeping, the real renderer and the rollout's record.
"""

from __future__ import annotations

from typing import Any

from agentgym import arollout
from agentgym._types import Completion
from agentgym.engine import ChatRenderer, TokenPolicy
from agentgym.engine.tiny import make_tokenizer
from tests.engine.episodes import NudgeEnv

# ChatML, except that once a second user message exists the first one is marked: history is
# rewritten by a user turn, a shape the probe conversation (one user message) never shows.
MARKS_FIRST_USER = (
    "{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- for m in messages %}"
    "{%- set mark = '(first) ' if m.role == 'user' and users | length > 1 "
    "and m.content == users[0].content else '' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + mark + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ScriptedTokenPolicy(TokenPolicy):
    """Answers ``text`` every turn, as token ids; remembers each prompt it was given."""

    def __init__(self, template: str, text: str = "abc") -> None:
        super().__init__({"max_tokens": 16})
        tokenizer = make_tokenizer()
        tokenizer.chat_template = template
        self._renderer = ChatRenderer(tokenizer)
        self.text = text
        self.prompts: list[list[int]] = []

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    async def generate_ids(self, prompt_ids: list[int], **_: Any) -> Completion:
        self.prompts.append(list(prompt_ids))
        ids = [*self._renderer.encode(self.text), self.tokenizer.eos_token_id]
        return Completion(
            text=self.text, prompt_ids=list(prompt_ids), completion_ids=ids,
            logprobs=[0.0] * len(ids), finish_reason="stop",
        )  # fmt: skip


async def test_a_rewrite_the_check_did_not_see_switches_the_episode_to_per_turn() -> None:
    policy = ScriptedTokenPolicy(MARKS_FIRST_USER)
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
    policy = ScriptedTokenPolicy(MARKS_FIRST_USER.replace("'(first) '", "''"))

    [trajectory] = await arollout(NudgeEnv, policy, tasks=[{}], seed=0)

    assert trajectory.mode == "concat"
    assert "mode_reason" not in trajectory.info
    ids, _, _ = trajectory.flatten()  # one sequence: each prompt extends the one before
    assert ids[: len(policy.prompts[-1])] == policy.prompts[-1]
