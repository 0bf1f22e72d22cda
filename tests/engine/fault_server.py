"""A misbehaving OpenAI-compatible vLLM stand-in on loopback (FastAPI on uvicorn, in a thread).

It serves what `RemoteVLLMPolicy` and `VLLMFleet` call: ``/v1/models``, ``/v1/completions``
(token ids and logprobs back, the served name echoed as ``model``, as vLLM does),
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``. A test sets ``completion_fault`` or
``load_fault`` to one of the names below, and reads back what the server saw
(``completions``, ``loads``, ``unloads``) to check what really crossed the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from agentgym.serve._thread import serve_in_thread

#: What the stand-in samples for every prompt (before a fault changes it).
SAMPLED_IDS = [5, 6, 7]
SAMPLED_LOGPROBS = [-0.25, -0.5, -0.75]

COMPLETION_FAULTS = (
    "ok", "other_model", "unknown_model", "no_token_ids", "truncated", "no_logprobs",
    "short_token_ids", "short_logprobs", "out_of_vocab", "negative_id", "nan_logprob",
    "not_json", "partial_json", "http_500", "http_503", "http_404", "http_400", "context_400",
    "error_object", "hang", "reset", "early_length", "abort", "other_prompt",
)  # fmt: skip
LOAD_FAULTS = ("ok", "http_500", "no_route", "ack_not_listed", "ack_keep_old")


class FaultServer:
    """One stand-in server; ``completion_fault`` applies to every completion until changed.

    Args:
        model: the base model's served name.
        vocab: ids at or above this are outside the vocabulary (``out_of_vocab`` answers it).
    """

    def __init__(self, model: str = "tiny", vocab: int = 261) -> None:
        self.model = model
        self.vocab = vocab
        self.completion_fault = "ok"
        #: Completions ``completion_fault`` still applies to (None: all of them).
        self.fault_times: int | None = None
        self.load_fault = "ok"
        self.models_fault = "ok"
        self.served: set[str] = {model}
        #: Name the server really samples with when it keeps an old adapter (``ack_keep_old``).
        self.stuck_on: str | None = None
        self.completions: list[dict[str, Any]] = []
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.request_arrived = threading.Event()
        #: Set when the server stops: requests left hanging answer then.
        self.stopping = threading.Event()
        self.url = ""  # set by `fault_servers` once it serves

    # ---- the app ---------------------------------------------------------------------------
    def app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def without_adapter_api(request: Request, call_next: Any) -> Response:
            """``no_route``: vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such routes."""
            if self.load_fault == "no_route" and "lora_adapter" in request.url.path:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return await call_next(request)

        @app.get("/v1/models")
        async def models() -> Response:
            if self.models_fault == "not_json":
                return Response("<html>upstream down</html>", media_type="application/json")
            data = {"object": "list", "data": [{"id": n} for n in sorted(self.served)]}
            return JSONResponse(data)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.completions.append(body)
            self.request_arrived.set()
            fault = self.completion_fault
            if self.fault_times is not None:  # a passing fault: the next answers are good
                self.fault_times -= 1
                if self.fault_times <= 0:
                    self.completion_fault, self.fault_times = "ok", None
            return await self._complete(body, fault)

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request) -> Response:
            body = await request.json()
            self.loads.append(body["lora_name"])
            return self._load(body["lora_name"])

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request) -> Response:
            name = (await request.json())["lora_name"]
            self.unloads.append(name)
            if name not in self.served:
                return _error(404, f"The lora adapter '{name}' cannot be found.")
            self.served.discard(name)
            return Response("Success")

        return app

    def _load(self, name: str) -> Response:
        fault = self.load_fault
        if fault == "http_500":
            return _error(500, "LoRA rank 64 is above --max-lora-rank 8")
        if name in self.served:
            return _error(400, f"The lora adapter '{name}' has already been loaded.")
        if fault == "ack_keep_old":
            self.stuck_on = self.stuck_on or max(self.served - {self.model}, default=self.model)
        if fault != "ack_not_listed":
            self.served.add(name)
        return Response(f"Success: LoRA adapter '{name}' added successfully.")

    async def _complete(self, body: dict[str, Any], fault: str) -> Response:
        requested = body["model"]
        if requested not in self.served or fault == "http_404":
            return _error(404, f"The model `{requested}` does not exist.")
        if fault in ("http_500", "http_503"):
            return _error(int(fault[-3:]), "EngineCore encountered an issue")
        if fault == "http_400":
            return _error(400, "top_k must be -1 (disable), or at least 1, got 0.")
        if fault == "context_400":
            return _error(
                400,
                "This model's maximum context length is 2048 tokens. However, "
                "you requested 2100 tokens (2000 in the messages, 100 in the completion).",
            )
        if fault == "hang":
            while not self.stopping.is_set():  # until the client gives up (or the test ends)
                await asyncio.sleep(0.05)
            return _error(503, "shutting down")
        if fault == "reset":
            return _Reset()
        if fault == "not_json":
            return Response("<html>502 Bad Gateway</html>", media_type="application/json")
        choice, usage = self._choice(body, fault)
        answer = {"id": "cmpl-1", "object": "text_completion", "model": requested,
                  "choices": [choice], "usage": usage}  # fmt: skip
        if fault == "other_model" or self.stuck_on is not None:
            answer["model"] = self.stuck_on or self.model
        elif fault == "unknown_model":
            answer["model"] = "someone-elses-model"
        if fault == "error_object":
            answer = {"object": "error", "message": "EngineCore died", "type": "InternalError",
                      "code": 500}  # fmt: skip
        text = json.dumps(answer)
        if fault == "partial_json":
            text = text[: len(text) // 2]
        return Response(text, media_type="application/json")

    def _choice(self, body: dict[str, Any], fault: str) -> tuple[dict[str, Any], dict[str, int]]:
        """The answer vLLM would give, then the completion fault applied to it."""
        limit = int(body["max_tokens"])
        ids, logprobs = SAMPLED_IDS[:limit], SAMPLED_LOGPROBS[:limit]
        finish = "length" if len(SAMPLED_IDS) >= limit else "stop"
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids),
                 "total_tokens": len(body["prompt"]) + len(ids)}  # fmt: skip
        prompt_ids = list(body["prompt"])
        if fault == "short_token_ids":
            ids = ids[:-1]
        elif fault == "truncated":  # ids and logprobs agree, the usage count does not
            ids, logprobs = ids[:-1], logprobs[:-1]
        elif fault == "short_logprobs":
            logprobs = logprobs[:-1]
        elif fault == "out_of_vocab":
            ids = [*ids[:-1], self.vocab]
        elif fault == "negative_id":
            ids = [-1, *ids[1:]]
        elif fault == "nan_logprob":
            logprobs = [float("nan"), *logprobs[1:]]
        elif fault in ("early_length", "abort"):
            finish = "length" if fault == "early_length" else "abort"
        elif fault == "other_prompt":
            prompt_ids = prompt_ids[1:]
        choice: dict[str, Any] = {
            "index": 0, "text": "".join(chr(96 + i) for i in ids if 0 < i < 27),
            "finish_reason": finish, "stop_reason": None,
            "logprobs": {"tokens": [], "token_logprobs": logprobs, "top_logprobs": None,
                         "text_offset": []},
            "token_ids": ids, "prompt_token_ids": prompt_ids,
        }  # fmt: skip
        if fault == "no_token_ids":
            del choice["token_ids"]
        elif fault == "no_logprobs":
            choice["logprobs"] = None
        return choice, usage


class _Reset(Response):
    """Headers and half the body, then the connection is dropped (a crash mid-response)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"4096")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'{"choices": [{"tok',
                    "more_body": True})  # fmt: skip
        raise ConnectionResetError("the server died mid-response")


def _error(status: int, message: str) -> JSONResponse:
    """vLLM's error body (``ErrorResponse``)."""
    body = {"object": "error", "message": message, "type": "Error", "param": None,
            "code": status}  # fmt: skip
    return JSONResponse(body, status_code=status)


@contextmanager
def fault_servers(count: int, **kwargs: Any) -> Iterator[list[FaultServer]]:
    """``count`` stand-ins serving on loopback (`serve_in_thread`), stopped on exit."""
    servers = [FaultServer(**kwargs) for _ in range(count)]
    with contextlib.ExitStack() as stack:
        for server in servers:
            server.url = stack.enter_context(serve_in_thread(server.app()))
            stack.callback(server.stopping.set)  # runs first: hanging requests answer
        yield servers
