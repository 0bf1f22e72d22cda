"""`RemoteVLLMPolicy` refuses server URLs that are more than a root, as `OpenAIPolicy` does.

A password in ``--server http://u:TOPSECRET@host:port`` was printed in "infrastructure error:
http://u:TOPSECRET@... is unreachable" and so kept in the run database's error tail; a query
had the API path appended after it. ``--base-url`` already refused both (the same check).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import agentgym
from agentgym.engine import RemoteVLLMPolicy, VLLMFleet
from tests.test_cli_eval_refusals import one_error_line, run

SECRET = "TOPSECRET"
GOOD = "http://127.0.0.1:18999"
#: The words `OpenAIPolicy`'s base_url check refuses these with, which both share.
ROOT_ALONE = "no ?query, #fragment or user:password@"


def refusal(servers: list[str], router_url: str | None = None) -> str:
    with pytest.raises(agentgym.ConfigError) as caught:
        RemoteVLLMPolicy("unused-tokenizer", VLLMFleet(servers, "tiny"), router_url=router_url)
    return str(caught.value)


@pytest.mark.parametrize(
    "url", [f"http://u:{SECRET}@127.0.0.1:18999", f"{GOOD}/v1?key={SECRET}", f"{GOOD}/v1#{SECRET}"]
)
def test_a_server_url_with_more_than_its_root_is_refused_without_echoing_it(url: str) -> None:
    message = refusal([GOOD, url])
    assert message.startswith("--server / rollout_servers must be the server's root alone")
    assert ROOT_ALONE in message and SECRET not in message
    with pytest.raises(agentgym.ConfigError, match="must be the server's root alone") as caught:
        agentgym.OpenAIPolicy(url, "m")
    assert ROOT_ALONE in str(caught.value)  # one check, one wording


def test_a_router_url_with_a_password_is_refused() -> None:
    message = refusal([GOOD], router_url=f"http://u:{SECRET}@127.0.0.1:30000")
    assert message.startswith("--router-url / rollout_router_url must be the server's root")
    assert SECRET not in message


def test_a_server_url_that_is_not_http_is_refused() -> None:
    assert "must be an http(s) URL such as http://127.0.0.1:8000" in refusal(["127.0.0.1:8000"])


def test_server_roots_are_taken() -> None:
    other = "https://gpu-2.internal:8000"
    policy = RemoteVLLMPolicy("unused", VLLMFleet([GOOD, f"{other}/v1/"], "tiny"),
                              router_url=f"{GOOD}/v1")  # fmt: skip
    assert policy.router_url == GOOD and policy.fleet.urls == [GOOD, other]


@pytest.mark.slow  # the eval loads the tiny model's tokenizer before it builds the policy
def test_eval_never_prints_the_password(tmp_path: Path, tiny_model_dir: Path) -> None:
    proc = run(tmp_path, "calculator", "--policy", "vllm", "--model-path", str(tiny_model_dir),
               "--server", f"http://u:{SECRET}@127.0.0.1:18999", "-n", "1")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert ROOT_ALONE in one_error_line(proc)
    assert SECRET not in proc.stdout + proc.stderr
