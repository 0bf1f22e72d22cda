"""Registry on top of Gymnasium's: ``agentgym.register`` / ``agentgym.make``.

Every env is registered in Gymnasium's own registry, so ``gymnasium.make("agentgym/...")``
works after ``import agentgym``. `make` itself skips Gymnasium's wrappers and returns the env
unwrapped, because the rollout engine needs the env's async methods (`areset`/`astep`), which
Gymnasium wrappers do not forward.

Third-party packages register through the entry-point group ``agentgym.envs``: each entry
point names a zero-argument function that calls `register`. Plugins load on the first `make`,
`registered_envs` or CLI call (or explicitly with `load_plugins`), not at import, so importing
agentgym never imports someone else's package.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import json
import os
import re
import sys
import sysconfig
import textwrap
import traceback
import types
import typing
import warnings
from collections import abc
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import PurePath
from types import ModuleType, UnionType
from typing import Any, Literal, Union

import gymnasium
from gymnasium.envs.registration import EnvSpec
from pydantic import TypeAdapter, ValidationError

from ._env import Env
from ._errors import ConfigError, Error, UnknownEnvError

ENTRY_POINT_GROUP = "agentgym.envs"
_OUR_IDS: set[str] = set()
_plugins_loaded = False


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    kwargs: dict[str, Any] | None = None,
    **defaults: Any,
) -> None:
    """Register an env under ``id`` (e.g. ``"myorg/Search-v0"``).

    Args:
        id: Gymnasium-style id, ``[namespace/]Name-vN``.
        entry_point: ``"package.module:ClassOrFactory"`` (imported only on `make`) or a callable.
        kwargs: the default options as one dict, Gymnasium's spelling
            (``register(id, ep, kwargs={"num_tasks": 5})``); merged with ``defaults``.
        defaults: keyword arguments passed to the entry point; `make`'s kwargs override them.

    Raises:
        ConfigError: a malformed id or entry point, a ``kwargs`` that is not a dict, or an
            option given both in ``kwargs`` and as a keyword (nothing is registered).
    """
    if not _ID.fullmatch(id):
        raise ConfigError(_id_refusal(id))
    _check_entry_point(id, entry_point)
    defaults = _merged_defaults(id, kwargs, defaults)
    previous = gymnasium.registry.get(id)
    if previous is not None and _entry_name(previous.entry_point) != _entry_name(entry_point):
        warnings.warn(
            f"register({id!r}) replaces {_entry_name(previous.entry_point)} with "
            f"{_entry_name(entry_point)}; give your env its own id (e.g. 'myorg/Name-v0')",
            stacklevel=2,
        )
    with warnings.catch_warnings():  # re-registering the same entry point (a reload) is fine
        warnings.simplefilter("ignore")
        gymnasium.register(
            id=id, entry_point=entry_point, kwargs=defaults, disable_env_checker=True
        )
    _OUR_IDS.add(id)


#: ``[namespace/]Name-vN``: Gymnasium reads -v01 as version 1, so neither spelling made it.
_ID = re.compile(r"([\w.-]+/)?[\w.:-]+-v(0|[1-9]\d*)")


def _id_refusal(id: str) -> str:
    """Why ``id`` is no env id, and the id meant where one is plain (a version added or fixed).

    Why: ``register("myorg/Search")`` was refused with the pattern alone; the usual mistake
    is a missing version, and the line now gives the id to write.
    """
    base, _, version = id.rpartition("-v")
    if base and version.isdecimal() and version.isascii():
        meant = f"{base}-v{int(version)}"
    else:  # a version of another spelling (-V0, -v1.2) is the user's to mend
        meant = "" if "-v" in id.lower() else f"{id}-v0"
    hint = f"; write {meant!r}" if _ID.fullmatch(meant) else ""
    return (
        f"env id {id!r} must look like 'namespace/Name-v0' (a version without leading zeros: "
        f"-v1, not -v01){hint}"
    )


#: ``"package.module:Attr"``: what `_load_entry_point` can import (one attribute, no dots).
_ENTRY_POINT = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _check_entry_point(id: str, entry_point: Any) -> None:
    """Refuse an entry point `make` could never call, when it is registered.

    Why: a typo'd string or a stray value used to be accepted and fail only at `make`,
    often in another process (a trainer's workers), far from the ``register`` line.
    """
    if callable(entry_point):
        return
    if not isinstance(entry_point, str):
        raise ConfigError(
            f"register({id!r}, ...): the entry point must be an env class, a function returning "
            f"an env, or a 'package.module:ClassName' string, got {type(entry_point).__name__} "
            f"{entry_point!r}"
        )
    if not _ENTRY_POINT.fullmatch(entry_point):
        raise ConfigError(
            f"register({id!r}, {entry_point!r}): an entry point string must look like "
            "'package.module:ClassName' (the module to import, a colon, the class or function)"
        )


def _merged_defaults(
    id: str, kwargs: dict[str, Any] | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """The default options: Gymnasium's ``kwargs={...}`` and our keywords, together.

    Why: ``kwargs=`` is how `gymnasium.register` takes them, so code written for Gymnasium
    passes it; taken as an option named ``kwargs`` it failed only at `make`.
    """
    if kwargs is None:
        return defaults
    if not isinstance(kwargs, dict):
        raise ConfigError(
            f"register({id!r}, ...): kwargs= holds the default options as a dict, got "
            f"{type(kwargs).__name__} {kwargs!r}; or pass each as a keyword (num_tasks=5)"
        )
    if twice := sorted(kwargs.keys() & defaults.keys()):
        raise ConfigError(
            f"register({id!r}, ...): option(s) {twice} given both in kwargs= and as keywords; "
            "give each once"
        )
    return {**kwargs, **defaults}


def _entry_name(entry_point: Any) -> str:
    """``module:qualname`` of an entry point: the same after a module reload."""
    if isinstance(entry_point, str):
        return entry_point
    module = getattr(entry_point, "__module__", "?")
    return f"{module}:{getattr(entry_point, '__qualname__', repr(entry_point))}"


def load_plugins() -> list[str]:
    """Run every ``agentgym.envs`` entry point once; returns the names that failed to load.

    A broken plugin is reported with a warning naming it; it never breaks agentgym.
    """
    global _plugins_loaded
    failed: list[str] = []
    if _plugins_loaded:
        return failed
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            hook = ep.load()
            if callable(hook):
                hook()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a third party's bug must not take agentgym down: one
            # that parses sys.argv or calls sys.exit on import ended every command with it
            failed.append(ep.name)
            warnings.warn(
                f"agentgym plugin {ep.name!r} ({ep.value}) failed to load: {exc!r}", stacklevel=2
            )
    return failed


def registered_envs() -> list[str]:
    """Ids registered through agentgym (built-ins and plugins), sorted."""
    load_plugins()
    return sorted(_OUR_IDS)


def resolve_id(name: str) -> str:
    """Full id for ``name``: an exact id, or a short name such as ``calculator``.

    A short name matches the id's name part case-insensitively, ignoring namespace and
    version; the highest version wins.

    Raises:
        ConfigError: ``name`` is not a string (e.g. an env class: register it, pass its id).
    """
    if not isinstance(name, str):
        raise ConfigError(
            f"an env id is a string such as 'calculator', got {type(name).__name__} {name!r}; "
            "register an env class first: agentgym.register('myorg/Name-v0', MyEnv)"
        )
    load_plugins()
    if name in gymnasium.registry:
        return name
    module, colon, env_name = name.partition(":")
    if colon and module and env_name:  # Gymnasium's "module:Env-v0": the import registers it
        imported = _import_env_module(module, env_name)
        try:
            return resolve_id(env_name)
        except UnknownEnvError:
            raise UnknownEnvError(_registers_no(imported, env_name)) from None
    short = name.lower()
    matches = [i for i in _OUR_IDS if _short_name(i) == short]
    if matches:
        newest = max(_version(i) for i in matches)
        tied = sorted(i for i in matches if _version(i) == newest)
        if len(tied) > 1:  # which won followed the process's hash seed, run to run
            raise ConfigError(
                f"{name!r} names {' and '.join(tied)} (same version, other namespaces); "
                "give the full id"
            )
        return tied[0]
    raise UnknownEnvError(
        f"unknown env {name!r}.{_known(name)} Register yours with "
        "agentgym.register(id, 'pkg.module:Class') in a module, and name it 'module:id'"
    )


def _version(env_id: str) -> int:
    return int(env_id.rsplit("-v", 1)[1])


def _known(name: str) -> str:
    """`` Did you mean 'x'? Registered: a, b.``: what an unknown ``name`` may have meant."""
    close = difflib.get_close_matches(
        name, sorted(_OUR_IDS) + [_short_name(i) for i in _OUR_IDS], n=1
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Registered: {', '.join(sorted(_OUR_IDS)) or 'none'}."


def _import_env_module(module: str, env_name: str) -> ModuleType:
    """Import ``module``, which registers envs, searching the working directory first.

    Why: ``agentgym check`` runs as a console script, whose import path does not hold the
    folder it was started in, where a user's ``myenv.py`` usually is. The folder goes first
    while ``module`` imports, as ``python -m`` and ``python -c`` put it, so the command and a
    script started there find the same ``test.py``; afterwards it stays, but last, so a later
    import of an installed package (transformers ...) is never shadowed by a file there.
    """
    if module.endswith(".py"):  # a file name (``./myenv.py``, as a shell completes it)
        path = PurePath(module).with_suffix("")
        if path.is_absolute() or ".." in path.parts:  # no module name reaches it from here
            fix = (f"run from {path.parent} (or add it to PYTHONPATH) and write "
                   f"'{path.name}:{env_name}'")  # fmt: skip
        else:
            fix = f"'{'.'.join(path.parts)}:{env_name}'"
        raise ConfigError(f"cannot import {module!r}: name the module, not its file, before the "
                          f"colon: {fix}")  # fmt: skip
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module and not module.startswith(f"{exc.name}."):
            raise  # the module imports something missing: its own error says what
        raise ConfigError(
            f"cannot import {module!r} to register its envs ({exc}); run from the folder that "
            "holds it or add that folder to PYTHONPATH"
        ) from None
    finally:
        if cwd in sys.path:  # the first occurrence: the one inserted above
            sys.path.remove(cwd)
        if cwd not in sys.path:
            sys.path.append(cwd)


def _registers_no(module: ModuleType, env_name: str) -> str:
    """Why 'module:id' found no env: where ``module`` came from, and whether it is the user's.

    Why: a module named like one Python already has (``test``, ``json``) may not be the
    user's file at all, and "unknown env" alone sends them looking in the wrong place.
    """
    where = getattr(module, "__file__", None)
    source = f"imported from {where}" if where else "built into Python"
    mine = _module_file_here(module.__name__)
    if mine is not None and not (where and _is_inside(where, mine)):
        return (
            f"module {module.__name__!r} was {source}, so {mine} in the current folder is "
            f"shadowed by it; rename {mine} (e.g. to my_{os.path.basename(mine)}) and write "
            f"the new name before the colon, 'my_{module.__name__}:{env_name}'"
        )
    return f"module {module.__name__!r} ({source}) registers no env {env_name!r}.{_known(env_name)}"


def _module_file_here(module: str) -> str | None:
    """The ``.py`` file or package folder ``module`` names in the working directory, if any."""
    path = os.path.join(*module.split("."))
    if os.path.isfile(f"{path}.py"):
        return f"{path}.py"
    return path if os.path.isfile(os.path.join(path, "__init__.py")) else None


def _is_inside(path: str, mine: str) -> bool:
    """Whether ``path`` is the file ``mine``, or lies in the package folder ``mine``."""
    real, own = os.path.realpath(path), os.path.realpath(mine)
    return os.path.commonpath([real, own]) == own


def _short_name(env_id: str) -> str:
    return env_id.rsplit("/", 1)[-1].rsplit("-v", 1)[0].lower()


def make(id: str | EnvSpec, **kwargs: Any) -> Env:
    """Build a registered env, unwrapped; ``kwargs`` override the registered defaults.

    ``id`` may also be an env's ``spec`` (as `gymnasium.make` takes it): the env is rebuilt
    with the options that spec records.

    Raises:
        UnknownEnvError: nothing is registered under ``id`` (the message suggests close ids).
        ConfigError: the env does not accept one of ``kwargs``.
    """
    if isinstance(id, EnvSpec):
        kwargs = {**(id.kwargs or {}), **kwargs}
        id = id.id
    spec = gymnasium.spec(resolve_id(id))
    factory = _load_entry_point(spec.entry_point)
    merged = {**(spec.kwargs or {}), **kwargs}
    check_env_kwargs(spec.id, factory, merged)
    try:
        env = factory(**merged)
    except TypeError as exc:  # an option the env sets for its base class, unseen in its source
        repeated = _REPEATED.search(str(exc))
        if repeated is None or repeated[1] not in merged:
            raise  # a TypeError from inside the env is a bug there, not a bad option
        raise ConfigError(_set_itself(spec.id, [repeated[1]])) from None
    if not isinstance(env, gymnasium.Env):
        raise ConfigError(
            f"{spec.id}'s entry point returned {type(env).__name__}, not an env; register a "
            "class or a function that returns an agentgym.Env"
        )
    env.spec = _spec_as_made(spec, merged)
    return env


def made_for_a_command(env_id: str, env_kwargs: dict[str, Any]) -> Env:
    """`make`, or one line saying where the env's own code failed to build it (for the CLIs).

    Why: an env whose constructor raised (its service down: a ``ConnectError``; its data
    file missing) printed a full traceback through a command's internals (``eval`` first;
    ``check``, ``train --dry-run`` and ``sft`` too); the line names the env's frame instead.
    `make` itself keeps the traceback, for Python users.
    """
    try:
        return make(env_id, **env_kwargs)
    except Error:
        raise
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        libraries = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                     _OWN_PACKAGE)  # fmt: skip
        own = [f for f in frames if not f.filename.startswith(libraries)] or frames
        where = f" at {own[-1].filename}:{own[-1].lineno}" if own else ""
        raise Error(
            f"{env_id} could not be built: {type(exc).__name__}: {exc}{where} (the env's own "
            f"code raised it; agentgym.make({env_id!r}) in Python shows the whole traceback)"
        ) from exc


def check_env_options(id: str, kwargs: dict[str, Any]) -> None:
    """Refuse an unknown env id, or options its constructor would refuse, building nothing.

    What `make` checks before it builds the env: for a job queued now and built later, maybe
    hours later, by a worker.
    """
    spec = gymnasium.spec(resolve_id(id))
    options = {**(spec.kwargs or {}), **kwargs}
    check_env_kwargs(spec.id, _load_entry_point(spec.entry_point), options)


def _spec_as_made(spec: EnvSpec, options: dict[str, Any]) -> EnvSpec:
    """The env's own spec: the registered one with the options it was made with.

    Why: as after `gymnasium.make`, ``gymnasium.make(env.spec)`` must rebuild this env, not
    the registered default; and the registry's spec object must not be shared (a user who
    edits ``env.spec`` would edit the registry).
    """
    return dataclasses.replace(spec, kwargs=dict(options))


def _load_entry_point(entry_point: Any) -> Callable[..., Env]:
    if callable(entry_point):
        return entry_point
    module_name, _, attr = str(entry_point).partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load entry point {entry_point!r}: {exc}") from exc


def _constructors(factory: Callable[..., Env]) -> Iterator[Callable[..., Any]]:
    """``factory``'s signature, then its bases' ``__init__`` while each passes ``**kwargs`` up.

    Ends with ``object.__init__`` where the chain reaches it (then any keyword is accepted).
    """
    classes = inspect.getmro(factory) if inspect.isclass(factory) else (factory,)
    for owner in classes:
        fn = owner.__init__ if inspect.isclass(owner) else owner
        yield fn
        params = () if fn is object.__init__ else inspect.signature(fn).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return


#: How Python says a call passed one argument twice (positionally and by keyword, or twice).
_REPEATED = re.compile(r"got multiple values for (?:keyword )?argument '(\w+)'")


def _set_itself(env_id: str, names: list[str]) -> str:
    """The one-line refusal of options the env's constructor already passes to its base."""
    return (
        f"{env_id} sets option(s) {names} itself (its constructor passes them to its base "
        f"class), so they cannot be given; drop option(s) {names}"
    )


def _options(factory: Callable[..., Env]) -> tuple[set[str] | None, set[str]]:
    """(keyword names ``factory`` takes, None = any; names its constructors set themselves).

    Follows ``**kwargs`` up a class's bases. A base's option that a subclass passes to
    ``super().__init__`` itself (a ToolEnv subclass's ``tools``, ``tasks``, ``rubric``) is
    not one it takes: given again, the call fails with "got multiple values".
    """
    names: set[str] = set()
    set_itself: set[str] = set()
    open_ended = False  # the last signature passes **kwargs on to nothing we can read
    caller: Callable[..., Any] | None = None
    for fn in _constructors(factory):
        if fn is object.__init__:
            return None, set_itself
        params = inspect.signature(fn).parameters.values()
        if caller is not None:
            set_itself |= _passed_up(caller, fn)
        own = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        names |= own - set_itself
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
        caller = fn
    if inspect.isclass(factory) and issubclass(factory, Env):
        names.add("render_mode")  # every env class takes Gymnasium's (`Env`'s metaclass)
    return (None if open_ended else names - {"self"}), set_itself - names


@functools.cache
def _passed_up(caller: Callable[..., Any], base: Callable[..., Any]) -> frozenset[str]:
    """Parameters of ``base`` that ``caller``'s source fills in its ``super().__init__`` call.

    Read from the source, because only the call itself says which arguments it passes; a
    source that cannot be read or parsed (a C extension, a lambda in a REPL) sets none.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(caller)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return frozenset()
    positional = [
        p.name
        for p in inspect.signature(base).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]
    passed: set[str] = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or (skipped := _leading_self(call)) is None:
            continue
        passed |= {k.arg for k in call.keywords if k.arg is not None}
        args = call.args[skipped:]
        count = next((i for i, a in enumerate(args) if isinstance(a, ast.Starred)), len(args))
        passed |= set(positional[:count])
    return frozenset(passed)


def _leading_self(call: ast.Call) -> int | None:
    """For a ``super().__init__(...)`` call, 0; for ``Base.__init__(self, ...)``, 1; else None.

    The number is how many leading positional arguments are not options (``self``).
    """
    if not isinstance(call.func, ast.Attribute) or call.func.attr != "__init__":
        return None
    target = call.func.value
    if isinstance(target, ast.Call) and isinstance(target.func, ast.Name):
        return 0 if target.func.id == "super" else None
    first = call.args[0] if call.args else None
    return 1 if isinstance(first, ast.Name) and first.id == "self" else None


#: agentgym's own folder: an editable install is outside site-packages, and a frame of its
#: metaclass was named as the env's own code.
_OWN_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


#: Why: ``max_episode_steps`` is Gymnasium's option, not the env's: `gymnasium.make` takes it
#: for its TimeLimit wrapper, which cuts the episode without scoring it, while `make` returns
#: the env unwrapped, so there it reached the env and was refused with no word of the option
#: that does that job.
_STEPS_HINT = (
    "; for max_episode_steps use max_turns (the episode is scored), or "
    "gymnasium.make(..., max_episode_steps=N) for Gymnasium's unscored TimeLimit"
)


#: Why: an episode's time limit is the run's (it cuts the episode from outside, whatever the env
#: is doing), so no env takes one; ``episode_deadline_s=`` was refused with a close match,
#: ``max_episode_tokens``, that does another job.
_DEADLINE = re.compile(r"deadline|episode_time|episode_sec")
_DEADLINE_HINT = (
    "; an episode's time limit is the run's, not the env's: agentgym eval --episode-timeout S, "
    "or agentgym.rollout(..., episode_timeout=S)"
)


#: Why: `rollout` takes the env's options as one dict, ``env_kwargs=``, while `make` and `check`
#: take them as keywords; the dict given to those was refused as an option named env_kwargs.
_NESTED_HINT = (
    "; give the env's options themselves as keywords, agentgym.make(id, num_tasks=5) or "
    "agentgym.check(id, num_tasks=5), not in a dict"
)


def check_env_kwargs(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    """Refuse options ``factory`` does not take, lacks, or sets itself, in one line each.

    Raises:
        ConfigError: naming the env, the options at fault and those it takes.
    """
    if missing := _required_options(factory) - set(kwargs):
        raise ConfigError(  # was the constructor's TypeError, "at agentgym/_env.py"
            f"{env_id} needs option(s) {sorted(missing)}: give them (--env-arg NAME=VALUE, "
            "env_kwargs in a config, or agentgym.make(id, NAME=VALUE))"
        )
    accepted, set_itself = _options(factory)
    if repeated := sorted(set(kwargs) & set_itself):
        raise ConfigError(_set_itself(env_id, repeated))
    if accepted is not None and (unknown := sorted(set(kwargs) - accepted)):
        raise ConfigError(
            f"{env_id} does not take option(s) {unknown}{_meant(unknown, accepted)}; it takes: "
            f"{', '.join(sorted(accepted))}"
            + (_STEPS_HINT if "max_episode_steps" in unknown and "max_turns" in accepted else "")
            + (_DEADLINE_HINT if any(_DEADLINE.search(name) for name in unknown) else "")
            + (_NESTED_HINT if {"env_kwargs", "kwargs"} & set(unknown) else "")
        )
    for name, value in kwargs.items():
        adapter = _plain_option_types(factory).get(name)
        if adapter is None or not isinstance(value, _PLAIN_VALUES):
            continue  # an object from Python code: the env's own business
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            raise ConfigError(
                f"{env_id}: option {name}={value!r} is not valid: {reason[0].lower()}{reason[1:]}"
                + _as_text_hint(adapter, name, value)
            ) from None


def _meant(unknown: list[str], accepted: set[str]) -> str:
    """`` (did you mean max_turns?)``: the accepted names closest to misspelt options.

    Why: the list of what an env takes runs to a dozen names; a one-letter typo
    (``max_turn``) is quicker fixed when the line names the one meant. Names with a hint of
    their own (max_episode_steps, a deadline) get no close match: the closest,
    ``max_episode_tokens``, does another job.
    """
    close = [
        match
        for name in unknown
        if name != "max_episode_steps" and not _DEADLINE.search(name)
        for match in difflib.get_close_matches(name, accepted, n=1)
    ]
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _as_text_hint(adapter: TypeAdapter[Any], name: str, value: Any) -> str:
    """How to give as text a value the command line read as a number (``--env-arg code=123``)."""
    if isinstance(value, (dict, list, str)) or value is None:
        return ""
    text = json.dumps(value)
    try:
        adapter.validate_python(text, strict=True)
    except ValidationError:
        return ""
    return f"; to give it as text, quote it as JSON: --env-arg '{name}=\"{text}\"'"


@functools.cache  # `make` runs for every env a rollout builds
def _required_options(factory: Callable[..., Env]) -> frozenset[str]:
    """The keyword options ``factory``'s own signature has no default for."""
    fn = next(_constructors(factory))
    if fn is object.__init__:
        return frozenset()
    params = list(inspect.signature(fn).parameters.values())[1 if inspect.isclass(factory) else 0:]
    return frozenset(p.name for p in params if p.default is p.empty
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))  # fmt: skip


#: Values a config file or the command line can hold; only these are type-checked.
_PLAIN_VALUES = (str, int, float, bool, list, dict, type(None))
_PLAIN_TYPES = (str, int, float, bool, type(None))
_CONTAINERS = (Union, UnionType, list, dict, abc.Sequence, abc.Mapping)  # no tuple: YAML has none


@functools.cache
def _plain_option_types(factory: Callable[..., Env]) -> dict[str, TypeAdapter[Any]]:
    """Validators for the options annotated with plain types (int, str | None, Literal ...).

    Why: ``--env-arg max_turns=abc`` reached the env as a string and failed deep inside it
    with a TypeError. Options of other types (tools, rubrics, parsers) are not checked, nor
    are annotations that cannot be resolved.
    """
    adapters: dict[str, TypeAdapter[Any]] = {}
    seen = {"return"}  # a subclass's annotation of an option wins over its bases'
    for fn in _constructors(factory):
        for name, hint in _resolvable_hints(fn).items():
            if name not in seen and _is_plain(hint):
                adapters[name] = TypeAdapter(hint)
            seen.add(name)
    return adapters


def _resolvable_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations that resolve, each on its own.

    Why not `typing.get_type_hints` on ``fn``: one forward reference that only resolves for
    type checkers (a ``TYPE_CHECKING`` import, a string alias) made it raise, and every option
    of that constructor went unchecked (the search env's ``num_tasks=abc`` was a TypeError).
    """
    hints: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", {})
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        one = types.SimpleNamespace(__annotations__={name: annotation})
        try:
            hints |= typing.get_type_hints(one, globalns=namespace)
        except Exception:  # resolves only for type checkers: this option goes unchecked
            continue
    return hints


def _is_plain(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is None:
        return hint in _PLAIN_TYPES
    if origin is Literal:
        return True
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return origin in _CONTAINERS and all(_is_plain(a) for a in args)
