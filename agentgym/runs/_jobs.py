"""Jobs: a ``train``, ``eval`` or ``sft`` config checked before it is queued, and its command line.

A job config is a mapping (or YAML/JSON text of one):

- ``train``: a `GRPOConfig` (the YAML ``agentgym train`` reads); ``output_dir`` is replaced by
  the job's run folder.
- ``eval``: ``env`` plus any ``agentgym eval`` option by its flag's name, ``-`` written ``_``
  (``--num-tasks``: ``num_tasks``; ``--tasks``: ``tasks``; ``group_size``, ``policy`` ...), and
  ``env_kwargs`` (a mapping, as ``--env-arg k=v``); ``out`` and ``resume`` belong to the queue.
  ``api_key`` is refused: secrets do not go into the database (the worker inherits
  ``OPENAI_API_KEY``).
- ``sft``: ``model`` plus any ``agentgym sft`` option by its flag's name (``env`` or
  ``trajectories``, ``tasks``, ``steps``, ``batch_size``, ``method``, ``save_every`` ...), and
  ``env_kwargs`` as for ``eval``; OUT (the job's run folder) and ``resume`` belong to the queue.

`check_job` parses the config as the command would (click's own parser for ``eval`` and
``sft``, `GRPOConfig.from_dict` for ``train``) and runs the command's own checks that need no
model, so a config the command would refuse is refused at submission and never becomes a run.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from agentgym._errors import ConfigError
from agentgym._tasks import tasks_of_env
from agentgym._yaml import load_yaml

from ._store import RunStore, new_run_id

log = logging.getLogger("agentgym.runs")

JobKind = Literal["train", "eval", "sft"]
#: Option keys a job config may not set, each with why and what to do instead: listed among
#: "unknown" keys, they read as options the command lacks (``api_key`` is one of ``eval``'s).
_RESERVED: dict[str, str] = {
    "api_key": "is refused: a secret is never stored in the run database; drop it and set "
    "OPENAI_API_KEY where agentgym serve (or sweep) runs: its jobs inherit it",
    "out": "is the job's run folder, set by the queue; drop it",
    "resume": "is set by the queue (a retried job resumes); drop it",
    "env_arg": "is written as env_kwargs: {name: value}",
}
#: ``eval`` options a job config may not set (see the module docstring).
_EVAL_RESERVED = frozenset(_RESERVED)
#: ``sft`` options a job config may not set: OUT is the run folder, ``--resume`` the queue's.
_SFT_RESERVED = frozenset({"out", "resume", "env_arg"})
#: How a worker starts ``agentgym``: the interpreter running this code, not whatever is on PATH.
_AGENTGYM = [sys.executable, "-c", "from agentgym.cli import main; main()"]
#: Most values (mappings, lists and scalars, counted as YAML aliases expand) a job config holds.
MAX_CONFIG_NODES = 100_000


def parse_config(config: Mapping[str, Any] | str, source: str = "the config") -> dict[str, Any]:
    """A job config as a dict: a mapping as is, or YAML/JSON text parsed.

    ``source`` names it in errors (``config sweep.yaml``): a sweep reads several files.

    Raises:
        ConfigError: not a mapping, not YAML, nested too deep, or over `MAX_CONFIG_NODES`
            values (YAML aliases make a short text a huge config: the "billion laughs").
    """
    if isinstance(config, str):
        config = load_yaml(config, source)
    _check_size(config, MAX_CONFIG_NODES)
    if config is None:
        raise ConfigError(f"{source} is empty; write the run's options in it as key: value")
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source} must be a mapping of key: value, got {type(config).__name__}")
    return dict(config)


def _check_size(value: Any, limit: int) -> None:
    """ConfigError when ``value`` holds over ``limit`` values (aliases counted each time)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            raise ConfigError(
                f"the config holds more than {limit} values; a job config is small: put long "
                "task lists in a file and name it"
            )
        if isinstance(item, Mapping):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            stack += item


def check_job(kind: str, config: Mapping[str, Any]) -> list[str]:
    """Refuse a config its command would refuse, before it is queued; returns its warnings.

    A warning (``num_tasks`` past the env's tasks) is the command's own, said to whoever
    submits: printed by the check, it went to the server's stderr, which the submitter
    never sees.

    Raises:
        ConfigError: unknown kind, unknown key or env, a value of the wrong type.
    """
    if kind not in get_args(JobKind):
        raise ConfigError(f"kind must be one of {', '.join(get_args(JobKind))}; got {kind!r}")
    warnings = {"eval": _check_eval, "sft": _check_sft, "train": _check_train}[kind](config)
    _check_files(kind, config)
    _check_device(kind, config)
    return warnings


#: Per job kind: the config keys naming a model (a folder, a hub id or ``tiny``) ...
_MODEL_KEYS: dict[str, tuple[str, ...]] = {"train": ("model",), "eval": ("model_path",),
                                           "sft": ("model",)}  # fmt: skip
#: ... and the keys naming files or folders, one or a list.
_PATH_KEYS: dict[str, tuple[str, ...]] = {"train": (), "eval": ("adapter",),
                                          "sft": ("trajectories",)}  # fmt: skip


def _check_files(kind: str, config: Mapping[str, Any]) -> None:
    """The models, files and folders a job names must be here when it is queued.

    Why: the job's worker runs on this machine, from this folder, maybe hours later; a
    mistyped path found then is a run lost (the command refuses it too, at its start).
    """
    from agentgym.engine._model_dir import check_model_name

    for key in _MODEL_KEYS[kind]:
        if isinstance(model := config.get(key), str):
            try:
                check_model_name(model)
            except ConfigError as exc:
                raise ConfigError(f"{kind} job {key}: {exc}") from None
    for key in _PATH_KEYS[kind]:
        value = config.get(key)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and not Path(path).expanduser().exists():
                raise ConfigError(
                    f"{kind} job {key}: {path} does not exist (from {Path.cwd()}, where the "
                    "job's worker runs); give a path that does"
                )


def _check_device(kind: str, config: Mapping[str, Any]) -> None:
    """A train or sft job's ``device`` must be on this machine, where its worker trains.

    Why: the job would fail at its start, maybe hours later, with the same one line. Without
    torch here the worker cannot train at all, and says so itself.
    """
    device = config.get("device")
    if kind == "eval" or not isinstance(device, str) or device in ("auto", "cpu") or \
            importlib.util.find_spec("torch") is None:  # fmt: skip
        return
    from agentgym.trainers._sft import check_device_here

    try:
        check_device_here(device)
    except ConfigError as exc:
        raise ConfigError(f"{kind} job device: {exc}") from None


def submit_job(
    store: RunStore,
    kind: str,
    config: Mapping[str, Any] | str,
    *,
    runs_root: Path,
    source: str,
    name: str | None = None,
    max_attempts: int = 3,
    sweep_id: str | None = None,
) -> str:
    """Check a job and queue it; returns its run id. Its folder is ``runs_root/<id>``.

    `check_job`'s warnings are logged; a caller that answers a submitter (the job API) runs
    `check_job` and `queue_checked_job` itself, to return them.

    Raises:
        ConfigError: see `check_job`; nothing is queued then.
    """
    data = parse_config(config)
    for warning in check_job(kind, data):
        log.warning("%s", warning)
    return queue_checked_job(
        store, kind, data, runs_root=runs_root, source=source, name=name,
        max_attempts=max_attempts, sweep_id=sweep_id,
    )  # fmt: skip


def queue_checked_job(
    store: RunStore, kind: str, data: Mapping[str, Any], *, runs_root: Path, **row: Any
) -> str:
    """Queue a job config that `check_job` passed (`submit_job`'s second half); its run id.

    ``row``: `submit_job`'s ``source``, ``name``, ``max_attempts`` and ``sweep_id``. Why
    apart: a sweep checks every config before it queues any, so that one bad config leaves
    no rows behind (no queue would ever run them).
    """
    run_id = new_run_id()
    name = row.pop("name", None) or job_name(kind, data)
    return store.create_run(
        kind=kind, name=name, config=data, run_dir=runs_root.resolve() / run_id,
        job={"kind": kind, "config": data}, run_id=run_id, **row,
    )  # fmt: skip


def job_name(kind: str, config: Mapping[str, Any]) -> str:
    """A default name: ``<kind>-<env>``."""
    env = str(config.get("env", "calculator")).rsplit("/", 1)[-1]
    return f"{kind}-{env}"


def job_command(kind: str, config: Mapping[str, Any], run_dir: Path, resume: bool) -> list[str]:
    """The ``agentgym`` command line of a job writing into ``run_dir``.

    A train job's config is written to ``run_dir/job.yaml`` (with ``output_dir: run_dir``);
    an sft job's OUT is ``run_dir``.
    """
    flags = ["--resume"] if resume else []
    if kind == "eval":
        args = ["eval", *_eval_args(config), "--out", str(run_dir), *flags]
    elif kind == "sft":
        args = ["sft", *_sft_args(config, run_dir, flags)]
    else:
        job_file = run_dir / "job.yaml"
        data = {**config, "output_dir": str(run_dir)}
        job_file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        args = ["train", str(job_file), *flags]
    return [*_AGENTGYM, *args]


def _eval_args(config: Mapping[str, Any]) -> list[str]:
    """``agentgym eval`` arguments for an eval job config (``env`` first)."""
    if "env" not in config:
        raise ConfigError("an eval job config needs 'env' (e.g. env: calculator)")
    return [str(config["env"]), *_option_args("eval", config, skip="env")]


def _sft_args(config: Mapping[str, Any], out: Path, flags: Sequence[str] = ()) -> list[str]:
    """``agentgym sft`` arguments for an sft job config: options, ``flags``, ``-- MODEL OUT``.

    After ``--``: a model named like an option (``--help``) stays the model.
    """
    if "model" not in config:
        raise ConfigError("an sft job config needs 'model' (a model folder, or tiny)")
    options = _option_args("sft", config, skip="model")
    return [*options, *flags, "--", str(config["model"]), str(out)]


def _option_args(name: str, config: Mapping[str, Any], skip: str) -> list[str]:
    """``--flag value`` for each key of a job config but ``skip`` (the command's argument).

    ``env_kwargs`` becomes ``--env-arg k=<json>``; a list, a repeated option (only for options
    of ``agentgym NAME`` that take several values); a mapping, JSON.

    Raises:
        ConfigError: a list for an option that takes one value: click would keep the last
            item, and the job would run with a value nobody chose.
    """
    several = _multi_valued(name)
    args: list[str] = []
    for key, value in config.items():
        if key == skip or value is None:
            continue
        if key == "env_kwargs":
            if not isinstance(value, Mapping):
                raise ConfigError(f"env_kwargs must be a mapping, got {value!r}")
            for k, v in value.items():
                args += ["--env-arg", f"{k}={json.dumps(v)}"]
            continue
        param = _options(name).get(key)
        flag = _flag(param) if param is not None else None
        if flag is None:  # a row queued before its keys were checked as they are now
            raise ConfigError(f"unknown {name} config key {key!r}; see agentgym {name} --help")
        if isinstance(value, list):  # a repeatable option (server: [url, url])
            if key not in several:
                raise ConfigError(f"{name} config key {key!r} takes one value, got {value!r}; "
                                  "use agentgym sweep --grid for several")  # fmt: skip
            for item in value:
                args += [flag, str(item)]
            continue
        args += [flag, json.dumps(value) if isinstance(value, Mapping) else str(value)]
    return args


@functools.cache
def _multi_valued(name: str) -> frozenset[str]:
    """The keys of ``agentgym NAME``'s options that take several values (repeatable, nargs > 1)."""
    return frozenset(k for k, p in _options(name).items() if p.multiple or p.nargs != 1)


@functools.cache
def _options(name: str) -> dict[str, Any]:
    """``agentgym NAME``'s parameters by config key: the long flag's name (``--tasks``: ``tasks``).

    Why the flag's name, and the flag taken from the option itself: ``eval --tasks`` is
    ``task_range`` in Python; that key was listed as valid and passed as ``--task-range``,
    which no command takes, while ``tasks`` (what ``--help`` shows) was refused as unknown.
    """
    return {_key(p): p for p in _command(name).params if p.name}


def _key(param: Any) -> str:
    """A parameter's config key: its long flag without ``--``, ``-`` as ``_``; else its name."""
    flag = _flag(param)
    return flag.removeprefix("--").replace("-", "_") if flag else str(param.name)


def _flag(param: Any) -> str | None:
    """A parameter's first long flag (``--num-tasks``, not ``-n``); None for an argument."""
    return next((o for o in param.opts if o.startswith("--")), None)


def _check_eval(config: Mapping[str, Any]) -> list[str]:
    """The config as ``agentgym eval`` parses it, then the command's checks needing no model.

    `check_eval_options` and `checked_tasks` are the very functions the command runs, so the
    two cannot disagree; nothing here loads a model or reaches a server. The env is built
    once, to check its options' values and count its tasks: its id and option names alone
    passed ``env_kwargs: {num_tasks: 0}``, which the worker refused. Returns the warnings
    (`check_job`).
    """
    from agentgym._eval_cli import check_eval_options, checked_tasks
    from agentgym._eval_engine import local_env_kwargs
    from agentgym._eval_options import PolicyKind
    from agentgym._registry import resolve_id

    _check_keys("eval", config, _EVAL_RESERVED)
    args = _eval_args(config)
    ctx = _parse("eval", [*args, "--out", "unused"])
    check_eval_options(ctx)  # temperature under the reference policy, a file:// URL ...
    policy, params = PolicyKind(ctx.params["policy"]), ctx.params
    if policy.local and params["model_path"] is None and params["adapter"] is None:
        # no model to play: the command's own refusal, made before it looks at the folder
        local_env_kwargs(None, {}, policy)
    _check_adapter(ctx)
    env = args[0]
    count = _check_env(env, config.get("env_kwargs"), count_tasks=True)
    if count is None:
        return []
    env_id = env if ":" in env else resolve_id(env)  # as the command names it (not imported)
    task_range, num_tasks = params["task_range"], params["num_tasks"]
    _, warnings = checked_tasks(count, task_range, num_tasks, params["group_size"], env_id,
                                num_tasks_name="num_tasks")  # fmt: skip
    return warnings


def _check_adapter(ctx: Any) -> None:
    """An eval job's ``adapter`` must be one the command takes, as it checks it: no model load.

    Why: ``adapter: /etc`` was queued and refused by the worker. A ``tiny`` ``model_path`` is
    resolved as the command resolves it (`local_model`: built once, then cached, and the
    worker uses that build): skipped, a folder that is no adapter was queued beside it.
    """
    from agentgym._eval_engine import local_model, trained_adapter_and_base
    from agentgym._eval_options import PolicyKind, Servers
    from agentgym._extras import needs_extra

    params = ctx.params
    if params["adapter"] is None or not Path(params["adapter"]).expanduser().exists():
        return  # a missing one: `_check_files` says so, naming the folder it looked from
    servers = Servers(params["server"], params["router_url"], params["model"])
    with needs_extra("agentgym eval --adapter", "train"):  # a tiny build needs transformers
        model_path = local_model(params["model_path"], params["seed"])
    trained_adapter_and_base(params["adapter"], model_path, PolicyKind(params["policy"]), servers)


#: Starts the line on which the child process of `_check_env` reports the env's task count
#: (the env's module may print lines of its own).
_TASKS_MARK = "agentgym-env-tasks: "
#: What a child process runs to check a ``module:id`` env: the import is the user's code.
_CHECK_ENV = (
    "import json, sys\n"
    "from agentgym._errors import ConfigError\n"
    "from agentgym.runs._jobs import _TASKS_MARK, checked_env_tasks\n"
    "try:\n"
    "    count = checked_env_tasks(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == 'count')\n"
    "except ConfigError as exc:\n"
    "    sys.exit(f'error: {exc}')\n"
    "print(_TASKS_MARK + json.dumps(count))\n"
)


def checked_env_tasks(env_id: str, env_kwargs: dict[str, Any], count: bool) -> int | None:
    """Refuse env options its constructor would refuse; with ``count``, the env's task count.

    Counting builds the env once, so that a task range past its last task is refused at
    submission, not by the worker. None: not counted, the env has no task list, or the env's
    own code failed to build it (a service down now may be up when the job runs: the
    worker's to say then).
    """
    from agentgym._errors import Error
    from agentgym._registry import check_env_options, made_for_a_command

    check_env_options(env_id, env_kwargs)  # UnknownEnvError names the close ids
    if not count:
        return None
    try:
        env = made_for_a_command(env_id, env_kwargs)
    except ConfigError:
        raise
    except Error:
        return None
    try:
        tasks = getattr(env, "tasks", None)
        return None if tasks is None else len(tasks)
    finally:
        env.close()


def _check_env(
    env_id: str, env_kwargs: Mapping[str, Any] | None, *, count_tasks: bool = False
) -> int | None:
    """Refuse an unknown env id, or env options its constructor would refuse.

    With ``count_tasks``, returns the env's task count (see `checked_env_tasks`).
    A ``module:id`` is checked in a child process: importing the module runs the submitter's
    code, and in the server's process a module that calls ``sys.exit`` (``unittest.__main__``)
    stopped the server, and one that raised on import answered 500. The worker imports it
    again when the job runs.
    """
    kwargs = dict(env_kwargs or {})
    if ":" not in env_id:
        return checked_env_tasks(env_id, kwargs, count_tasks)
    argv = [env_id, json.dumps(kwargs, default=str), "count" if count_tasks else "check"]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHECK_ENV, *argv],
            capture_output=True, text=True, timeout=ENV_CHECK_SECONDS, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(f"env {env_id!r}: importing its module took over "
                          f"{ENV_CHECK_SECONDS} s; check it with agentgym check") from None
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        said = lines[-1].removeprefix("error: ") if lines else f"exit {proc.returncode}"
        raise ConfigError(f"env {env_id!r}: {said}")
    reports = [line for line in proc.stdout.splitlines() if line.startswith(_TASKS_MARK)]
    return json.loads(reports[-1].removeprefix(_TASKS_MARK)) if reports else None


#: Seconds a child process may take to import a job's env module and check its options.
ENV_CHECK_SECONDS = 120


def _check_sft(config: Mapping[str, Any]) -> list[str]:
    """The config as ``agentgym sft`` parses it, then the command's own checks of its options.

    The model is left to the worker (a model load); the env is built once, as the command
    builds it: its options' values are checked (``num_tasks: 0`` was queued, then refused by
    the worker), and a ``tasks`` range must lie inside its tasks.
    """
    from agentgym.trainers._sft_cli import check_options

    _check_keys("sft", config, _SFT_RESERVED)
    params = _parse("sft", _sft_args(config, Path("unused"))).params
    check_options(params)
    env, tasks = params["env"], params["tasks"]
    if env is not None:
        count = _check_env(env, config.get("env_kwargs"), count_tasks=True)
        if tasks is not None and count is not None:
            tasks_of_env(tasks, env, count)  # the command's own refusal
    return []  # the command warns of nothing it can check here


def _check_keys(name: str, config: Mapping[str, Any], reserved: frozenset[str]) -> None:
    """Refuse a key that is no option of ``agentgym NAME`` (or one the queue sets), with a hint.

    Why before parsing: click would report ``--num-taks`` as an unknown option; the config's
    key, with the close match, is what the user wrote. A reserved key says why it is one.
    """
    allowed = set(_options(name)) - reserved | {"env_kwargs"}
    for key in config:
        if key in reserved:
            raise ConfigError(f"{name} config key {key!r} {_RESERVED[key]}")
        if key not in allowed:
            python_names = {p.name: k for k, p in _options(name).items()}  # task_range: tasks
            close = [python_names[key]] if python_names.get(key) in allowed else \
                difflib.get_close_matches(str(key), sorted(allowed), n=1)  # fmt: skip
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {sorted(allowed)}"
            raise ConfigError(f"unknown {name} config key {key!r}; {hint}")


def _parse(name: str, args: list[str]) -> Any:
    """``agentgym NAME ARGS`` parsed by the command's own parser: its click context.

    Typed Any: typer vendors click, and its context class is not public.
    """
    import typer

    try:
        return _command(name).make_context(name, args, resilient_parsing=False)
    except typer.TyperException as exc:  # typer's (vendored click's) usage errors
        raise ConfigError(f"{name} config: {exc.format_message()}") from None


@functools.cache
def _command(name: str) -> Any:
    """The (typer-vendored) click command of ``agentgym NAME``."""
    import typer.main

    from agentgym import cli

    return getattr(typer.main.get_command(cli.app), "commands")[name]  # noqa: B009


def _check_train(config: Mapping[str, Any]) -> list[str]:
    """The config as `GRPOConfig` reads it, and its task ranges inside the env's tasks."""
    try:
        from agentgym.trainers._config import GRPOConfig
    except ImportError:  # the train extra is missing: the worker will say so
        return []
    cfg = GRPOConfig.from_dict(config)
    # ranges past the env's last task, split as the trainer's pre-flight splits them; built
    # only for ranges given (an MCP env starts its servers to be built)
    ranges = cfg.train_tasks is not None or cfg.eval_tasks is not None
    count = _check_env(cfg.env, cfg.run_env_kwargs, count_tasks=ranges)
    if ranges:
        cfg.task_split(count)
    return []
