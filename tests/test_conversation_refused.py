"""A conversation the model's own turns made unservable is truncated and scored.

Llama 3's chat template refuses an assistant turn with two tool calls ("This model only
supports single tool-calls at once!"), and vLLM's server answers that refusal with HTTP 400.
Were it an infrastructure failure, the episode would be ``infra_error``: dropped from its
group, never scored, so a model could escape a low reward by writing two calls. The template
here reproduces that behaviour (written for the test). The in-process engine is a scripted
`TokenPolicy` (what is under test is the episode's bookkeeping and the real renderer); the
remote server is a FastAPI app on loopback that renders the same template, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentgym import Rubric, ToolCall, ToolEnv, arollout, get_parser
from agentgym.engine.tiny import make_tokenizer
from tests.conftest import require
from tests.engine.episodes import IdsPolicy
from tests.test_tool_env import add

SINGLE_CALLS_ONLY = (
    "{%- for m in messages -%}"
    "{%- if m.tool_calls is defined and m.tool_calls and m.tool_calls | length > 1 -%}"
    "{{- raise_exception('This model only supports single tool-calls at once!') -}}"
    "{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- if m.tool_calls is defined and m.tool_calls -%}"
    "{%- for c in m.tool_calls %}<tool_call>{{ c.function.name }}</tool_call>{% endfor -%}"
    "{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
TWO_CALLS = get_parser("hermes").render(
    "", [ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})]
)


def says_3(completion: str) -> float:
    return float("3" in completion)


def env() -> ToolEnv:
    return ToolEnv([add], tasks=[{"prompt": "1 + 2?"}], rubric=Rubric([says_3]))


async def test_the_in_process_engine_truncates_when_the_template_refuses_the_models_turn() -> None:
    tokenizer = make_tokenizer()
    turn = [*tokenizer.encode(TWO_CALLS, add_special_tokens=False), tokenizer.eos_token_id]
    policy = IdsPolicy([turn, turn], template=SINGLE_CALLS_ONLY)

    [t] = await arollout(env, policy, tasks=[0], seed=0)

    assert t.status == "truncated" and t.final_reward == 0.0, t.error  # scored, not dropped
    assert len(t.turns) == 1 and len(policy.prompts) == 1
    assert "the chat template refused the conversation after the model's turns" in (
        t.info["truncated_by"]
    )
    assert "single tool-calls at once" in t.info["truncated_by"]


@pytest.fixture
def chat_server() -> Iterator[str]:
    """An OpenAI-compatible ``/chat/completions`` that renders `SINGLE_CALLS_ONLY` as vLLM's
    server does (400 when the template raises) and answers `TWO_CALLS`; ``refuse`` in the
    system prompt makes it refuse every request (a bad request of ours, not the model's)."""
    require("fastapi")
    require("uvicorn")
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from agentgym.serve._thread import serve_in_thread

    tokenizer = make_tokenizer()
    tokenizer.chat_template = SINGLE_CALLS_ONLY
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def complete(body: dict[str, Any]) -> JSONResponse:
        messages = body["messages"]
        if "refuse" in messages[0]["content"]:
            return JSONResponse({"object": "error", "message": "unknown sampling knob"}, 400)
        try:
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # vLLM: a template error is the request's, HTTP 400
            return JSONResponse({"object": "error", "message": str(exc)}, 400)
        message = {"role": "assistant", "content": TWO_CALLS}
        return JSONResponse({"choices": [{"message": message, "finish_reason": "stop"}]})

    with serve_in_thread(app) as url:
        yield url


async def test_a_server_refusing_the_models_turn_truncates_a_bad_request_is_infra(
    chat_server: str,
) -> None:
    from agentgym import OpenAIPolicy

    policy = OpenAIPolicy(chat_server + "/v1", "m", max_retries=0)
    [t] = await arollout(env, policy, tasks=[0], seed=0)
    assert t.status == "truncated" and t.final_reward == 0.0, t.error
    assert len(t.turns) == 1
    assert "the server refused the conversation after the model's turns" in t.info["truncated_by"]
    assert "single tool-calls at once" in t.info["truncated_by"]

    class FewShot(ToolEnv):  # an assistant message in the first prompt is not the model's
        def build_prompt(self, task: dict[str, Any]) -> list[dict[str, Any]]:
            roles = ("system", "user", "assistant", "user")
            return [{"role": r, "content": c} for r, c in zip(roles, ("refuse", "1?", "1", "2?"))]

    def refused() -> ToolEnv:  # the first request refused: nothing the model wrote
        return FewShot([add], tasks=[{"prompt": "1 + 2?"}])

    [first] = await arollout(refused, policy, tasks=[0], seed=0)
    assert first.status == "infra_error" and "answered 400" in (first.error or "")
    await policy.aclose()
