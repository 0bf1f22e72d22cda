"""``agentgym eval ENV``: play evaluation episodes, stream them to a folder, summarise.

User mistakes print one line naming the fix before anything is written (`_eval_options`,
`_eval_engine`); episodes stream to ``trajectories.jsonl`` as they finish, so a killed run
loses none and ``--resume`` plays only what is missing (`_eval_folder`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._check import refuse_unready
from ._cli_common import (
    EnvArgOption,
    console,
    folder_path,
    parse_env_args,
    parse_template_kwargs,
    stdout,
    visible,
)
from ._durable import check_folder_can_be_made, remove_temp_files
from ._errors import ConfigError, Error, InfraError
from ._eval_engine import (
    PlaySettings,
    TrainedRun,
    local_env_kwargs,
    local_model,
    prepare_engine,
    trained_adapter_and_base,
    trained_run,
    with_run_settings,
)
from ._eval_folder import (
    TASKS_KEY,
    FolderLock,
    finished_summary,
    previous_episodes,
    write_json,
)
from ._eval_options import (
    PolicyKind,
    RolloutModeChoice,
    Servers,
    check_policy_options,
    typed_options,
)
from ._eval_server import check_served_model
from ._policies import OpenAIPolicy, Policy, ScriptedPolicy, check_base_url
from ._registry import made_for_a_command, resolve_id
from ._rollout import check_episode_count, rollout
from ._summary import summarize
from ._tasks import tasks_digest, tasks_of_env
from ._trajectory import Trajectory, to_json_line
from .runs._folder import refuse_another_kind_of_run


def evaluate(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help="Env id or short name, e.g. calculator.")],
    policy: Annotated[
        PolicyKind,
        typer.Option(
            help="reference: the env's own solution; openai: a running server (--base-url, "
            "--model); vllm: --model-path in the in-process engine, token in / token out; "
            "hf: the same with transformers (no vLLM needed)."
        ),
    ] = PolicyKind.reference,
    model_path: Annotated[
        Path | None,
        typer.Option(
            help="vllm, hf: a local model folder, or tiny / tiny:PRESET (the project's offline "
            "model, built with --seed as train builds it with its seed)."
        ),
    ] = None,
    adapter: Annotated[
        Path | None,
        typer.Option(
            help="vllm, hf: a trained LoRA adapter to sample with: a run folder (its newest "
            "checkpoint), a checkpoint, or an adapter folder (agentgym export); --model-path "
            "defaults to the base it was trained on."
        ),
    ] = None,
    base_url: Annotated[
        str, typer.Option(help="openai: the server root (OpenAI-compatible).")
    ] = "http://127.0.0.1:8000/v1",
    model: Annotated[
        str | None,
        typer.Option(help="Served model name (openai; vllm with --server: default the folder's)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="openai: bearer token.")
    ] = None,
    max_retries: Annotated[
        int,
        typer.Option(
            min=0,
            help="openai: retries of a request that failed in transit or got 429/5xx; then "
            "the episode ends infra_error.",
        ),
    ] = 3,
    retry_backoff: Annotated[
        float,
        typer.Option(min=0, help="openai: seconds before the first retry; doubles with each one."),
    ] = 0.5,
    temperature: Annotated[
        float, typer.Option(help="openai, vllm, hf: sampling temperature.")
    ] = 1.0,
    num_tasks: Annotated[
        int | None, typer.Option("--num-tasks", "-n", min=1, help="First N tasks; all if omitted.")
    ] = None,
    task_range: Annotated[
        str | None,
        typer.Option(
            "--tasks",
            help="Task indices START:END (half-open) instead of the first N: e.g. a run's "
            "held-out split, or train tasks to record episodes for `agentgym sft`.",
        ),
    ] = None,
    group_size: Annotated[
        int, typer.Option("--group-size", "-g", min=1, help="Episodes per task.")
    ] = 1,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Episodes in flight at once (default: enough to fill it)."),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="openai, vllm, hf: max new tokens per turn.")
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            min=0,
            help="Base seed of the episodes and of their sampling (vllm: runs repeat; "
            "openai: sent per turn, repeats where the server honours seeds).",
        ),
    ] = 0,
    chat_template_kwargs: Annotated[
        str | None,
        typer.Option(
            help="vllm, hf: chat-template variables as JSON, '{\"enable_thinking\": false}'."
        ),
    ] = None,
    rollout_mode: Annotated[
        RolloutModeChoice,
        typer.Option(help="vllm, hf: concat (one sequence per episode), per_turn, or auto."),
    ] = RolloutModeChoice.auto,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=16,
            help="vllm, hf: context window; a longer episode ends truncated. "
            "[default: 4096, or the model's positions if fewer]",
        ),
    ] = None,
    server: Annotated[
        list[str],
        typer.Option(
            help="vllm: a vLLM server to sample on instead of the in-process engine "
            "(repeatable; token ids in and out, episodes routed sticky)."
        ),
    ] = [],  # noqa: B006
    router_url: Annotated[
        str | None, typer.Option(help="vllm: a router before the --server URLs (vllm-router).")
    ] = None,
    episode_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Seconds one episode may play; one still playing then is cut and recorded "
            "late (not scored; --resume plays it again). Default: no limit.",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for trajectories.jsonl, summary.json and run.json.", parser=folder_path
        ),
    ] = Path("runs/eval"),
    resume: Annotated[
        bool, typer.Option(help="Continue a killed run in --out: play only missing episodes.")
    ] = False,
    env_arg: EnvArgOption = [],  # noqa: B006
) -> None:
    """Run evaluation episodes; stream one trajectory per line, then write a summary."""
    if policy.local:
        from .engine._quiet import quiet_backends

        quiet_backends()  # before vLLM is imported: its engine processes read it too
    env_id = resolve_id(env)
    env_kwargs = parse_env_args(env_arg)
    template_kwargs = check_eval_options(ctx)
    out = out.expanduser()  # `--out=~/x`: bash leaves that "~" to us, as every reader takes it
    check_folder_can_be_made(out, "--out")
    refuse_another_kind_of_run(out, "eval", "--out")
    servers = Servers(server, router_url, model)
    model_path = local_model(model_path, seed)
    run = None  # the run the adapter (or an exported merged model) was trained in
    if adapter is not None:
        adapter, model_path = trained_adapter_and_base(adapter, model_path, policy, servers)
        run = trained_run(adapter)
    elif policy.local and model_path is not None:  # `agentgym export --merge` wrote it?
        run = trained_run(model_path, exported_only=True)
    if run is not None:  # play the episodes as its run did, unless told otherwise
        given = PlaySettings(env_kwargs, max_tokens, max_model_len, template_kwargs)
        as_run = with_run_settings(run, env_id, typed_options(ctx), given)
        env_kwargs, max_tokens = as_run.env_kwargs, as_run.max_tokens
        max_model_len, template_kwargs = as_run.max_model_len, as_run.chat_template_kwargs
    # what envs are built with: under vllm, a vllm:<name> parser reads the model's tokenizer
    env_kwargs_built = (
        local_env_kwargs(model_path, env_kwargs, policy) if policy.local else env_kwargs
    )
    if policy.local and model_path is not None:  # checked before any engine starts
        from .engine._model_dir import context_length

        max_model_len = context_length(model_path, max_model_len)
    probe = made_for_a_command(env_id, env_kwargs_built)  # validates options before any work
    tasks = getattr(probe, "tasks", None)
    try:
        if tasks is None:  # it failed in rollout
            raise ConfigError("the env has no task list (a `tasks` attribute) to play; give it one")
        if run is not None and task_range is None and num_tasks is None and len(tasks):
            task_range = _held_out_range(run, env_id, len(tasks))
        chosen, warnings = checked_tasks(len(tasks), task_range, num_tasks, group_size, env_id)
        for warning in warnings:
            console.print(f"warning: {warning}", soft_wrap=True)
        refuse_unready(probe, env_id)  # its sandboxes, before a model loads
        reference = _reference_turns(probe, tasks) if policy is PolicyKind.reference else None
    finally:
        probe.close()
    total, digest = len(chosen), tasks_digest(tasks, chosen)  # what is played, and its digest
    # the rollout seeds episode g at plan position i with seed_base + i * G + g: shifted by the
    # range's start, task k plays seed + k * G + g under --tasks as under -n, so a rerun of a
    # range plays the very episodes the whole run did. Recorded where it shifted: a range run
    # written before the shift (seed_base = seed) then refuses a resume instead of mixing seeds
    seed_base = seed + chosen[0] * group_size
    served: OpenAIPolicy | None = None  # built here: its sampling is checked before indexing
    if policy is PolicyKind.openai and model is not None:
        served = OpenAIPolicy(
            base_url, model, api_key=api_key, sampling={"temperature": temperature, "seed": seed},
            max_retries=max_retries, retry_backoff=retry_backoff,
        )  # fmt: skip
        check_served_model(base_url, model, api_key)  # a 404 / 401 here is the command's
    # what the episodes measure, compared on --resume; not how they are played (--concurrency,
    # --episode-timeout, --max-retries): a resume of infra_error episodes may raise those
    run_config = {
        "env": env_id, "env_kwargs": env_kwargs, "policy": policy.value,
        "model": str(model_path) if policy.local else model,
        "temperature": temperature, "num_tasks": num_tasks,
        **({"tasks": task_range} if task_range else {}), "group_size": group_size,
        "seed": seed, "max_tokens": max_tokens, "chat_template_kwargs": template_kwargs,
        "rollout_mode": rollout_mode.value, "max_model_len": max_model_len,
        TASKS_KEY: digest, **({"adapter": str(adapter)} if adapter else {}),
        **({"seed_base": seed_base} if chosen[0] else {}),
        **_where_served(policy, base_url, server, router_url),
    }  # fmt: skip
    from .runs import track_run  # indexes the run; a database failure is only a warning

    with contextlib.ExitStack() as stack:
        lock = stack.enter_context(FolderLock(out, warn=console.print))
        lock.acquire()  # before reading what is there: no second writer appends next to us
        done = previous_episodes(out, run_config, resume)
        finished = finished_summary(out, len(done), total * group_size)
        if finished is not None:  # resumed with nothing left to play: start no engine
            with track_run("eval", out.name, run_config, out):
                _print_summary(finished, out)
            return
        agent: Policy
        if policy is PolicyKind.reference:
            assert reference is not None  # checked above; narrows the type
            agent = ScriptedPolicy(reference)
        elif policy.local and model_path is not None:
            sampling = {"temperature": temperature, "seed": seed, "max_tokens": max_tokens}
            engine = prepare_engine(
                model_path, env_id, env_kwargs_built, sampling, template_kwargs, rollout_mode,
                max_model_len, servers, transformers=policy is PolicyKind.hf, adapter=adapter,
            )  # fmt: skip
            agent = stack.enter_context(engine)  # shut down on leaving
        else:
            assert served is not None  # built above; narrows the type
            agent = served
        # indexed once the engine started: its refusals (a server serving another name, a
        # template kwarg or parser the model refuses) are the command's, as the ones above
        stack.enter_context(track_run("eval", out.name, run_config, out))
        which = {"tasks": chosen} if task_range else {"num_tasks": num_tasks}
        plan = {
            **which, "group_size": group_size, "max_concurrency": concurrency,
            "seed": seed_base, "max_tokens_per_turn": max_tokens,
            "env_kwargs": env_kwargs_built,
            "episode_timeout": episode_timeout,
        }  # fmt: skip
        summary, played = _run_eval(
            out, env_id, agent, run_config, done, total * group_size, plan, lock
        )
        _refuse_failed_episodes(played, out, episode_timeout)
        # inside the tracked block: a follower of the run's log stops once it is finished
        _print_summary(summary, out)


def check_eval_options(ctx: Any) -> dict[str, Any]:
    """The command's refusals of its options alone; returns ``--chat-template-kwargs`` parsed.

    No model, no env and no network: a queued eval job is checked by this same function at
    submission (`agentgym.runs.check_job`), so the job API cannot accept a config the command
    then refuses in the worker (a ``file://`` base URL, temperature -5, a JSON typo were
    queued, and failed there with exit 2). A URL with a user:password is refused here before
    the job API could store it. ``ctx``: the command's click context.
    """
    from ._policies import _check_sampling
    from .engine._remote import _check_url

    params = ctx.params
    policy = PolicyKind(params["policy"])
    template_kwargs = parse_template_kwargs(params["chat_template_kwargs"])
    check_policy_options(ctx)
    if policy is PolicyKind.openai:
        check_base_url(params["base_url"])
    for url in params["server"]:
        _check_url(url, "server")
    if params["router_url"] is not None:
        _check_url(params["router_url"], "router")
    if policy is not PolicyKind.reference:  # as OpenAIPolicy and the engines check them
        _check_sampling({k: params[k] for k in ("temperature", "seed", "max_tokens")})
    return template_kwargs


def checked_tasks(
    available: int,
    task_range: str | None,
    num_tasks: int | None,
    group_size: int,
    env_id: str,
    num_tasks_name: str = "-n",
) -> tuple[list[int], list[str]]:
    """The task indices an eval plays, refused as the command refuses them, and its warnings.

    ``num_tasks_name`` names the option as its user wrote it (``-n``, a job's ``num_tasks``).

    Why shared: a queued eval job is checked by it at submission with its env's task count,
    so a range past the env's tasks, or no tasks at all, is refused then, not by the worker,
    and its warnings go to whoever submitted it.
    """
    if not available:  # it warned "playing all 0", then failed in rollout
        raise ConfigError("the env has no tasks to play (its options made none); give it "
                          "some, e.g. --env-arg num_tasks=N")  # fmt: skip
    if task_range is not None:
        if num_tasks is not None:
            tasks_name = "--tasks" if num_tasks_name.startswith("-") else "tasks"  # a job's key
            raise ConfigError(f"give {tasks_name} START:END or {num_tasks_name} N, not both")
        chosen = tasks_of_env(task_range, env_id, available)
    else:
        chosen = list(range(available if num_tasks is None else min(num_tasks, available)))
    check_episode_count(len(chosen), group_size)  # before a model loads
    # -n beyond the env's tasks: -n 1000 on a 100-task env played 100 and said nothing, so
    # the summary's episode count read as a run cut short (a --tasks range past them is refused)
    past = num_tasks is not None and task_range is None and num_tasks > available
    warnings = [f"{num_tasks_name} {num_tasks}, but the env has {available} tasks; playing all "
                f"{available}"] if past else []  # fmt: skip
    return chosen, warnings


def _where_served(
    policy: PolicyKind, base_url: str, servers: list[str], router_url: str | None
) -> dict[str, Any]:
    """Which server(s) sampled the episodes, without credentials, for ``run.json``.

    Why: two evals of one served model name on different servers had identical configs, so
    ``runs compare`` called them the same, and a resume could mix episodes of both.
    """
    if policy is PolicyKind.openai:
        return {"base_url": _without_credentials(base_url)}
    where: dict[str, Any] = {}
    if servers:
        where["server"] = [_without_credentials(url) for url in servers]
    if router_url:
        where["router_url"] = _without_credentials(router_url)
    return where


def _without_credentials(url: str) -> str:
    """``url`` without a user:password part or a query (where tokens go)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _held_out_range(run: TrainedRun, env_id: str, available: int) -> str | None:
    """The run's held-out tasks as ``--tasks START:END``, said in a line; None: all tasks.

    Why: they are the run's own measure; an eval of every task played its training tasks
    too (2,180 of 2,200), under a line naming the held-out ones.
    """
    held_out = run.held_out(available) if resolve_id(run.env) == env_id else []
    if held_out and held_out == list(range(held_out[0], held_out[-1] + 1)):
        spec = f"{held_out[0]}:{held_out[-1] + 1}"
        console.print(f"playing its held-out tasks {spec} (--tasks or -n to choose others)",
                      soft_wrap=True)  # fmt: skip
        return spec
    if held_out:
        console.print(
            f"warning: playing every task, training ones too: the run's held-out tasks "
            f"{held_out} are no START:END range for --tasks",
            soft_wrap=True,
        )
    return None


def _reference_turns(probe: Any, tasks: Sequence[Any]) -> Callable[[Any], Sequence[str]]:
    """The env's reference turns, refused before any work when it has none.

    `ToolEnv`'s default ``reference_turns`` returns None: played, every episode ended in
    'error' (a TypeError deep in `ScriptedPolicy`) and the run exited 0. Task 0 stands for
    all, as in `agentgym check`.
    """
    reference = getattr(probe, "reference_turns", None)
    if reference is None or (len(tasks) and reference(tasks[0]) is None):
        why = "its reference_turns returns None" if reference else "no reference_turns method"
        raise ConfigError(
            f"this env has no reference solution ({why}); use --policy openai, vllm or hf"
        )
    return reference


def _run_eval(
    out: Path,
    env_id: str,
    agent: Policy,
    run_config: dict[str, Any],
    done: list[Trajectory],
    total: int,
    plan: dict[str, Any],
    lock: FolderLock,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Play the missing episodes, streaming each to ``out``: (the summary written, them)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # what the up-front check cannot see: root may write, /proc refuses
        raise ConfigError(
            f"--out {out}: cannot make the folder ({exc.strerror or exc}); choose another --out"
        ) from None
    if lock.acquire() and (out / "trajectories.jsonl").exists():
        raise ConfigError(  # a fresh run raced another into the same new folder
            f"another agentgym eval started writing {out} meanwhile; rerun with --resume "
            "once it ended, or choose another --out"
        )
    remove_temp_files(out)  # of writes a killed run never finished (we hold the lock)
    write_json(out / "run.json", run_config)
    started = time.perf_counter()
    results = out / "trajectories.jsonl"
    written = len(done)  # episodes in `results`, for the line a Ctrl-C prints
    try:
        with _progress() as progress, results.open("a", encoding="utf-8") as sink:
            bar = progress.add_task(f"eval {env_id}", total=total, completed=len(done))

            def record(trajectory: Trajectory) -> None:
                nonlocal written
                sink.write(to_json_line(trajectory))
                sink.flush()  # a killed run keeps every finished episode
                written += 1
                progress.advance(bar)

            # by position in the plan, as `rollout` keys it: under --tasks 5:8 the task index
            # (5) is not the position (0), and a resume played its episodes again
            skip = {t.key for t in done}
            played = rollout(env_id, agent, on_episode=record, skip=skip, **plan)
    except KeyboardInterrupt:  # Ctrl-C or `kill` (`exit_on_sigterm`): still exits 130 / 143,
        # and the run store files it interrupted
        console.print(
            f"interrupted: {written} of {total} episodes are in {results}; run the same "
            "command with --resume to play the rest",
            soft_wrap=True,
        )
        raise
    wall = time.perf_counter() - started
    summary = summarize(done + played, wall_seconds=wall, played=len(played))
    summary |= {k: run_config[k] for k in ("env", "policy", "model", "group_size")}
    summary |= _health(done + played)
    write_json(out / "summary.json", summary)
    return summary, played


def _health(trajectories: list[Trajectory]) -> dict[str, Any]:
    """What the troubleshooting rules read off these episodes: ``findings`` and their count.

    Why: an eval at 0% has the causes a flat training run has (no call parsed, calls cut at
    the token limit, a sandbox down); the count is a figure ``runs ls``/``compare`` show.
    """
    from agentgym.trainers._health import diagnose_episodes

    findings = [f.as_dict() for f in diagnose_episodes(trajectories)]
    return {"health": {"findings": len(findings)}, "findings": findings}  # as train's summary


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _refuse_failed_episodes(
    played: list[Trajectory], out: Path, episode_timeout: float | None
) -> None:
    """A run whose every played episode failed evaluated nothing: refuse it, not exit 0.

    Any infra_error (the model server or sandbox failed, even for some episodes only: a
    server that died mid-run) exits 75, which queues retry, and --resume plays those again;
    exit 0 read as a finished eval, its job was never retried, and its figures covered only
    the episodes before the failure. All error (an exception in the env or the policy) exits
    1 naming the first one's exception. Some errors among scored episodes, or some episodes
    cut by --episode-timeout: a warning, since the scores stand.
    """
    results = out / "trajectories.jsonl"
    statuses = Counter(t.status for t in played)
    if statuses["late"]:  # not scored: the summary's success is over the others
        cut = (
            f"{statuses['late']} of {len(played)} episodes played were cut at --episode-timeout "
            f"{episode_timeout:g} s (late, not scored); raise it and rerun with --resume to "
            "play them again"
        )
        if statuses["late"] == len(played):
            raise Error(cut)  # nothing was evaluated
        console.print(f"warning: {cut}", soft_wrap=True)
    if statuses["infra_error"]:
        failed = next(t for t in played if t.status == "infra_error")
        count = statuses["infra_error"]
        some = f"all {count}" if count == len(played) else f"{count} of {len(played)}"
        raise InfraError(
            f"{some} episodes played ended in infra_error (the model server "
            f"or sandbox failed; the first: {_last_line(failed.error)}; see {results}); fix "
            "it, then rerun with --resume to play them again"
        )
    if played and statuses["error"] == len(played):
        raise Error(
            f"all {len(played)} episodes played ended in error (the first: "
            f"{_last_line(played[0].error)}; see "
            f"{results}); fix it, then rerun with another --out"  # --resume keeps them
        )
    if statuses["error"]:
        console.print(
            f"warning: {statuses['error']} of {len(played)} episodes played ended in error; "
            f"their tracebacks are in {results}",
            soft_wrap=True,
        )


def _last_line(text: str | None) -> str:
    """A traceback's last line: the exception and its message, its hidden characters escaped.

    Why escaped: the message quotes others' text (a proxy's 502 page, a model's reply a
    reward choked on); printed raw in the error line, its escape sequences cleared the
    screen or wrote the reader's clipboard (OSC 52).
    """
    lines = (text or "").strip().splitlines()
    return visible(lines[-1]) if lines else "no error recorded"


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    table = Table("metric", "value", title=visible(f"{summary['env']} ({summary['policy']})"))
    for key, value in summary.items():
        if key in ("env", "policy", "model", "findings"):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown)
    stdout.print(table)
    for finding in summary.get("findings", []):  # docs/troubleshooting.md#<rule>
        console.print(f"health [{finding['rule']}] {finding['title']}: {finding['evidence']}\n"
                      f"    fix: {finding['fix']}", style="yellow", soft_wrap=True)  # fmt: skip
    console.print(visible(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}"),
                  soft_wrap=True, highlight=False)  # fmt: skip
