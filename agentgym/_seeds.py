"""The sampling seed of one turn of one episode, shared by every policy that takes a seed.

Why one formula: the G episodes of a group share their prompt, so one seed sent with every
request samples G identical episodes (a group with no variance, ``pass@k`` of one draw).
Each (episode, turn) gets its own seed from the policy's base, so a run repeats exactly
while its episodes still differ.
"""

from __future__ import annotations

#: Turn seeds are taken modulo this: vLLM cannot send a seed past 2**64 - 1 to its engine
#: (every episode of ``--seed 2e16`` was an infra_error) and reads -1 as "no seed" (a run
#: that did not repeat); torch and OpenAI-compatible servers take [0, 2**63) too.
SEED_RANGE = 2**63


def turn_seed(base: int | None, episode_seed: int, turn: int) -> int | None:
    """``base + 1000 * episode_seed + turn`` (mod 2**63); None (fresh randomness) without a base."""
    return None if base is None else (base + 1000 * episode_seed + turn) % SEED_RANGE
