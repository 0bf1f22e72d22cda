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

import difflib
import functools
import importlib
import inspect
import os
import re
import sys
import typing
import warnings
from collections import abc
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from types import UnionType
from typing import Any, Literal, Union

import gymnasium
from pydantic import TypeAdapter, ValidationError

from ._env import Env
from ._errors import ConfigError, UnknownEnvError

ENTRY_POINT_GROUP = "agentgym.envs"
_OUR_IDS: set[str] = set()
_plugins_loaded = False


def register(id: str, entry_point: str | Callable[..., Env], **defaults: Any) -> None:
    """Register an env under ``id`` (e.g. ``"myorg/Search-v0"``).

    Args:
        id: Gymnasium-style id, ``[namespace/]Name-vN``.
        entry_point: ``"package.module:ClassOrFactory"`` (imported only on `make`) or a callable.
        defaults: keyword arguments passed to the entry point; `make`'s kwargs override them.
    """
    if not re.fullmatch(r"([\w.-]+/)?[\w.:-]+-v\d+", id):
        raise ConfigError(f"env id {id!r} must look like 'namespace/Name-v0'")
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
        except Exception as exc:  # a third party's bug must not take agentgym down
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
        _import_env_module(module)
        return resolve_id(env_name)
    short = name.lower()
    matches = [i for i in _OUR_IDS if _short_name(i) == short]
    if matches:
        return max(matches, key=lambda i: int(i.rsplit("-v", 1)[1]))
    close = difflib.get_close_matches(
        name, sorted(_OUR_IDS) + [_short_name(i) for i in _OUR_IDS], n=1
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    known = ", ".join(sorted(_OUR_IDS)) or "none"
    raise UnknownEnvError(
        f"unknown env {name!r}.{hint} Registered: {known}. Register yours with "
        "agentgym.register(id, 'pkg.module:Class') in a module, and name it 'module:id'"
    )


def _import_env_module(module: str) -> None:
    """Import ``module``, which registers envs; the working directory is searched last.

    Why: ``agentgym train`` runs as a console script, whose import path does not hold the
    folder it was started in, where a user's ``myenv.py`` usually is.
    """
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # last: never shadows an installed package
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module and not module.startswith(f"{exc.name}."):
            raise  # the module imports something missing: its own error says what
        raise ConfigError(
            f"cannot import {module!r} to register its envs ({exc}); run from the folder that "
            "holds it or add that folder to PYTHONPATH"
        ) from None


def _short_name(env_id: str) -> str:
    return env_id.rsplit("/", 1)[-1].rsplit("-v", 1)[0].lower()


def make(id: str, **kwargs: Any) -> Env:
    """Build a registered env, unwrapped; ``kwargs`` override the registered defaults.

    Raises:
        UnknownEnvError: nothing is registered under ``id`` (the message suggests close ids).
        ConfigError: the env does not accept one of ``kwargs``.
    """
    spec = gymnasium.spec(resolve_id(id))
    factory = _load_entry_point(spec.entry_point)
    merged = {**(spec.kwargs or {}), **kwargs}
    _check_kwargs(spec.id, factory, merged)
    try:
        env = factory(**merged)
    except TypeError as exc:  # e.g. an option the env already sets for its base class
        named = [k for k in kwargs if f"keyword argument '{k}'" in str(exc)]
        if not named:
            raise  # a TypeError from inside the env is a bug there, not a bad option
        raise ConfigError(f"{spec.id}: {exc}; drop option(s) {named}") from exc
    if not isinstance(env, gymnasium.Env):
        raise ConfigError(
            f"{spec.id}'s entry point returned {type(env).__name__}, not an env; register a "
            "class or a function that returns an agentgym.Env"
        )
    env.spec = spec
    return env


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


def _accepted_kwargs(factory: Callable[..., Env]) -> set[str] | None:
    """Keyword names ``factory`` takes, following ``**kwargs`` up a class's bases; None = any."""
    names: set[str] = set()
    open_ended = False  # the last signature passes **kwargs on to nothing we can read
    for fn in _constructors(factory):
        if fn is object.__init__:
            return None
        params = inspect.signature(fn).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
    return None if open_ended else names - {"self"}


def _check_kwargs(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    accepted = _accepted_kwargs(factory)
    if accepted is not None and (unknown := sorted(set(kwargs) - accepted)):
        raise ConfigError(
            f"{env_id} does not take option(s) {unknown}; it takes: {', '.join(sorted(accepted))}"
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
            ) from None


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
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # a forward reference that only resolves for type checkers
            continue
        for name, hint in hints.items():
            if name not in seen and _is_plain(hint):
                adapters[name] = TypeAdapter(hint)
            seen.add(name)
    return adapters


def _is_plain(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is None:
        return hint in _PLAIN_TYPES
    if origin is Literal:
        return True
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return origin in _CONTAINERS and all(_is_plain(a) for a in args)


