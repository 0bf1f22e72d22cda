"""`OpenAIPolicy` on 200 answers that are no chat completion, and on knobs a server refuses.

A 200 whose body is not JSON (a proxy's HTML page, JSON cut short) or whose JSON lacks what a
chat completion holds escaped as JSONDecodeError / AttributeError / KeyError: the episode was
filed as ``error`` (the model's) and the eval exited 1, never retried. It is the server's
failure, as a 502 is: ``infra_error``. Sampling knobs the server refuses with 400 (filed as
infrastructure, exit 75, whose ``--resume`` is then refused) are refused up front instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

import agentgym
from agentgym.engine import SamplingConfig
from tests.test_policies import REPLY, FlakyServer, running_servers

HTML = b"<html><body>Sign in to the proxy</body></html>"


def _reply(**changes: Any) -> bytes:
    """`REPLY` with ``changes`` made to its first choice, as JSON bytes."""
    choices: Any = REPLY["choices"]
    return json.dumps({**REPLY, "choices": [{**choices[0], **changes}]}).encode()


#: A 200 body that is no chat completion -> what the error says is wrong.
BODIES = {
    "html": (HTML, "with no JSON"),
    "cut short": (_reply()[:30], "with no JSON"),
    "a list": (b"[1, 2]", "without choices[0]"),
    "no choices": (b'{"choices": []}', "without choices[0]"),
    "an error object": (b'{"error": {"message": "overloaded"}}', "without choices[0]"),
    "message null": (_reply(message=None), "without choices[0].message"),
    "message a string": (_reply(message="42"), "without choices[0].message"),
    "content a number": (_reply(message={"role": "assistant", "content": 42}), "not text"),
    "tool_calls a string": (
        _reply(message={"role": "assistant", "content": "", "tool_calls": "calculate"}),
        "tool_calls that is not a list of objects",
    ),
    "logprob missing": (
        _reply(logprobs={"content": [{"token": "4"}, {"token": "2"}]}),
        "logprobs not {content: [{logprob: number}",
    ),
    "logprobs a list": (_reply(logprobs=[-0.5, -0.25]), "logprobs not {content"),
    "token ids strings": (_reply(token_ids=["4", "2"]), "token_ids that is not a list of ints"),
    "ids and logprobs apart": (_reply(token_ids=[52]), "with 1 token ids and 2 logprobs"),
    "finish_reason a number": (_reply(finish_reason=1), "finish_reason that is not text"),
}


class BodyServer(FlakyServer):
    """Answers every POST 200 with ``body``, byte for byte (`FlakyServer` sends only JSON)."""

    def __init__(self, body: bytes) -> None:
        super().__init__([])
        self.RequestHandlerClass = _BodyHandler
        self.body = body


class _BodyHandler(BaseHTTPRequestHandler):
    server: BodyServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        self.server.requests.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Any]:
    """Starts a `BodyServer` on loopback for a body; all are stopped after the test."""
    with running_servers(BodyServer) as start:
        yield start


@pytest.mark.parametrize(("body", "fault"), BODIES.values(), ids=BODIES.keys())
async def test_a_200_that_is_no_chat_completion_is_the_servers_failure(
    answering: Any, body: bytes, fault: str
) -> None:
    server = answering(body)
    policy = agentgym.OpenAIPolicy(server.base_url, "m", retry_backoff=0.01)
    with pytest.raises(agentgym.ModelError) as caught:
        await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    message = str(caught.value)
    where, _, what = message.partition(" answered 200 ")
    assert where == f"{server.base_url}/chat/completions" and fault in what
    assert "\n" not in message
    assert len(server.requests) == 1  # a broken answer is not asked again on the spot


@pytest.mark.parametrize("case", ["html", "message null", "logprob missing"])
def test_its_episodes_end_infra_error_not_error(answering: Any, case: str) -> None:
    """The eval exited 1 (every episode ``error``) where a 502 gives 75 and ``--resume``."""
    policy = agentgym.OpenAIPolicy(answering(BODIES[case][0]).base_url, "m")
    trajectories = agentgym.rollout("calculator", policy, num_tasks=2)
    assert [t.status for t in trajectories] == ["infra_error", "infra_error"]
    assert all("answered 200" in (t.error or "") for t in trajectories)


async def test_a_whole_chat_completion_still_plays(answering: Any) -> None:
    """The checks pass what a server may leave out: no logprobs, no ids, no finish reason."""
    bare = {"choices": [{"message": {"role": "assistant", "content": None}}]}
    policy = agentgym.OpenAIPolicy(answering(json.dumps(bare).encode()).base_url, "m")
    completion = await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    assert completion == agentgym.Completion(text="")


#: Knobs a server refuses with 400, as the in-process engines refuse them.
REFUSED = [
    {"temperature": -1}, {"temperature": math.nan}, {"temperature": math.inf},
    {"temperature": "0.7"}, {"top_p": 0}, {"top_p": 1.5}, {"min_p": 2}, {"top_k": -5},
    {"max_tokens": 0}, {"max_tokens": 1.5}, {"seed": "7"},
]  # fmt: skip


@pytest.mark.parametrize("sampling", REFUSED, ids=str)
def test_a_knob_the_server_refuses_is_a_config_error_up_front(sampling: dict[str, Any]) -> None:
    with pytest.raises(agentgym.ConfigError) as caught:
        agentgym.OpenAIPolicy("http://127.0.0.1:1/v1", "m", sampling=sampling)
    with pytest.raises(agentgym.ConfigError) as engine:
        SamplingConfig(**sampling)
    assert str(caught.value) == str(engine.value)  # the in-process engine's words


def test_knobs_a_server_takes_are_kept_as_given() -> None:
    """None is the server's default; knobs SamplingConfig does not have are the server's."""
    sampling = {"temperature": 0, "top_p": 1, "max_tokens": None, "presence_penalty": 0.5}
    policy = agentgym.OpenAIPolicy("http://127.0.0.1:1/v1", "m", sampling=sampling)
    assert policy.sampling == sampling
