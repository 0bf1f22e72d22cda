"""Any of vLLM's tool parsers behind our `ToolCallParser` contract: ``get_parser("vllm:<name>")``.

Useful to parse exactly as a vLLM server started with ``--tool-call-parser <name>`` would, and
to cross-check our own parsers (``tests/parsers/test_vs_vllm.py``). vLLM is imported only when
such a parser is built; without it the error names the extra to install.

vLLM's parsers read their marker tokens (``<|python_tag|>``, ``[TOOL_CALLS]`` ...) from a
tokenizer. By default a tiny byte-level tokenizer from `agentgym.engine.tiny` is built with those
markers; pass the model's own tokenizer (object or path) to match a real model. For Mistral, the
presence of ``[ARGS]`` in the tokenizer switches vLLM to the v11+ ``name[ARGS]{...}`` format:
``get_parser("vllm:mistral", extra_tokens=("[ARGS]",))``.

``vllm:openai`` (gpt-oss) reads harmony text (``<|channel|>commentary to=functions.f
<|constrain|>json<|message|>{...}<|call|>``) with vLLM's `HarmonyParser`, which parses token
ids of the harmony encoding: the text is encoded with it first. Such turns cannot be rendered
(vLLM writes harmony prompts from messages with its own encoder), so `render` raises
`NotImplementedError` and `agentgym check` says "cannot render".

Differences from our parsers are by design and listed in ``docs/parsers.md``: vLLM returns a
malformed call as plain content and no calls, where ours report it in ``ParsedTurn.errors``.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from typing import Any

from .._errors import ConfigError
from . import deepseek_v3
from ._base import _PARSERS, ParsedTurn, ToolCall, ToolCallParser, json_loads

#: Marker tokens the default tokenizer carries, so most of vLLM's parsers can be built on it.
DEFAULT_MARKERS = (
    "<|python_tag|>",
    "[TOOL_CALLS]",
    deepseek_v3.CALLS_BEGIN,
    deepseek_v3.CALLS_END,
    deepseek_v3.CALL_BEGIN,
    deepseek_v3.CALL_END,
    deepseek_v3.SEP,
)
#: vLLM's parser for gpt-oss: a stub whose work `HarmonyParser` does.
HARMONY = "openai"


class _QuietWhileParsing(logging.Filter):
    """Drops a vLLM parser's log records made while this thread runs `VLLMToolParser.parse`.

    Why: vLLM's parsers log a full traceback (llama3_json's ``logger.exception`` on a stray
    ``{``) for text they then return as plain content, which `VLLMToolParser.parse` already
    reports; in `agentgym check` it landed between the rows. Other threads (a vLLM server in
    the same process) keep logging. One filter per logger, installed once: a flag of the
    parsing thread switches it, so a parse adds nothing to the logger's filters.
    """

    parsing = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.parsing, "on", False)  # a logger filters in the caller's thread


def _quiet_while_parsing(logger_name: str) -> None:
    """Give the logger ``logger_name`` its `_QuietWhileParsing` filter, once."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _QuietWhileParsing) for f in logger.filters):
        logger.addFilter(_QuietWhileParsing())


def _import_vllm() -> Any:
    """The ToolParserManager of vLLM, or a one-line ConfigError when vLLM is missing."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError as exc:
        raise ConfigError(
            f"vLLM tool parsers need vLLM ({exc}): pip install 'agentgym[vllm]'"
        ) from None
    return ToolParserManager


def _load_tokenizer(tokenizer: Any, extra_tokens: tuple[str, ...]) -> Any:
    """A tokenizer object from an object, a path, or None (the tiny default with markers)."""
    if tokenizer is None:
        from ..engine.tiny import make_tokenizer

        return make_tokenizer((*DEFAULT_MARKERS, *extra_tokens))
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.fspath(tokenizer))
    return tokenizer


class VLLMToolParser(ToolCallParser):
    """Adapts vLLM's tool parser registered as ``name`` (vLLM's ``--tool-call-parser`` value).

    Args:
        name: the vLLM parser name, e.g. ``"hermes"``, ``"llama3_json"``, ``"mistral"``.
        tokenizer: a tokenizer object, a path to one, or None for a tiny byte-level tokenizer
            that has the markers in `DEFAULT_MARKERS` plus ``extra_tokens``.
        tools: OpenAI ``tools`` schemas put on the request some parsers look at (tool-name
            checks); None sends none.
        extra_tokens: more marker tokens for the default tokenizer (ignored with ``tokenizer``).

    Raises:
        ConfigError: vLLM is not installed, or has no parser called ``name``.
    """

    def __init__(
        self,
        name: str,
        tokenizer: Any = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        extra_tokens: tuple[str, ...] = (),
    ) -> None:
        manager = _import_vllm()
        try:
            self._cls = manager.get_tool_parser(name)
        except KeyError:
            known = manager.list_registered()
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean 'vllm:{close[0]}'?" if close else ""
            raise ConfigError(
                f"vLLM has no tool parser {name!r}.{hint} Known: {', '.join(known)}"
            ) from None
        _quiet_while_parsing(self._cls.__module__)
        self.name = f"vllm:{name}"
        self.vllm_name = name
        self.tokenizer = _load_tokenizer(tokenizer, extra_tokens)
        self._extra_tokens = extra_tokens
        self._tools = tools or []
        self._request = self._make_request(tools)
        try:  # fail now, in one line, if the tokenizer lacks a marker this parser needs
            self._cls(self.tokenizer, self._request.tools)
        except Exception as exc:  # noqa: BLE001 - vLLM raises RuntimeError, ValueError, KeyError
            where = "the default tokenizer" if tokenizer is None else "this tokenizer"
            raise ConfigError(
                f"vLLM's {name!r} tool parser cannot be built on {where} ({exc}); pass the "
                f"model's tokenizer: get_parser('vllm:{name}', tokenizer=PATH), or with the "
                "CLI `check --model DIR` / `eval --policy vllm --model-path DIR`"
            ) from None
        self._render_kwargs: dict[str, Any] = {}
        if name == "mistral" and "[ARGS]" in self.tokenizer.get_vocab():
            self._render_kwargs["style"] = "args"  # what vLLM parses with a v11+ tokenizer

    @staticmethod
    def _make_request(tools: list[dict[str, Any]] | None) -> Any:
        """The minimal ChatCompletionRequest the parsers read (tools and tool_choice)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest(  # type: ignore[call-arg]  # vLLM's pydantic defaults
            model="agentgym",
            messages=[{"role": "user", "content": ""}],
            tools=tools or None,  # type: ignore[arg-type]  # pydantic validates the dicts
            tool_choice="auto" if tools else None,
        )

    def for_tools(self, tools: list[dict[str, Any]]) -> VLLMToolParser:
        """The same vLLM parser with ``tools`` on its requests, as a vLLM server has them."""
        return VLLMToolParser(
            self.vllm_name, self.tokenizer, tools=tools, extra_tokens=self._extra_tokens
        )

    def parse(self, text: str) -> ParsedTurn:
        """Run vLLM's non-streaming ``extract_tool_calls``; never raises (errors are recorded).

        The vLLM parser's own log stays quiet meanwhile (`_QuietWhileParsing`).
        """
        try:
            _QuietWhileParsing.parsing.on = True
            try:
                content, calls = self._extract(text)
            finally:
                _QuietWhileParsing.parsing.on = False
        except Exception as exc:  # noqa: BLE001 - a third-party parser may raise anything
            return ParsedTurn(content=text, errors=[f"vLLM parser {self.vllm_name!r}: {exc!r}"])
        turn = ParsedTurn(content=(content or "").strip())  # as ours: templates add the spacing
        written = self._written_ids(text, calls)
        for (name, raw, vllm_id), call_id in zip(calls, written, strict=True):
            try:
                arguments = json_loads(raw or "{}")  # ValueError when nested too deep, too
                if not isinstance(arguments, dict):
                    raise TypeError(f"arguments are a {type(arguments).__name__}, not an object")
            except (ValueError, TypeError) as exc:
                turn.errors.append(
                    f"vLLM returned call {name!r} with bad arguments {str(raw)[:200]!r}: {exc}"
                )
                continue
            turn.tool_calls.append(ToolCall(name=name, arguments=arguments, id=call_id or vllm_id))
        return turn

    def _extract(self, text: str) -> tuple[str | None, list[tuple[str, str, str]]]:
        """The content and (name, arguments JSON, id) calls vLLM reads in ``text``; may raise."""
        if self.vllm_name == HARMONY:
            return self._parse_harmony(text)
        parser = self._cls(self.tokenizer, self._request.tools)  # fresh: parsers keep state
        info = parser.extract_tool_calls(text, self._request)
        found = info.tool_calls if info.tools_called else []
        return info.content, [(c.function.name, c.function.arguments, c.id or "") for c in found]

    def _written_ids(self, text: str, calls: list[tuple[str, str, str]]) -> list[str]:
        """The id the model wrote for each call, as our parser of the same name reads it, or "".

        vLLM makes up a fresh id for every call (Mistral's 9 characters too), so the env's
        history, and the template's render of it, would show ids the model never wrote.
        """
        if not calls or self.vllm_name not in _PARSERS:
            return [""] * len(calls)
        ours = _PARSERS[self.vllm_name](**self._render_kwargs).parse(text).tool_calls
        return [
            ours[k].id if k < len(ours) and ours[k].name == name else ""
            for k, (name, _, _) in enumerate(calls)
        ]

    def _parse_harmony(self, text: str) -> tuple[str | None, list[tuple[str, str, str]]]:
        """Content and calls of gpt-oss harmony text, through vLLM's `HarmonyParser`."""
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
        from vllm.parser.harmony import HarmonyParser

        if "<|message|>" not in text:  # no harmony message at all: plain content, as in vLLM
            return text, []
        encoding = get_encoding()

        class Harmony(HarmonyParser):  # vLLM sets these on its own class per server
            tool_parser_cls = self._cls
            reasoning_parser_cls = None

        class HarmonyText:  # what the parser asks of a tokenizer: vocab, and decode on errors
            get_vocab = self.tokenizer.get_vocab
            decode = staticmethod(encoding.decode)

        ids = encoding.encode(text, allowed_special="all")
        parser = Harmony(HarmonyText(), self._request.tools)
        _, content, calls = parser.parse(text, self._request, model_output_token_ids=ids)
        return content, [(c.name, c.arguments, "") for c in calls or []]

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        """Render with our parser of the same name; vLLM parsers only parse."""
        if self.vllm_name == HARMONY:
            raise NotImplementedError(
                "vllm:openai (gpt-oss harmony) turns cannot be rendered: vLLM writes harmony "
                "prompts from messages with its own encoder, and agentgym has no harmony renderer"
            )
        if self.vllm_name not in _PARSERS:
            raise NotImplementedError(
                f"vLLM parsers only parse, and agentgym has no parser named "
                f"{self.vllm_name!r} to render with; known: {', '.join(sorted(_PARSERS))}"
            )
        ours = _PARSERS[self.vllm_name](**self._render_kwargs).for_tools(self._tools)
        return ours.render(content, tool_calls)
