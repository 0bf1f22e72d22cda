"""What every ``agentgym`` command shares: its consoles and the parsing of repeated options."""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ._durable import kernel_file_system
from ._errors import ConfigError


class PipedConsole(Console):
    """A `Console` whose reader may go away: ``agentgym eval ... | head -1`` is not a failure.

    Rich's default exits 1 when stdout's pipe closes: a finished eval was then recorded as a
    crash (``failed``, exit 1, which a queue never retries) and its last lines were lost.
    The rest of the output goes to /dev/null and the command ends as it would have.
    """

    def on_broken_pipe(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


#: Consoles that read no markup: what they print (templates, errors, paths) is the user's text,
#: and a '[/INST]' in it would otherwise be a markup error. Styles are `rich.text.Text`.
console = Console(stderr=True, markup=False)
stdout = PipedConsole(markup=False)


def folder_path(text: str | Path) -> Path:
    """A folder option's value as a `Path` (typer ``parser=``), refusing an empty one.

    Why: ``Path("")`` is the current folder, so ``--out "$OUT"`` with ``OUT`` unset wrote a
    run's files among whatever the shell's folder held. (The option's default comes as a Path.)
    A folder under /proc or /sys passed the writable check as root, and the run failed at
    its first write (``sft``: with a traceback, after the model loaded).
    """
    if isinstance(text, str) and not text.strip():
        raise typer.BadParameter("is empty; give a folder for the run's files (e.g. runs/eval)")
    path = Path(text)
    if (kernel := kernel_file_system(path)) is not None:
        raise typer.BadParameter(f"{path} {kernel}")
    return path


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs`` JSON as a dict (``'{"enable_thinking": false}'``)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'--chat-template-kwargs must be a JSON object, e.g. \'{{"enable_thinking": '
            f"false}}'; got {text!r} ({exc.msg})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    return value


#: Python's spellings of JSON's null, true and false: users type ``tool_timeout=None``, and
#: an option that takes a number or None refused the string 'None' (``'"None"'`` is that string).
_PYTHON_CONSTANTS: dict[str, Any] = {"None": None, "True": True, "False": False}


def key_value(pair: str, flag: str) -> tuple[str, str]:
    """A repeatable option's ``key=value``, split at the first ``=``; one line naming ``flag``."""
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{flag} takes key=value, got {pair!r}")
    return key.strip(), value


def parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value is read as JSON or None/True/False, else kept a string."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, value = key_value(pair, "--env-arg")
        if value in _PYTHON_CONSTANTS:
            kwargs[key] = _PYTHON_CONSTANTS[value]
            continue
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def print_error(message: str) -> None:
    """One ``error: ...`` line on stderr, its hidden characters escaped (`visible`).

    Why escaped: messages quote others' text (a server's error page, a file's line, a model's
    reply), whose escape sequences could clear the screen or write the reader's clipboard.
    """
    console.print(Text.assemble(("error:", "red"), " ", visible(message)), highlight=False,
                  soft_wrap=True)  # fmt: skip


def print_warning(message: str) -> None:
    """One ``warning: ...`` line, escaped as `print_error`'s is."""
    console.print(Text.assemble(("warning:", "yellow"), " ", visible(message)), highlight=False,
                  soft_wrap=True)  # fmt: skip


#: ``--chat-template-kwargs``, as each command that renders a chat template takes it.
ChatTemplateKwargsOption = Annotated[
    str | None,
    typer.Option(help="Chat-template variables as JSON, e.g. '{\"enable_thinking\": false}'."),
]
#: ``--env-arg key=value``, as each command that builds an env takes it.
EnvArgOption = Annotated[list[str], typer.Option(help="Env option key=value (repeatable).")]


class _Escapes(dict[int, str]):
    r"""`str.translate` table: a hidden character to its ``\xNN``/``\uNNNN`` escape.

    Hidden: the controls (C0, DEL, C1; newline and tab kept) and the format characters
    (category Cf: bidi overrides and isolates, zero-width characters). A U+202E in a run
    name printed ``gnp.exe`` as ``exe.png`` and reversed the cells after it. Each character
    is looked up once and cached: the table cannot list all of Unicode up front.
    """

    def __missing__(self, code: int) -> str:
        char = chr(code)
        hidden = unicodedata.category(char) in ("Cc", "Cf") and char not in "\t\n"
        self[code] = _escape(code) if hidden else char
        return self[code]


def _escape(code: int) -> str:
    r"""``code`` as Python writes it in a string literal: ``\x1b``, ``\u202e``, ``\U000e0001``."""
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_ESCAPES = _Escapes()


def visible(text: str) -> str:
    r"""``text`` with its hidden characters shown as escapes (newlines and tabs kept).

    Why: names, log lines and above all a model's output are other people's text; printed
    raw, an escape sequence in them clears the screen, hides text or writes the clipboard
    (OSC 52) of whoever reads them, and a bidi control reorders what is shown (`_Escapes`).
    """
    return text.translate(_ESCAPES)
