"""`closing_new_shared_pools`: closes the shared pools of the slots made inside the block only.

`agentgym.check` plays a sandbox env's episodes in one; the process's other pools (a
notebook's warm pool, a rollout beside it) must come out of it open, the check's closed.
Slots only, no pool started: which slots the block closes needs no Docker.
"""

from __future__ import annotations

from agentgym.sandboxes import close_shared_pools, closing_new_shared_pools
from agentgym.sandboxes._config import docker_config
from agentgym.sandboxes._env import _SLOTS, _slot

IMAGE = "agentgym-sandbox:closing-new-pools-test"


def test_the_slots_made_inside_are_closed_and_those_from_before_kept() -> None:
    config = docker_config(None)
    try:
        before = _slot(IMAGE, config, 7, None)  # a caller's, its pool not started yet
        with closing_new_shared_pools():
            assert _slot(IMAGE, config, 7, None) is before  # the block's episodes share it
            inside = _slot(IMAGE, config, 8, None)
        assert before in _SLOTS.values() and not before.closed
        assert inside not in _SLOTS.values() and inside.closed
    finally:
        close_shared_pools()


def test_a_slot_made_anew_under_a_key_from_before_is_the_blocks() -> None:
    # the registry was cleared inside the block: the slot made after is not the caller's
    config = docker_config(None)
    try:
        before = _slot(IMAGE, config, 7, None)
        with closing_new_shared_pools():
            close_shared_pools()
            remade = _slot(IMAGE, config, 7, None)
        assert remade is not before and remade.closed and remade not in _SLOTS.values()
    finally:
        close_shared_pools()
