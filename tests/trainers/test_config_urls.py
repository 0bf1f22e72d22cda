"""`GRPOConfig` refuses a rollout URL with a password, and never echoes it.

A train job's ``rollout_servers: [http://bob:PASSWORD@host]`` was accepted by the job API,
stored in the run database and shown to every client; only the worker refused it. The
refusal of a URL that is not http(s) echoed the whole list, a password beside it included.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentgym import ConfigError
from tests.conftest import require

require("torch")
from agentgym.trainers._config import GRPOConfig  # noqa: E402

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    ("knobs", "option"),
    [({"rollout_servers": [f"http://bob:{SECRET}@gpu-a:8000"]}, "rollout_servers"),
     ({"rollout_servers": ["http://gpu-a:8000", f"ftp://bob:{SECRET}@gpu-b"]}, "rollout_servers"),
     ({"rollout_servers": [f"http://bob:{SECRET}@gpu-a:8000", "not a url"]}, "rollout_servers"),
     ({"rollout_servers": ["http://gpu-a:8000"],
       "rollout_router_url": f"http://bob:{SECRET}@router:30000"}, "rollout_router_url")],
)  # fmt: skip
def test_a_rollout_url_with_a_password_is_refused_without_echoing_it(
    knobs: dict[str, Any], option: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        GRPOConfig(**knobs)
    message = str(refused.value)
    assert message.startswith(f"{option} must be the server's root alone")
    assert "user:password@" in message and SECRET not in message
