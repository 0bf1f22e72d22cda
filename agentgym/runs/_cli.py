"""``agentgym runs ls | show | compare | episodes | doctor`` and ``agentgym sweep``.

Ids may be given by a unique prefix. ``--db URL`` (or ``$AGENTGYM_RUNS_DB``) picks the database.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple, get_args

import typer
import yaml
from rich.table import Table
from rich.text import Text

from agentgym._cli_common import PipedConsole, visible
from agentgym._env import message_text
from agentgym._errors import ConfigError
from agentgym._trajectory import Status, Trajectory
from agentgym._yaml import load_cli_value

from ._episode_index import (
    MALFORMED,
    TRAJECTORY_FILES,
    Row,
    TrajectoryFilter,
    TrajectoryIndex,
    read_line,
    trajectories_in,
)
from ._folder import live_step, read_json
from ._jobs import check_job, parse_config, queue_checked_job
from ._queue import JobQueue
from ._store import RunStatus, RunStore, agentgym_home, new_run_id, took_folder

app = typer.Typer(help="List, show and compare indexed runs.", no_args_is_help=True)
console = PipedConsole(markup=False)  # names, configs and log lines are the user's text

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database URL or SQLite path (default: $AGENTGYM_RUNS_DB or "
                 "$AGENTGYM_HOME/runs.db)."),
]  # fmt: skip
_STATUS_COLOURS = {"finished": "green", "failed": "red", "running": "cyan", "queued": "blue"}
#: Figures shown by ``runs ls``, when a run has them.
_HEADLINE = ("reward/mean", "grpo/success", "reward/last", "sft/loss", "health/findings")


@app.command("ls")
def list_runs(
    db: DbOption = None,
    limit: Annotated[
        int, typer.Option(min=1, max=10**9, help="Most rows shown, newest first.")
    ] = 50,
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this state.")] = None,
) -> None:
    """List runs, newest first (runs whose process died are marked `interrupted`)."""
    store = RunStore(db)
    store.reconcile()
    table = Table("id", "kind", "name", "status", "exit", "step", "created", "figures")
    table.columns[0].no_wrap = True
    for run in store.list_runs(limit, status=status):
        shown = {k: v for k, v in run["figures"].items() if k in _HEADLINE}
        table.add_row(
            _text(run["id"]), _text(run["kind"]), _text(run["name"]), _coloured(run["status"]),
            _text(run["exit_code"]), _text(live_step(run)), _text(run["created_at"][:16]),
            ", ".join(f"{_text(k)}={_text(v)}" for k, v in shown.items()),
        )  # fmt: skip
    console.print(table)


@app.command("show")
def show_run(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    db: DbOption = None,
) -> None:
    """Everything the index holds about one run: status, folder, figures, config, error."""
    run = _find(RunStore(db), run_id)
    run = {**run, "step": live_step(run)}
    table = Table("field", "value", title=f"run {run['id']}")
    for key in ("kind", "name", "status", "exit_code", "source", "run_dir", "pid", "host",
                "created_at", "started_at", "ended_at", "step", "attempt", "sweep_id"):  # fmt: skip
        table.add_row(key, _coloured(run[key]) if key == "status" else _text(run[key]))
    for key, value in sorted(run["figures"].items()):
        table.add_row(_text(key), _text(value))
    console.print(table)
    config = yaml.safe_dump(run["config"], sort_keys=False).rstrip()
    console.print(visible(config), highlight=False)
    if run["error_tail"]:
        console.print(Text("last log lines:", style="red"))
        console.print(visible(run["error_tail"]), highlight=False)
    if _folder_gone(run):  # its figures read as the run's, its episodes are not there
        console.print(Text(visible(
            f"its folder {run['run_dir']} is gone (moved or deleted?): the row keeps that path; "
            "move the folder back there, or give its new path to `agentgym runs episodes` / "
            "`doctor`, which read a folder as it is"), style="yellow"))  # fmt: skip


@app.command("compare")
def compare_runs(
    first: Annotated[str, typer.Argument(help="Run id (or prefix).")],
    second: Annotated[str, typer.Argument(help="Run id (or prefix).")],
    db: DbOption = None,
) -> None:
    """Two runs side by side: their figures, and the config keys that differ."""
    store = RunStore(db)
    a, b = ({**r, "step": live_step(r)} for r in (_find(store, first), _find(store, second)))
    table = Table("", _text(a["id"]), _text(b["id"]), title="figures")
    for key in ("kind", "name", "status", "step"):
        table.add_row(key, _text(a[key]), _text(b[key]))
    for key in sorted(a["figures"].keys() | b["figures"].keys()):
        table.add_row(_text(key), *_told_apart(a["figures"].get(key), b["figures"].get(key)))
    console.print(table)
    differ = Table("config key", _text(a["id"]), _text(b["id"]), title="config differences")
    for key in sorted(a["config"].keys() | b["config"].keys()):
        if a["config"].get(key) != b["config"].get(key):
            differ.add_row(_text(key), _text(a["config"].get(key)), _text(b["config"].get(key)))
    console.print(differ if differ.row_count else "configs are identical")


@app.command("episodes")
def show_episodes(
    run: Annotated[
        str, typer.Argument(help="Run id (or prefix), run folder, or trajectories .jsonl file.")
    ],
    status: Annotated[
        list[str] | None, typer.Option(help="Only episodes with this status (repeatable).")
    ] = None,
    min_reward: Annotated[float | None, typer.Option(help="Only total reward >= this.")] = None,
    max_reward: Annotated[float | None, typer.Option(help="Only total reward <= this.")] = None,
    tool_errors: Annotated[
        bool, typer.Option("--tool-errors", help="Only episodes with a tool error.")
    ] = False,
    length_outliers: Annotated[
        bool,
        typer.Option("--length-outliers", help="Only completion lengths outside Tukey's fences."),
    ] = False,
    step: Annotated[int | None, typer.Option(help="Only a train run's eval at this step.")] = None,
    results_cut: Annotated[
        bool,
        typer.Option("--results-cut", help="Only episodes with a tool result cut at its cap."),
    ] = False,
    turns_cut: Annotated[
        bool,
        typer.Option("--turns-cut", help="Only episodes with a turn cut at the token limit."),
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="Most episodes printed.")] = 3,
    offset: Annotated[int, typer.Option(min=0, help="Matching episodes skipped first.")] = 0,
    db: DbOption = None,
) -> None:
    """Print a run's episodes in full: messages, tool calls, scores.

    Filtered as the dashboard's viewer filters them: reading episodes is how reward hacking is
    caught, and a terminal over SSH has no browser.
    """
    unknown = sorted(set(status or ()) - set(get_args(Status)))
    if unknown:
        raise ConfigError(f"--status {unknown[0]!r} is not a status; use one of "
                          f"{', '.join(get_args(Status))}")  # fmt: skip
    index = TrajectoryIndex(_trajectories_of(run, db))
    index.extend()
    where = TrajectoryFilter(
        min_reward, max_reward, tuple(status or ()), tool_errors=tool_errors,
        length_outliers=length_outliers, step=step, results_cut=results_cut, turns_cut=turns_cut,
    )  # fmt: skip
    keep = where.predicate(index)
    matched = [row for row in index.rows if keep(row)]
    shown = matched[offset : offset + limit]
    for row in shown:
        _print_episode(index, row)
    bad = f"; {index.bad_lines} lines are not trajectories" if index.bad_lines else ""
    where_from = f"{len(index.rows)} in {visible(str(index.path))}{bad}"
    if not shown:
        console.print(f"no episode to show: {len(matched)} match ({where_from})", highlight=False)
        return
    end = offset + len(shown)
    more = f"; the next: --offset {end}" if end < len(matched) else ""
    console.print(f"episodes {offset + 1}-{end} of {len(matched)} matching ({where_from}){more}",
                  highlight=False)  # fmt: skip


@app.command("doctor")
def doctor(
    run: Annotated[str, typer.Argument(help="Run id (or prefix), or a train or eval folder.")],
    db: DbOption = None,
) -> None:
    """What a run's figures say went wrong, and the fix (docs/troubleshooting.md).

    Reads a train run's metrics.jsonl, or an eval's trajectories.jsonl, so it works on a
    running, killed or copied run too. Exits 1 when it finds something, 0 when nothing matched.
    """
    from agentgym.trainers._report import run_findings

    folder = _folder_of(run, db)
    shown = visible(str(folder))
    findings = run_findings(folder)
    if not findings:
        console.print(f"{shown}: no known problem in its figures", highlight=False)
        return
    for finding in findings:
        console.print(Text(visible(f"[{finding.rule}] {finding.title}"), style="bold yellow"))
        console.print(visible(f"  {finding.evidence}\n  fix: {finding.fix}"), highlight=False)
    console.print(f"{len(findings)} finding(s) in {shown}; each rule is explained in "
                  "docs/troubleshooting.md", highlight=False)  # fmt: skip
    raise typer.Exit(1)


def _trajectories_of(run: str, db: str | None) -> Path:
    """The trajectories JSONL a ``runs episodes`` argument names: a file, a folder, or a run.

    Why files and folders too: an ``agentgym eval --out DIR`` with indexing off
    (``AGENTGYM_RUNS_DB=off``) or a copied folder has no row, and its episodes are still there.
    """
    given = Path(run).expanduser()
    if given.is_file():
        return given
    folder = _folder_of(run, db)
    found = trajectories_in(folder)
    if found is None:
        files = " or ".join(TRAJECTORY_FILES)
        raise ConfigError(f"{folder} holds no {files} yet; a train run writes its eval "
                          "episodes there, `agentgym eval --out` its episodes")  # fmt: skip
    return found


def _folder_of(run: str, db: str | None) -> Path:
    """The folder a ``runs doctor``/``episodes`` argument names: an existing folder, else a run's.

    Raises:
        ConfigError: the run has no folder yet (a queued job), or its folder is gone; said
            as the dashboard says it, not as a folder that holds nothing *yet*.
    """
    given = Path(run).expanduser()
    if given.is_dir():  # the folder first, as `_find` rules for every `runs` command
        return given
    row = _find(RunStore(db), run)
    folder = Path(row["run_dir"]) if row["run_dir"] else None
    if folder is not None and folder.is_dir():
        return folder
    what = f"run {row['id']} ({row['status']})"
    if folder is None or row["started_at"] is None:
        raise ConfigError(f"{what} has not started, so it has no folder yet; wait for it "
                          "(`agentgym runs ls`)")  # fmt: skip
    raise ConfigError(
        f"{what} has no folder {visible(str(folder))} any more (deleted or moved?); its row "
        f"is kept: restore the folder, or read the row with `agentgym runs show {row['id']}`"
    )


def _print_episode(index: TrajectoryIndex, row: Row) -> None:
    """A rule naming the episode and its outcome, then every message as `Env.render` shows it."""
    scores = ", ".join(f"{k} {_text(v)}" for k, v in row.scores.items())
    head = [f"#{row.index}", f"task {_text(row.task_index)}", f"group {row.group_index}"]
    head += [f"step {row.step}"] if row.step is not None else []
    head += [row.status, f"reward {_text(row.reward)}" + (f" ({scores})" if scores else ""),
             f"turns {row.turns}", f"tool calls {row.tool_calls}",
             f"tool errors {row.tool_errors}"]  # fmt: skip
    head += [f"tool results cut {row.results_cut}"] if row.results_cut else []
    head += [f"turns cut {row.turns_cut}"] if row.turns_cut else []
    console.rule()
    console.print(Text(visible(" · ".join(head)), style="bold"))
    try:
        episode: Trajectory = read_line(index, row)
    except MALFORMED as exc:  # indexed, yet a field read in full has the wrong type
        console.print(visible(f"(malformed: {type(exc).__name__}: {exc})"), highlight=False)
        return
    if episode.error:
        console.print(Text(visible(f"error: {episode.error}"), style="red"))
    for message in episode.messages:  # the model's text: its escape sequences are shown
        console.print(visible(message_text(message)) + "\n", highlight=False)


def sweep(
    source: Annotated[Path, typer.Argument(help="A config file (with --grid) or a folder.")],
    grid: Annotated[
        list[str] | None,
        typer.Option(help="key=v1,v2,...: one run per value (repeat for a product)."),
    ] = None,
    kind: Annotated[
        str, typer.Option(help="train, eval or sft, for configs without a 'kind:' key.")
    ] = "train",
    parallel: Annotated[int, typer.Option(min=1, help="Runs at once.")] = 1,
    retries: Annotated[
        int, typer.Option(min=0, help="Retries of a run that failed for an infrastructure cause.")
    ] = 2,
    runs_dir: Annotated[
        Path | None, typer.Option(help="Where run folders go (default $AGENTGYM_HOME/runs).")
    ] = None,
    db: DbOption = None,
) -> None:
    """Run every config of a grid or a folder, each with its own run id, through the queue.

    Configs are checked before anything runs; only infrastructure failures are retried.
    SIGTERM, SIGHUP or Ctrl-C stops the running jobs and cancels the ones not started.
    """
    jobs = _sweep_configs(source, grid or [], kind)
    for job in jobs:  # all of them before any row: a bad one leaves none behind
        try:
            warnings = check_job(job.kind, job.config)
        except ConfigError as exc:
            raise ConfigError(f"{job.name}: {exc}") from None
        for warning in warnings:
            console.print(f"warning: {job.name}: {warning}", highlight=False)
    store = RunStore(db)
    root = runs_dir or agentgym_home() / "runs"
    sweep_id = new_run_id()
    ids: list[str] = []  # the sweep's order, which its table keeps
    for job in jobs:
        ids.append(queue_checked_job(
            store, job.kind, job.config, runs_root=root, source="sweep", sweep_id=sweep_id,
            max_attempts=retries + 1, name=job.name,
        ))  # fmt: skip
    console.print(f"sweep {sweep_id}: {len(jobs)} runs, {parallel} at a time", highlight=False)
    queue = JobQueue(store, workers=parallel, sweep_id=sweep_id)
    stopped_by = asyncio.run(_run_sweep(queue))
    by_id = {run["id"]: run for run in store.list_runs(limit=None, sweep_id=sweep_id)}
    rows = [by_id[run_id] for run_id in ids if run_id in by_id]  # the sweep's order
    table = Table("id", "name", "status", "exit", "attempts", "last log line")
    table.columns[0].no_wrap = True
    for run in rows:
        tail = (run["error_tail"] or "").splitlines()[-1:] or [""]
        table.add_row(
            run["id"], _text(run["name"]), _coloured(run["status"]), _text(run["exit_code"]),
            str(run["attempt"]), _text(tail[0][:80]),
        )  # fmt: skip
    console.print(table)
    if stopped_by is not None:
        raise typer.Exit(128 + stopped_by)  # as the signal's own exit status reads
    if any(run["status"] != RunStatus.finished for run in rows):
        raise typer.Exit(1)


#: Signals that stop a sweep: ``kill``, a closed terminal, Ctrl-C.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


async def _run_sweep(queue: JobQueue) -> signal.Signals | None:
    """Run the sweep's jobs to the end; or, on a stop signal, stop them; returns that signal.

    Why: each job runs in a session of its own, which the signal never reaches; a sweep that
    died of it left its running job writing its folder with no one to record how it ended,
    and its queued jobs ``queued`` forever (no queue runs another sweep's jobs). Stopped, the
    running jobs get SIGTERM (SIGKILL after the queue's grace) and end ``interrupted``; the
    jobs left ``queued`` are ``cancelled``, saying why.
    """
    loop = asyncio.get_running_loop()
    stopping: list[tuple[signal.Signals, asyncio.Task[None]]] = []

    def stop(sig: signal.Signals) -> None:
        if stopping:  # a second signal: the shutdown under way ends the jobs already
            return
        console.print(f"{sig.name}: stopping the sweep's jobs (SIGTERM, then SIGKILL after "
                      f"{queue.grace_s:g} s)", highlight=False)  # fmt: skip
        stopping.append((sig, loop.create_task(queue.shutdown())))

    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        await queue.run(until_idle=True)
        if not stopping:
            return None
        sig, shutdown = stopping[0]
        await shutdown
        # still under the handlers: a second signal must not kill us half way through
        _cancel_queued(queue.store, queue.sweep_id, sig)
        return sig
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def _cancel_queued(store: RunStore, sweep_id: str | None, sig: signal.Signals) -> None:
    """Cancel the sweep's jobs still ``queued`` (not started, or re-queued to resume)."""
    why = (f"agentgym sweep was stopped ({sig.name}) before this job ran to its end; run "
           "the sweep again for it")  # fmt: skip
    for run in store.list_runs(limit=None, status=RunStatus.queued, sweep_id=sweep_id):
        store.request_cancel(run["id"], why=why)


class _SweepRun(NamedTuple):
    """One run of a sweep: its kind, its config, and its name (what tells it apart)."""

    kind: str
    config: dict[str, Any]
    name: str


def _sweep_configs(source: Path, grid: list[str], kind: str) -> list[_SweepRun]:
    """Every run: the grid's product over one file, or each file of a folder (named by it)."""
    if source.is_dir():
        if grid:
            raise ConfigError("--grid applies to one config file, not a folder")
        files = sorted(p for p in source.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        if not files:
            raise ConfigError(f"{source} holds no .yaml/.yml/.json config")
        return [_SweepRun(*_split_kind(_read_config(p), kind), _run_name(p.stem, [], i))
                for i, p in enumerate(files)]  # fmt: skip
    job_kind, base = _split_kind(_read_config(source), kind)
    axes = [_grid_axis(item) for item in grid]
    keys = [key for key, _ in axes]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):  # a later axis would win
        values = [item.partition("=")[2] for item in grid if item.partition("=")[0].strip() == key]
        raise ConfigError(f"--grid names {key!r} more than once; give its values in one --grid "
                          f"{key}={','.join(values)}")  # fmt: skip
    combos = itertools.product(*[[(key, v) for v in values] for key, values in axes])
    return [_SweepRun(job_kind, {**base, **dict(combo)}, _run_name(source.stem, combo, i))
            for i, combo in enumerate(combos)]  # fmt: skip


#: Longest sweep run name: `runs ls` stays readable, and the column holds 200 characters.
_NAME_MAX = 80


def _run_name(stem: str, combo: Sequence[tuple[str, Any]], index: int) -> str:
    """``<stem>-<key>=<value>,...``: what tells a sweep's runs apart, short and file-name safe.

    Why not ``<stem>-<index>``: `runs ls` could not tell the runs of a sweep apart, and
    sorted as text ``ev-10`` came before ``ev-2``. A name cut to `_NAME_MAX` ends with the
    run's index, so that cut names stay apart.
    """
    values = ",".join(f"{key}={_name_value(value)}" for key, value in combo)
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", f"{stem}-{values}" if values else stem)
    if len(name) <= _NAME_MAX:
        return name
    suffix = f"~{index}"
    return name[: _NAME_MAX - len(suffix)] + suffix


def _name_value(value: Any) -> str:
    """A grid value as it reads in a name (a list or a mapping as compact JSON)."""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return parse_config(text, f"config {path}")


def _split_kind(config: dict[str, Any], default: str) -> tuple[str, dict[str, Any]]:
    kind = str(config.pop("kind", default))
    return kind, config


def _grid_axis(item: str) -> tuple[str, list[Any]]:
    key, sep, values = item.partition("=")
    if not sep or not key or not values:
        raise ConfigError(f"--grid takes key=v1,v2,..., got {item!r}")
    parsed = [load_cli_value(v, f"--grid {item!r}") for v in values.split(",")]
    seen: list[Any] = []
    for value in parsed:  # a repeated value is the same run twice
        if value in seen:
            raise ConfigError(f"--grid {item!r} lists {value!r} twice; give each value once")
        seen.append(value)
    return key.strip(), parsed


def _find(store: RunStore, run_id: str) -> dict[str, Any]:
    """The run ``run_id`` names: an existing folder, else an id (prefix), else a folder's own id.

    Why the folder first: ``runs episodes`` and ``doctor`` read an existing folder as it is,
    and a folder named like an id prefix (``d7``) meant another run to ``runs show``.
    """
    if not run_id.strip():
        raise ConfigError("give a run id (or a unique prefix of one, or a run folder); see "
                          "`agentgym runs ls`")  # fmt: skip
    folder = Path(run_id).expanduser()
    if folder.is_dir():
        return _run_in(store, folder, run_id)
    run = store.find_run(run_id) or _by_own_id(store, run_id)
    if run is None:
        several = [r["id"] for r in store.list_runs(limit=None) if r["id"].startswith(run_id)]
        if len(several) > 1:
            shown = ", ".join(several[:5]) + (", ..." if len(several) > 5 else "")
            raise ConfigError(f"{run_id!r} is the start of {len(several)} run ids ({shown}); "
                              "give more of the id")  # fmt: skip
        raise ConfigError(f"no run with id {run_id!r} (nor a run folder of that name); see "
                          "`agentgym runs ls`")  # fmt: skip
    return run


def _run_in(store: RunStore, folder: Path, key: str) -> dict[str, Any]:
    """The newest run that worked in ``folder`` (`took_folder`), else the newest naming it.

    Why not the newest: a command refused before any work (a ``--resume`` whose config
    differs, or whose folder another process wrote) is newer than the run it was refused
    for, and ``runs show``/``compare`` printed its empty row in that run's place.

    Raises:
        ConfigError: no indexed run wrote it; naming the run whose id ``key`` starts, if one
            does (the user may have meant it).
    """
    wanted = folder.resolve()
    named = [run for run in store.list_runs(limit=None)  # newest first
             if run["run_dir"] and Path(run["run_dir"]).resolve() == wanted]  # fmt: skip
    if named:
        return next((run for run in named if took_folder(run)), named[0])
    shown = visible(str(folder))
    by_id = store.find_run(key)
    if by_id is not None:
        raise ConfigError(
            f"{key!r} is both the folder {shown}, which no indexed run wrote, and the start of "
            f"run id {by_id['id']}; for that run give more of its id"
        )
    gone = list(itertools.islice(filter(_folder_gone, store.list_runs(limit=None)), 3))  # newest
    moved = "; ".join(f"run {run['id']} had {visible(run['run_dir'])}" for run in gone)
    raise ConfigError(
        f"no indexed run names the folder {shown} (the index looks for the path its run wrote, "
        "so a moved folder is not found)"
        + (f"; runs whose folder is gone: {moved}; give one's id to `agentgym runs show`, or "
           "move the folder back" if gone else "; see `agentgym runs ls`")
    )  # fmt: skip


def _folder_gone(run: dict[str, Any]) -> bool:
    """Whether a run that started had a folder that is no longer there (moved or deleted)."""
    return bool(run["run_dir"]) and run["started_at"] is not None and \
        not Path(run["run_dir"]).is_dir()  # fmt: skip


def _by_own_id(store: RunStore, key: str) -> dict[str, Any] | None:
    """The newest run whose folder's own run id starts with ``key``, when one id does.

    Why: a train run's folder names the run by its own id (``status.json``), which a user
    copies from there; the index gives each process its own row id.
    """
    matches: list[tuple[str, dict[str, Any]]] = []  # (the folder's own id, its newest row)
    for run in store.list_runs(limit=None):  # newest first
        if not run["run_dir"]:
            continue
        status = read_json(Path(run["run_dir"]) / "status.json")
        own = status.get("run_id") if isinstance(status, dict) else None
        if isinstance(own, str) and own.startswith(key):
            matches.append((own, run))
    return matches[0][1] if len({own for own, _ in matches}) == 1 else None


def _coloured(status: str) -> Text:
    colour = _STATUS_COLOURS.get(status, "yellow")
    return Text(visible(status), style=colour)


def _told_apart(first: Any, second: Any) -> tuple[str, str]:
    """Both values as text, with as many digits as it takes to show that they differ.

    Why: at 4 significant digits 0.91234 and 0.91236 both read 0.9123, and a comparison
    that prints two different figures the same says the runs did equally well.
    """
    texts = _text(first), _text(second)
    if not (isinstance(first, float) and isinstance(second, float)) or first == second:
        return texts
    for digits in range(5, 18):
        texts = f"{first:.{digits}g}", f"{second:.{digits}g}"
        if texts[0] != texts[1]:
            break
    return texts


def _text(value: Any) -> str:
    """A cell's value as text (floats to 4 digits), its control characters made visible."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return visible(str(value))
