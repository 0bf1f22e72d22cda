"""The sampling seed of one turn of one episode, shared by every policy that takes a seed.

Why one formula: the G episodes of a group share their prompt, so one seed sent with every
request samples G identical episodes (a group with no variance, ``pass@k`` of one draw).
Each (episode, turn) gets its own seed from the policy's base, so a run repeats exactly
while its episodes still differ.
"""

from __future__ import annotations


def turn_seed(base: int | None, episode_seed: int, turn: int) -> int | None:
    """``base + 1000 * episode_seed + turn``; None (fresh randomness) without a base."""
    return None if base is None else base + 1000 * episode_seed + turn
