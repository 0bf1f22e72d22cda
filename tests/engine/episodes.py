"""Envs and adapters shared by the engine tests (in-process engine and server fleet)."""

from __future__ import annotations

import asyncio
import string
from pathlib import Path
from typing import Any

from agentgym import Env
from agentgym.engine import TokenPolicy

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
