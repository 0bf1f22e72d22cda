"""OpenAPI 3 -> tools: every operation of a service becomes one tool, called over HTTP.

A service already describes itself: its OpenAPI document names each operation
(``operationId``), says what it does, and gives a JSON schema for each path, query and body
parameter. `openapi_tools` turns that into `Tool`s, so an env over a real HTTP API is written
without restating its interface by hand, and works for any OpenAPI 3 document and base URL.

How a call is classified, so that the model is scored only on its own mistakes:

- HTTP 2xx/3xx: the tool message is ``{"status": ..., "body": ...}`` (the JSON body, or text).
- HTTP 4xx: the model asked for something the service refused; a `ToolError` naming the
  status and the service's ``detail`` goes back to the model as a tool message.
- HTTP 429 or 503: the service is overloaded or down, whoever asked: tried again after
  `_service_faults.BUSY_WAITS` (a 503 only for a safe method), then an `InfraError`, so the
  episode is ``infra_error`` and never a reward of 0.
- a connection failure, a timeout or another 5xx: the service failed, but the model shaped
  the request, and an input can break a service (a 500 on a character it cannot handle, a
  query that hangs it). As an `InfraError` the episode would be dropped, not scored, so a
  model could escape a low reward by breaking the service. With a ``probe`` (a path any
  working service answers, e.g. ``/health``) the call's failure is the model's `ToolError`
  while the service answers the probe, and an `InfraError` only when it does not; a safe
  method (GET ...) that failed is first sent once more, not after a timeout. Without a
  ``probe`` every such failure is an `InfraError`.
- a 404 is the model's (a path parameter naming nothing) once the probe has answered under
  the same base URL; a tool's first 404 asks it, and a probe that 404s too is an `InfraError`
  (a base URL without the service's path prefix would make every call the model's 404).

Header and cookie parameters are not offered to the model: they are the client's business
(credentials, a tenant id), set on the `httpx.AsyncClient` the tools send with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from . import _service_faults as faults
from ._errors import ConfigError, InfraError, ToolError
from ._tools import Tool

if TYPE_CHECKING:
    import httpx  # imported on the first call: building tools never loads it

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})  # sent again without harm
Location = Literal["path", "query", "body"]

#: Picks the client a call sends with, given the env the tool was called from (injected).
ClientFactory = Callable[[Any], "httpx.AsyncClient"]


@dataclass(frozen=True)
class Argument:
    """One tool argument: where it goes in the request and under which name."""

    name: str  # the property in the tool's schema
    location: Location
    key: str  # its name in the request; "" for a body sent whole


@dataclass(frozen=True)
class Operation:
    """One OpenAPI operation, with its parameters merged into one JSON schema."""

    name: str
    method: str
    path: str
    description: str
    parameters: dict[str, Any]
    arguments: tuple[Argument, ...]

    def request(self, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any], Any]:
        """The (path, query, JSON body) of a call with schema-valid ``arguments``.

        Path values are percent-encoded whole (a ``/`` cannot reach another route), and
        ``.``/``..`` are refused: HTTP clients resolve them as steps up the path.
        """
        path, query, body = self.path, {}, None
        for arg in self.arguments:
            if arg.name not in arguments or arguments[arg.name] is None:
                continue
            value = arguments[arg.name]
            if arg.location == "path":
                text = value if isinstance(value, str) else json.dumps(value)
                if text in (".", ".."):
                    raise ToolError(f"path parameter {arg.name!r} cannot be {text!r}")
                path = path.replace("{" + arg.key + "}", quote(text, safe=""))
            elif arg.location == "query":
                query[arg.key] = json.dumps(value) if isinstance(value, bool) else value
            elif arg.key:
                body = {**(body or {}), arg.key: value}
            else:
                body = value
        return path, query, body


def operations(doc: Mapping[str, Any]) -> list[Operation]:
    """Every operation of an OpenAPI 3 document, in document order.

    Raises `ConfigError` for a document that is not OpenAPI 3, an operation without an
    ``operationId``, a duplicate id, a ``$ref`` that is missing or cyclic, or two
    arguments of one operation that would get the same name.
    """
    if not str(doc.get("openapi", "")).startswith("3."):
        raise ConfigError(
            f"expected an OpenAPI 3 document (an 'openapi: 3.x' field), got "
            f"openapi={doc.get('openapi')!r}; convert Swagger 2 documents first"
        )
    found: dict[str, Operation] = {}
    for path, item in (doc.get("paths") or {}).items():
        if "$ref" in item:
            item = _lookup(item["$ref"], doc)  # only what tools use is resolved (not responses)
        shared = item.get("parameters", [])
        for method in _METHODS:
            if method in item:
                op = _operation(doc, path, method, item[method], shared)
                if op.name in found:
                    raise ConfigError(
                        f"two operations have operationId {op.name!r}; ids must be unique"
                    )
                found[op.name] = op
    return list(found.values())


def openapi_tools(
    doc: Mapping[str, Any],
    base_url: str,
    *,
    client: ClientFactory | None = None,
    timeout: float = 30.0,
    probe: str | None = None,
) -> list[Tool]:
    """One async `Tool` per operation of ``doc``, sending requests to ``base_url``.

    Args:
        doc: the OpenAPI 3 document (e.g. a service's ``/openapi.json``, parsed).
        base_url: the service's root, e.g. ``http://127.0.0.1:8000``; paths are appended.
        client: returns the `httpx.AsyncClient` to send with, given the calling env (tools
            ask for ``env``): e.g. one per episode carrying its tenant header. None: a fresh
            client for every call.
        timeout: seconds one request may take in all; past it the call has failed.
        probe: a path (``/health``, a plain list) that a working service answers with 2xx to
            a GET from the same client; it decides whether a failed call (5xx, timeout,
            connection) was the model's doing (`ToolError`) or the service's (`InfraError`).
            None: every failed call is an `InfraError` (see the module docstring for why a
            service a model's input can break wants one).
    """
    _check_doc(doc)
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"base_url must be the service's root URL, e.g. 'http://127.0.0.1:8000', "
            f"got {base_url!r}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    root = base_url.rstrip("/")
    if probe is not None and not (isinstance(probe, str) and probe.startswith("/")):
        raise ConfigError(f"probe must be a path starting with '/', got {probe!r}")
    return [_tool(op, root, client, timeout, probe) for op in operations(doc)]


def _check_doc(doc: Any) -> None:
    """A document given as anything but the parsed document is refused, naming the fix."""
    if isinstance(doc, Mapping):
        return
    if isinstance(doc, str) and doc.startswith(("http://", "https://")):
        fix = f"fetch and parse it first: openapi_tools(httpx.get({doc!r}).json(), ...)"
    elif isinstance(doc, str | bytes) and doc.lstrip()[:1] in ("{", b"{"):
        fix = "parse it first: openapi_tools(json.loads(text), ...)"
    elif isinstance(doc, str | os.PathLike):
        fix = (
            f"read and parse the file first: "
            f"openapi_tools(json.loads(pathlib.Path({os.fspath(doc)!r}).read_text()), ...)"
        )
    elif hasattr(doc, "json") and hasattr(doc, "status_code"):
        fix = "parse the response first: openapi_tools(response.json(), ...)"
    else:
        fix = "parse it into a dict first"
    raise ConfigError(
        f"openapi_tools needs the OpenAPI document as a parsed dict, got a "
        f"{type(doc).__name__}; {fix}"
    )


class _CallFailed(InfraError):
    """A call the service failed on (5xx, timeout, connection); whose fault `_blamed` decides."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _tool(
    op: Operation, root: str, client: ClientFactory | None, timeout: float, probe: str | None
) -> Tool:
    root_answers = False  # the probe answered 2xx under ``root``: a 404 is the arguments'

    async def call(env: Any = None, **arguments: Any) -> dict[str, Any]:
        nonlocal root_answers
        path, query, body = op.request(arguments)
        http = None if client is None else client(env)
        send = functools.partial(
            _send, http, op.method, root + path, timeout, params=query, json=body
        )
        try:
            response = await _served(send, op.method in _SAFE_METHODS)
            if response.status_code == 404 and probe is not None and not root_answers:
                await _check_root(op.name, root + path, http, root, probe, timeout)
                root_answers = True
            return _outcome(op.name, response)
        except _CallFailed as failure:
            if probe is None:
                raise InfraError(f"{op.name}: {failure}") from failure
            return await _blamed(op, send, failure, http, root + probe, timeout)

    call.__name__ = op.name
    return Tool(
        fn=call,
        name=op.name,
        description=op.description,
        parameters=op.parameters,
        injected=frozenset({"env"}),
        timeout=None,  # timed in `_send`: a slow service is blamed as a failed call is
        is_async=True,
    )


async def _send(
    http: httpx.AsyncClient | None, method: str, url: str, timeout: float, **request: Any
) -> httpx.Response:
    """One request under ``timeout``; a timeout or transport failure is `_CallFailed`."""
    import httpx

    try:
        async with asyncio.timeout(timeout):
            if http is None:
                async with httpx.AsyncClient() as own:
                    return await own.request(method, url, timeout=timeout, **request)
            return await http.request(method, url, timeout=timeout, **request)
    except TimeoutError as exc:
        raise _CallFailed(f"no response from {url} within {timeout:g} s", True) from exc
    except httpx.TransportError as exc:  # refused, reset, timed out ...
        raise _CallFailed(f"{type(exc).__name__}: {exc} ({url})") from exc
    # anything else (arguments that cannot be encoded ...) is the model's: a ToolError


async def _served(send: Callable[[], Awaitable[httpx.Response]], safe: bool) -> httpx.Response:
    """The response to a call, tried again after `faults.BUSY_WAITS` while it is busy."""
    response = await send()
    for wait in faults.BUSY_WAITS:
        if not faults.ask_again(response.status_code, safe):
            break
        await asyncio.sleep(wait)
        response = await send()
    return response


async def _blamed(
    op: Operation,
    send: Callable[[], Awaitable[httpx.Response]],
    failure: _CallFailed,
    http: httpx.AsyncClient | None,
    probe_url: str,
    timeout: float,
) -> dict[str, Any]:
    """The call's result, sent again; else its failure, the model's while the service is up.

    A safe method is sent once more (a failure that passes, a replica restarting, is nobody's;
    not after a timeout, which would spend the call's time twice). Then the probe: a service
    that answers it works, so the model's arguments broke this call.
    """
    if op.method in _SAFE_METHODS and not failure.timed_out:
        with contextlib.suppress(_CallFailed):
            return _outcome(op.name, await send())
    probe_failure = await _probe_failure(http, probe_url, timeout)
    if probe_failure is not None:
        raise InfraError(
            f"{op.name}: {failure}; the probe {probe_url} fails too ({probe_failure})"
        ) from failure
    raise ToolError(
        f"{op.name} failed: {failure}; the service answers other requests, so change the arguments"
    ) from failure


async def _check_root(
    name: str, url: str, http: httpx.AsyncClient | None, root: str, probe: str, timeout: float
) -> None:
    """Raise `InfraError` when the probe 404s too: ``root`` lacks the service's path prefix.

    Why: a ``base_url`` without the prefix the API is mounted under makes every call a 404,
    which reads as the model's tool error, so a whole run would score 0 with nothing said.
    Asked on a tool's first 404 only; a probe that answers clears the tool for good.
    """
    failure = await _probe_failure(http, root + probe, timeout)
    if failure is not None:
        raise InfraError(
            f"{name}: HTTP 404 for {url}, and the probe "
            f"{root}{probe} fails too ({failure}); is base_url {root!r} missing the path "
            "prefix the service is mounted under?"
        )


async def _probe_failure(http: httpx.AsyncClient | None, url: str, timeout: float) -> str | None:
    """How a GET of ``url`` failed; None when it answers 2xx (`faults.PROBE_TRIES` tries).

    Each try has `faults.PROBE_TIMEOUT`. A 404 or 405 says the probe path is wrong, not that
    the service is down: the answer names ``probe=``.
    """
    failure = "no answer"
    for _ in range(faults.PROBE_TRIES):
        try:
            response = await _send(http, "GET", url, min(faults.PROBE_TIMEOUT, timeout))
        except _CallFailed as exc:
            failure = str(exc)
            continue
        if response.is_success:
            return None
        failure = f"HTTP {response.status_code}"
        if response.status_code in (404, 405):
            return (
                f"{failure}: the service answers, but not this path; give openapi_tools "
                "probe= a path it answers a GET to with 2xx, such as '/health'"
            )
    return failure


def _outcome(name: str, response: httpx.Response) -> dict[str, Any]:
    """The tool message for a response, or the error its status calls for."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    status = response.status_code
    if status in faults.BUSY:
        raise InfraError(f"{name}: the service is busy or down (HTTP {status}): {str(body)[:500]}")
    if status >= 500:
        raise _CallFailed(f"the service failed with HTTP {status}: {str(body)[:500]}")
    if status >= 400:
        detail = body.get("detail", body) if isinstance(body, dict) else body
        if not isinstance(detail, str):
            detail = json.dumps(detail, ensure_ascii=False)
        raise ToolError(f"HTTP {status} from {name}: {detail[:1000]}")
    return {"status": status, "body": body}


def _operation(
    doc: Mapping[str, Any], path: str, method: str, spec: Mapping[str, Any], shared: list[Any]
) -> Operation:
    name = spec.get("operationId")
    if not name:
        raise ConfigError(f"{method.upper()} {path} has no operationId; tools are named by it")
    params: dict[tuple[str, str], dict[str, Any]] = {}
    for raw in [*shared, *spec.get("parameters", [])]:  # the operation's win over the path's
        param = _resolve(raw, doc)
        params[(param["in"], param["name"])] = param
    args: list[tuple[Argument, dict[str, Any], bool]] = []
    for (where, key), param in params.items():
        location: Location = "path" if where == "path" else "query"
        if where != location:  # header and cookie: the client's business
            continue
        schema = dict(param.get("schema", {}))  # resolved with the parameter
        if param.get("description"):
            schema["description"] = param["description"]
        required = bool(param.get("required")) or location == "path"
        args.append((Argument(key, location, key), schema, required))
    args = _unique_names(name, [*args, *_body_arguments(spec, doc)])
    parameters = {
        "type": "object",
        "properties": {a.name: schema for a, schema, _ in args},
        "required": [a.name for a, _, required in args if required],
        "additionalProperties": False,
    }
    texts = (spec.get("summary"), spec.get("description"))
    description = "\n\n".join(t.strip() for t in texts if t) or f"{method.upper()} {path}"
    return Operation(
        name, method.upper(), path, description, parameters, tuple(a for a, _, _ in args)
    )


def _unique_names(
    operation: str, args: list[tuple[Argument, dict[str, Any], bool]]
) -> list[tuple[Argument, dict[str, Any], bool]]:
    """The arguments, those with a clashing name renamed after their place.

    A path and a body ``id`` become ``path_id`` and ``body_id``; ``env``, the name tools are
    given their env under, becomes e.g. ``query_env``.
    """
    names = [a.name for a, _, _ in args]
    renamed = [
        (replace(a, name=f"{a.location}_{a.key or 'body'}"), schema, required)
        if names.count(a.name) > 1 or a.name == "env"
        else (a, schema, required)
        for a, schema, required in args
    ]
    names = [a.name for a, _, _ in renamed]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ConfigError(
            f"operation {operation!r}: more than one argument is named {clashes}, even after "
            "prefixing clashing names with their place; rename one in the document"
        )
    return renamed


def _body_arguments(
    spec: Mapping[str, Any], doc: Mapping[str, Any]
) -> list[tuple[Argument, dict[str, Any], bool]]:
    """A JSON body's properties as arguments of their own; any other body as ``body``."""
    if "requestBody" not in spec:
        return []
    body = _resolve(spec["requestBody"], doc)
    content = body.get("content", {})
    media = next((m for m in content if m == "application/json" or m.endswith("+json")), None)
    if media is None:
        raise ConfigError(
            f"operation {spec.get('operationId')!r}: only JSON request bodies "
            f"can be sent, this one is {sorted(content)}"
        )
    schema = _resolve(content[media].get("schema", {}), doc)
    needed = bool(body.get("required"))
    if schema.get("type") != "object" or "properties" not in schema:
        return [(Argument("body", "body", ""), schema, needed)]
    inner = set(schema.get("required", []))
    return [
        (Argument(key, "body", key), prop, needed and key in inner)
        for key, prop in schema["properties"].items()
    ]


def _resolve(node: Any, doc: Mapping[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every local ``$ref`` inlined and OpenAPI 3.0 quirks made JSON schema.

    ``title`` strings are dropped (they repeat the name and cost prompt tokens); 3.0's
    ``nullable`` and boolean ``exclusiveMinimum``/``exclusiveMaximum`` become their JSON
    schema 2020-12 forms, which tool arguments are validated with.
    """
    if isinstance(node, list):
        return [_resolve(item, doc, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            cycle = " -> ".join((*seen[seen.index(ref) :], ref))
            raise ConfigError(
                f"cyclic $ref {cycle}; a tool needs a finite schema, so break "
                "the cycle in the document"
            )
        target = {**_lookup(ref, doc), **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(target, doc, (*seen, ref))
    out = {
        k: _resolve(v, doc, seen)
        for k, v in node.items()
        if not (k == "title" and isinstance(v, str))
    }
    if out.pop("nullable", False) is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    for bound in ("Minimum", "Maximum"):
        flag = out.get(f"exclusive{bound}")
        if isinstance(flag, bool):
            del out[f"exclusive{bound}"]
            if flag and bound.lower() in out:
                out[f"exclusive{bound}"] = out.pop(bound.lower())
    return out


def _lookup(ref: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ConfigError(
            f"$ref {ref!r} is not local to the document ('#/...'); "
            "bundle external references into it first"
        )
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(f"$ref {ref!r} points at nothing: no {part!r} in the document")
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(f"$ref {ref!r} points at a {type(node).__name__}, not an object")
    return node
