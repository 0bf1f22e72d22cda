"""Envs and adapters shared by the engine tests (in-process engine and server fleet)."""

from __future__ import annotations

import asyncio
import string
from pathlib import Path
from typing import Any

from agentgym import Env
from agentgym._types import Completion
from agentgym.engine import ChatRenderer, TokenPolicy
from agentgym.engine.tiny import chat_template, make_tokenizer

LETTERS = " " + string.ascii_lowercase


class NudgeEnv(Env):
    """Every assistant turn is answered by a user nudge; three turns, then truncated.

    ``release`` (optional) is awaited in the step of episodes whose task is ``"slow"``, to
    hold one episode at its env step while the others run.
    """

    def __init__(self, release: asyncio.Event | None = None) -> None:
        super().__init__()
        self.release = release
        self.turn = 0

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.task = (options or {}).get("task")
        self.turn = 0
        self.messages = [
            {"role": "system", "content": "Write letters."},
            {"role": "user", "content": "go"},
        ]
        return list(self.messages), {"task": self.task}

    async def astep(self, action):
        self.turn += 1
        if self.task == "slow" and self.release is not None:
            await self.release.wait()
        new = [
            {"role": "assistant", "content": action.text},
            {"role": "user", "content": f"more {self.turn}"},
        ]
        self.messages += new
        return new, 0.0, False, self.turn >= 3, {"step_reward": 0.0}


def letters_only(policy: TokenPolicy) -> dict[str, Any]:
    """Sampling limited to lowercase letters, space and <|im_end|>: text that round-trips."""
    tok = policy.tokenizer
    allowed = [tok.convert_tokens_to_ids(ch) for ch in LETTERS] + [tok.eos_token_id]
    return {"allowed_token_ids": allowed}


def make_adapter(
    model_dir: Path, out: Path, seed: int, targets: str | list[str] = ("q_proj", "v_proj")
) -> Path:
    """A rank-8 adapter (alpha 64: outputs change visibly) on ``targets``, saved at ``out``."""
    from agentgym.engine.tiny import save_random_adapter

    modules = targets if isinstance(targets, str) else list(targets)
    return save_random_adapter(model_dir, out, rank=8, alpha=64, targets=modules, seed=seed)


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


class IdsPolicy(TokenPolicy):
    """Answers turn k's scripted ids exactly (cut to the context); remembers every prompt."""

    def __init__(
        self, script: list[list[int]], max_model_len: int = 4096, template: str = "", **kw: Any
    ) -> None:
        super().__init__({"max_tokens": 512}, **kw)
        tokenizer = make_tokenizer()
        tokenizer.chat_template = template or chat_template("compact")
        self._renderer = ChatRenderer(tokenizer)
        self.max_model_len = max_model_len
        self.script = script
        self.prompts: list[list[int]] = []

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    async def generate_ids(
        self, prompt_ids: list[int], *, max_tokens: int | None = None, **_: Any
    ) -> Completion:
        limit = self.turn_limit(prompt_ids, max_tokens, self.sampling)
        self.prompts.append(list(prompt_ids))
        turn = self.script[min(len(self.prompts), len(self.script)) - 1][:limit]
        text = self.tokenizer.decode(turn, skip_special_tokens=False)
        stopped = bool(turn) and turn[-1] == self.tokenizer.eos_token_id
        return Completion(
            text=self.renderer.visible_text(text, turn), prompt_ids=list(prompt_ids),
            completion_ids=list(turn), logprobs=[-0.5] * len(turn),
            finish_reason="stop" if stopped else "length",
        )  # fmt: skip
