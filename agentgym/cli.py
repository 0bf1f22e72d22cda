"""The ``agentgym`` command: ``list``, ``check ENV``, ``eval ENV``, ``sft``, ``sandbox ...``.

User mistakes (unknown env, bad option) print one line naming the fix and exit with code 2,
before anything is written; results are written atomically at the end of a run.

``eval --policy vllm`` samples with the in-process engine (`agentgym.engine.VLLMPolicy`, token
in / token out, no server; ``--policy hf``: `HFPolicy`, transformers, where vLLM is missing);
its rollout mode is decided on the same conversation that ``check --model`` reports on, so the
two agree.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Column, Table
from rich.text import Text

from ._check import PLAY_SECONDS
from ._check import check as run_checks
from ._cli_common import (
    ChatTemplateKwargsOption,
    EnvArgOption,
    parse_env_args,
    parse_template_kwargs,
    print_error,
    stdout,
)
from ._errors import ConfigError, Error
from ._eval_cli import evaluate
from ._quick_exit import skip_final_collection
from ._registry import make, registered_envs, resolve_id
from ._stop import exit_code_after_stop, exit_on_sigterm

app = typer.Typer(help="Multi-turn agentic RL environments for LLMs.", no_args_is_help=True)


@app.command("list")
def list_envs() -> None:
    """List registered environments (one that cannot be built here says why)."""
    env_ids = registered_envs()
    table = Table(  # ids whole at any width: a user copies them into `make` and configs
        Column("id", no_wrap=True, min_width=max(map(len, env_ids), default=2)),
        Column("tools", overflow="fold"),
        "tasks",
        "description",
    )
    for env_id in env_ids:
        try:
            env = make(env_id)
        except Error as exc:  # a missing extra or service: the row says what to do
            table.add_row(env_id, "-", "-", Text(f"not available here: {exc}", style="yellow"))
            continue
        doc = (type(env).__doc__ or "").strip().splitlines()
        table.add_row(
            env_id,
            ", ".join(getattr(env, "tools", {})) or "-",
            str(len(getattr(env, "tasks", ()))),
            doc[0].replace("``", "`") if doc else "",  # reST literals as Markdown ones
        )
        env.close()
    stdout.print(table)


@app.command("check")
def check_env(
    env: Annotated[str, typer.Argument(help="Env id or short name, e.g. calculator.")],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--model",
            "--tokenizer",
            help="Model (or tokenizer) folder: also check its chat template and report the "
            "rollout mode (concat / per_turn) the engine gives it.",
        ),
    ] = None,
    chat_template_kwargs: ChatTemplateKwargsOption = None,
    episode_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds each check that plays episodes may take before it fails."
        ),
    ] = PLAY_SECONDS,
    env_arg: EnvArgOption = [],  # noqa: B006
) -> None:
    """Pre-flight an env: Gymnasium API, tool schemas, parser and chat-template round trips."""
    results = run_checks(
        resolve_id(env),
        tokenizer=tokenizer,
        chat_template_kwargs=parse_template_kwargs(chat_template_kwargs),
        episode_timeout=episode_timeout,
        **parse_env_args(env_arg),
    )
    table = Table("check", "result", "detail")
    styles = {"pass": "green", "warn": "yellow", "skip": "yellow", "FAIL": "red"}
    for r in results:
        table.add_row(r.name, Text(r.verdict, style=styles[r.verdict]), r.detail)
    stdout.print(table)
    for r in results:  # a failure's whole traceback, where a table cell would wrap it
        if r.trace:
            stdout.print(f"traceback of {r.name}:\n{r.trace}", soft_wrap=True, highlight=False)
    if not all(r.passed for r in results):
        raise typer.Exit(1)


app.command("eval")(evaluate)


def _mount_commands() -> None:
    """The commands of the other packages; their modules import nothing optional at the top.

    So every command is listed on a base install, and one whose extra is missing says which
    extra to install when it runs (tests/test_base_install.py).
    """
    from .runs._cli import app as runs_app
    from .runs._cli import sweep
    from .sandboxes._cli import app as sandbox_app
    from .serve._cli import serve
    from .trainers._cli import export, train
    from .trainers._sft_cli import sft

    app.command("train")(train)
    app.command("sft")(sft)
    app.command("export")(export)
    app.command("sweep")(sweep)
    app.command("serve")(serve)
    app.add_typer(sandbox_app, name="sandbox", help="Build, list, prune and benchmark sandboxes.")
    app.add_typer(runs_app, name="runs", help="List, show and compare indexed runs.")


_mount_commands()


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2.

    Infrastructure that failed before a run began (a rollout server the dry run cannot reach)
    is one line and 75, as in a run: a queue tries it again, and 1 means a bug of ours.

    Without standalone mode the app returns a command's ``typer.Exit`` code instead of
    exiting (a failed ``check`` is 1); it must reach `sys.exit`, or every run exits 0.
    """
    skip_final_collection()
    exit_on_sigterm()
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except (ConfigError, typer.TyperException) as exc:  # typer's usage errors derive from it
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message:  # empty when typer already printed the help (no arguments given)
            print_error(message)
        sys.exit(2)
    except Error as exc:  # infrastructure (a server that would not start ...): not the user's
        from .runs._track import exit_code_of  # the runs' own codes: 75 for an InfraError

        print_error(str(exc))
        sys.exit(exit_code_of(exc))
    # a command's return value is no code; typer returns 130 for a KeyboardInterrupt
    sys.exit(exit_code_after_stop(code) if isinstance(code, int) else 0)
