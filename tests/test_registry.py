"""Registry: `register`/`make`, Gymnasium interop, entry-point plugins, `check_env` over all ids."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym import ConfigError, ToolEnv, UnknownEnvError
from agentgym import _registry as registry_module
from agentgym.sandboxes import close_shared_pools
from tests.sandboxes.conftest import require_docker

#: Warnings `check_env` may raise that say nothing about our envs; none are expected today.
BENIGN_WARNINGS: tuple[str, ...] = ()


class Tiny(ToolEnv):
    """A tool-less env with one task; ``greeting`` is its only option."""

    def __init__(self, greeting: str = "hello", max_turns: int = 3) -> None:
        super().__init__([], tasks=[{"prompt": greeting}], max_turns=max_turns)
        self.greeting = greeting


@pytest.fixture
def registered() -> Iterator[str]:
    env_id = "testns/Tiny-v0"
    agentgym.register(env_id, Tiny, greeting="default")
    yield env_id
    del gymnasium.registry[env_id]
    registry_module._OUR_IDS.discard(env_id)


def test_make_by_id_and_short_name(registered: str) -> None:
    assert registered in agentgym.registered_envs()
    by_id = agentgym.make(registered)
    by_short = agentgym.make("tiny")
    assert isinstance(by_id, Tiny) and isinstance(by_short, Tiny)
    assert by_id.greeting == by_short.greeting == "default"
    assert by_id.spec is not None and by_id.spec.id == registered


def test_make_kwargs_override_defaults(registered: str) -> None:
    env = agentgym.make(registered, greeting="hi", max_turns=7)
    assert env.greeting == "hi" and env.max_turns == 7
    obs, _ = env.reset(seed=0)
    assert obs[-1]["content"] == "hi"


def test_make_unknown_kwargs_named(registered: str) -> None:
    with pytest.raises(ConfigError, match=r"\['colour', 'size'\]") as excinfo:
        agentgym.make(registered, colour="red", size=3)
    assert "greeting" in str(excinfo.value)  # lists what it does take


def test_calculator_short_name_and_kwargs() -> None:
    env = agentgym.make("calculator", num_tasks=3, max_turns=2)
    assert env.spec.id == "agentgym/Calculator-v0"
    assert len(env.tasks) == 3 and env.max_turns == 2
    with pytest.raises(ConfigError, match="bogus"):
        agentgym.make("calculator", bogus=1)


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        ({"max_turns": "abc"}, "max_turns='abc' is not valid: input should be a valid integer"),
        ({"max_turns": True}, "max_turns=True is not valid"),  # bool is an int to Python
        ({"tool_prompt": "sys"}, "input should be 'template' or 'system'"),  # a Literal
        ({"tool_timeout": "2s"}, "tool_timeout='2s' is not valid"),  # float | None
        ({"seed": 1.5}, "seed=1.5 is not valid"),  # the subclass's own option
    ],
)
def test_make_refuses_an_option_of_the_wrong_type_naming_it(
    option: dict[str, object], fragment: str
) -> None:
    # what --env-arg and a config's env_kwargs hand over: strings, numbers, booleans
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        agentgym.make("calculator", **option)


@pytest.mark.parametrize("env_id", ["pythoncode", "search"])
def test_one_unresolvable_annotation_leaves_the_other_options_checked(env_id: str) -> None:
    """Their ``tasks`` is annotated with a string alias; every option went unchecked."""
    with pytest.raises(ConfigError, match=re.escape("num_tasks='abc' is not valid")):
        agentgym.make(env_id, num_tasks="abc")


def test_a_factory_function_taking_any_keyword_gets_every_option() -> None:
    def factory(**options: object) -> ToolEnv:
        return ToolEnv([], tasks=[{"prompt": str(options)}])

    agentgym.register("tests/AnyOptions-v0", factory)
    env = agentgym.make("tests/AnyOptions-v0", colour="red")
    assert env.tasks[0]["prompt"] == "{'colour': 'red'}"


def test_make_takes_options_of_the_annotated_types_and_objects_unchecked() -> None:
    env = agentgym.make("calculator", max_turns=3, tool_timeout=2, system_prompt=None)
    assert env.max_turns == 3 and env.tools["calculate"].timeout == 2  # an int is a float
    parser = agentgym.parsers.get_parser("hermes")
    assert agentgym.make("calculator", parser=parser).parser is parser  # not plain: not checked


def test_make_rejects_kwargs_the_env_sets_itself() -> None:
    with pytest.raises(ConfigError):
        agentgym.make("calculator", tasks=[{"prompt": "x"}])


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("calculater", "calculator"), ("agentgym/Calculator-v9", "agentgym/Calculator-v0")],
)
def test_unknown_id_suggests(name: str, suggestion: str) -> None:
    with pytest.raises(UnknownEnvError) as excinfo:
        agentgym.make(name)
    message = str(excinfo.value)
    assert f"Did you mean {suggestion!r}?" in message
    assert "\n" not in message
    assert isinstance(excinfo.value, ConfigError)


def test_unknown_id_without_close_match() -> None:
    with pytest.raises(UnknownEnvError, match="Registered: .*agentgym/Calculator-v0") as excinfo:
        agentgym.make("zzzzzzzz")
    assert "Did you mean" not in str(excinfo.value)


@pytest.mark.parametrize("bad_id", ["no-version", "ns/Name-vx", "has space-v0", ""])
def test_register_rejects_bad_ids(bad_id: str) -> None:
    with pytest.raises(ConfigError, match="must look like"):
        agentgym.register(bad_id, Tiny)


def test_bad_entry_point_string_is_config_error() -> None:
    env_id = "testns/Missing-v0"
    agentgym.register(env_id, "agentgym_no_such_module:Env")
    try:
        with pytest.raises(ConfigError, match="cannot load entry point"):
            agentgym.make(env_id)
    finally:
        del gymnasium.registry[env_id]
        registry_module._OUR_IDS.discard(env_id)


def test_gymnasium_make_steps_calculator() -> None:
    env = gymnasium.make("agentgym/Calculator-v0")
    obs, info = env.reset(seed=0)
    assert obs[-1]["role"] == "user"
    task = info["task"]
    inner = env.unwrapped
    obs, _, terminated, _, _ = env.step(inner.reference_turns(task)[0])
    assert not terminated and obs[-1] == {
        "role": "tool", "tool_call_id": "call_1_0", "name": "calculate", "content": task["answer"]
    }  # fmt: skip
    _, reward, terminated, _, _ = env.step(inner.reference_turns(task)[1])
    assert terminated and reward == 1.0
    env.close()


@pytest.mark.parametrize("env_id", agentgym.registered_envs())
def test_check_env_passes_for_every_registered_env(env_id: str, request) -> None:
    env = agentgym.make(env_id)
    if "docker" in env.metadata.get("requires", ()):
        require_docker()
        request.addfinalizer(close_shared_pools)
    gc.collect()  # earlier tests' garbage must not warn inside this block
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()
    unexpected = [str(w.message) for w in caught if not str(w.message).startswith(BENIGN_WARNINGS)]
    assert unexpected == []


# --- entry-point plugins, installed for real with pip ----------------------------------------

PLUGIN_MODULE = '''
"""A third-party env package."""
import agentgym
from agentgym import ToolEnv, tool


@tool
def echo(text: str) -> str:
    """Echo text back.

    Args:
        text: what to echo.
    """
    return "echo:" + text


class EchoEnv(ToolEnv):
    """Say something through the echo tool."""

    def __init__(self, max_turns: int = 3) -> None:
        super().__init__([echo], tasks=[{"prompt": "say hi"}], max_turns=max_turns)


def register_envs():
    agentgym.register("myplugin/Echo-v0", "myplugin:EchoEnv")
'''

BROKEN_MODULE = """
def register_envs():
    raise RuntimeError("plugin exploded")
"""


def _install(tmp: Path, name: str, source: str) -> Path:
    """pip-install a one-module package with an ``agentgym.envs`` entry point into ``tmp/site``."""
    pkg = tmp / f"{name}-src"
    pkg.mkdir()
    (pkg / f"{name}.py").write_text(source)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.0.1"

        [tool.setuptools]
        py-modules = ["{name}"]

        [project.entry-points."agentgym.envs"]
        {name} = "{name}:register_envs"
        """)
    )
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(pkg)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return site


def _run_python(site: Path, code: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_entry_point_plugin(tmp_path: Path) -> None:
    site = _install(tmp_path, "myplugin", PLUGIN_MODULE)
    out = _run_python(
        site,
        """
        import json, sys
        import agentgym
        imported_at_import = "myplugin" in sys.modules
        env = agentgym.make("myplugin/Echo-v0")
        env.reset(seed=0)
        text = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
        obs, reward, terminated, truncated, info = env.step(text)
        print(json.dumps({
            "imported_at_import": imported_at_import,
            "type": type(env).__name__,
            "tool_reply": obs[-1]["content"],
            "terminated": terminated,
            "ids": agentgym.registered_envs(),
            "short": agentgym.make("echo").spec.id,
        }))
        """,
    )
    assert out["imported_at_import"] is False  # plugins load lazily, not on import
    assert out["type"] == "EchoEnv"
    assert out["tool_reply"] == "echo:hi" and out["terminated"] is False
    assert "myplugin/Echo-v0" in out["ids"] and "agentgym/Calculator-v0" in out["ids"]
    assert out["short"] == "myplugin/Echo-v0"


def test_module_colon_id_imports_a_users_env_from_the_working_folder(tmp_path: Path) -> None:
    # Gymnasium's "module:Env-v0", from the console script (whose import path lacks the cwd)
    (tmp_path / "myenvs.py").write_text(
        PLUGIN_MODULE.replace("myplugin:EchoEnv", "myenvs:EchoEnv") + "\nregister_envs()\n"
    )
    agentgym_cli = str(Path(sys.executable).with_name("agentgym"))
    proc = subprocess.run([agentgym_cli, "check", "myenvs:myplugin/Echo-v0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "gymnasium check_env" in proc.stdout, proc.stderr
    missing = subprocess.run([agentgym_cli, "check", "nosuchmod:myplugin/Echo-v0"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 2 and "cannot import 'nosuchmod'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_users_module_missing_a_dependency_keeps_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "needsdep.py").write_text("import not_installed_anywhere\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cwd it appends goes with the test
    with pytest.raises(ModuleNotFoundError, match="not_installed_anywhere"):
        agentgym.make("needsdep:x/Y-v0")  # not blamed on the module name


#: A plugin that parses the command line when imported (argparse exits 2 on `agentgym list`).
EXITING_MODULE = """
import sys
sys.exit(2)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "said"), [(BROKEN_MODULE, "plugin exploded"), (EXITING_MODULE, "SystemExit(2)")],
    ids=["raises", "exits"],
)  # fmt: skip
def test_broken_plugin_warns_and_agentgym_still_works(
    tmp_path: Path, source: str, said: str
) -> None:
    site = _install(tmp_path, "brokenplugin", source)
    out = _run_python(
        site,
        """
        import json, warnings
        import agentgym
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ids = agentgym.registered_envs()
        env = agentgym.make("calculator")
        obs, _ = env.reset(seed=0)
        print(json.dumps({
            "warnings": [str(w.message) for w in caught],
            "ids": ids,
            "reset_ok": obs[-1]["role"] == "user",
        }))
        """,
    )
    assert len(out["warnings"]) == 1
    assert "brokenplugin" in out["warnings"][0] and said in out["warnings"][0]
    assert "agentgym/Calculator-v0" in out["ids"]
    assert out["reset_ok"] is True


class BuggyInside(ToolEnv):
    """Its constructor has a bug that raises a keyword TypeError of its own."""

    def __init__(self, greeting: str = "hi") -> None:
        dict.fromkeys([], bogus=1)  # the bug: a TypeError about a keyword argument
        super().__init__()


def test_a_typeerror_inside_an_env_is_not_blamed_on_the_options() -> None:
    agentgym.register("tests/BuggyInside-v0", BuggyInside)
    with pytest.raises(TypeError, match="keyword argument") as excinfo:
        agentgym.make("tests/BuggyInside-v0", greeting="hello")
    assert not isinstance(excinfo.value, ConfigError)


def test_registering_another_env_under_a_taken_id_warns(registered: str) -> None:
    class Other(Tiny):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agentgym.register(registered, Tiny)  # the same entry point again (a reload): silent
    with pytest.warns(UserWarning, match=r"replaces \S*test_registry:Tiny with \S*Other"):
        agentgym.register(registered, Other)
    assert isinstance(agentgym.make(registered), Other)  # replaced, as Gymnasium does


def test_a_factory_that_returns_no_env_and_a_class_given_as_id_are_named() -> None:
    agentgym.register("tests/NotAnEnv-v0", lambda: "oops")
    try:
        with pytest.raises(ConfigError, match="entry point returned str, not an env"):
            agentgym.make("tests/NotAnEnv-v0")
    finally:  # other tests make every registered env
        del gymnasium.registry["tests/NotAnEnv-v0"]
        registry_module._OUR_IDS.discard("tests/NotAnEnv-v0")
    with pytest.raises(ConfigError, match="an env id is a string.*agentgym.register"):
        agentgym.check(Tiny)  # type: ignore[arg-type]
