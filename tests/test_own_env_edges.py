"""A user's own tool env at its edges: what a probe writing envs as users do found wrong.

Arguments the model sent arrived as other types (a dict's whole floats, a ``dict[int, str]``'s
keys), a nested typo ran with the default, a tool under a logging decorator was never awaited,
an exception whose ``__str__`` fails crashed the step; construction mistakes (a Rubric of one
function, a DataFrame of tasks, ``max_turns=1.5``, an env option without default, two envs of
one short name) failed late, vaguely or depending on the hash seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import ConfigError, Rubric, ToolEnv, tool


def reply_to(t: Any, arguments: dict[str, Any]) -> str:
    """The tool message the model reads after calling ``t`` with ``arguments``."""
    env = ToolEnv([t], tasks=[{"prompt": "p"}])
    env.reset(seed=0)
    call = json.dumps({"name": t.name, "arguments": arguments}, ensure_ascii=False)
    messages, *_ = env.step(f"<tool_call>{call}</tool_call>")
    return str(messages[-1]["content"])


# --- what a tool receives ------------------------------------------------------------------------


@tool
def seats(counts: dict[str, int]) -> str:
    """Seats per colour.

    Args:
        counts: how many seats of each colour.
    """
    return json.dumps({colour: ["seat"] * n for colour, n in counts.items()})


@tool
def rename(names: dict[int, str]) -> str:
    """Rename rows by number.

    Args:
        names: the new name of each row number.
    """
    rows = {1: "alpha", 2: "beta"} | names
    return json.dumps(sorted(rows.items()))


@dataclasses.dataclass
class Query:
    text: str
    limit: int = 10


@tool
def search(query: Query) -> str:
    """Search.

    Args:
        query: what to search, and how many hits.
    """
    return f"{query.limit} hits for {query.text}"


def test_whole_floats_in_a_dicts_values_arrive_as_ints() -> None:
    """JSON Schema counts 2.0 as an integer: ``["seat"] * 2.0`` raised in the tool."""
    assert reply_to(seats, {"counts": {"red": 2.0}}) == '{"red": ["seat", "seat"]}'


def test_integer_keys_of_a_dict_arrive_as_ints() -> None:
    """JSON keys are strings: ``{"1": "gamma"}`` added a second row 1 instead of renaming it."""
    assert reply_to(rename, {"names": {"1": "gamma"}}) == '[[1, "gamma"], [2, "beta"]]'
    assert reply_to(rename, {"names": {"one": "gamma"}}).startswith("Error: ")


def test_an_unknown_key_inside_a_dataclass_argument_is_refused_as_at_the_top() -> None:
    """``{"text": "cats", "Limit": 3}`` ran with limit 10 and no word to the model."""
    assert reply_to(search, {"query": {"text": "cats", "limit": 3}}) == "3 hits for cats"
    said = reply_to(search, {"query": {"text": "cats", "Limit": 3}})
    assert said.startswith("Error: invalid arguments for 'search': query: Additional "
                           "properties are not allowed ('Limit' was unexpected)")  # fmt: skip


def logged(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@tool
@logged
async def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: its address.
    """
    await asyncio.sleep(0)
    return f"page at {url}"


def test_an_async_tool_under_a_sync_decorator_is_awaited() -> None:
    """The model read "'fetch' returned a coroutine, which is not JSON data"."""
    assert fetch.is_async
    assert reply_to(fetch, {"url": "x"}) == "page at x"


class APIError(Exception):
    def __str__(self) -> str:
        return str(self.args[0]["message"])  # the response has no message: a KeyError


@tool
def create_ticket(title: str) -> str:
    """Open a ticket.

    Args:
        title: its title.
    """
    raise APIError({"code": 400})


def test_a_tool_error_whose_message_cannot_be_printed_still_reaches_the_model() -> None:
    """Formatting the error raised a KeyError out of ``env.step``."""
    assert reply_to(create_ticket, {"title": "x"}) == (
        "Error: 'create_ticket' raised APIError: (its message could not be printed: its "
        "__str__ raised)"
    )


def test_the_arguments_a_model_wrote_keep_its_characters() -> None:
    """Stored as ``Z\\u00fcrich``, the turn re-rendered with escapes the model never wrote."""
    call = agentgym.parsers.ToolCall("weather", {"city": "Zürich"}, id="call_1")
    assert call.to_openai()["function"]["arguments"] == '{"city": "Zürich"}'


# --- construction mistakes ----------------------------------------------------------------------


def exact(completion: str, /) -> float:
    return 1.0


def steps(completion: str):  # type: ignore[no-untyped-def]
    yield 1.0


@pytest.mark.parametrize(
    ("funcs", "said"),
    [
        (exact, r"^Rubric takes a list of reward functions: Rubric\(\[fn\]\)$"),
        ([exact], r"'exact' takes \['completion'\] positionally only"),
        ([steps], r"'steps' is a generator: it must return a number"),
    ],
    ids=["not_a_list", "positional_only", "generator"],
)
def test_a_rubric_that_would_fail_every_episode_is_refused_when_made(funcs: Any, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        Rubric(funcs)


@pytest.mark.parametrize("value", [None, "3", 1.5, True])
def test_max_turns_must_be_a_whole_number(value: Any) -> None:
    """``1.5`` played two turns; None and "3" raised a bare TypeError."""
    with pytest.raises(ConfigError, match=f"max_turns must be an int >= 1, got {value!r}"):
        ToolEnv([seats], tasks=[{"prompt": "p"}], max_turns=value)


def test_tasks_as_a_dataframe_name_the_conversion() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame([{"prompt": "p", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"got a DataFrame; pass df.to_dict\('records'\)"):
        ToolEnv([seats], tasks=frame)


class Plain(ToolEnv):
    def __init__(self) -> None:
        super().__init__([seats], tasks=[{"prompt": "p"}])


def test_a_short_name_two_namespaces_share_at_one_version_is_refused() -> None:
    """Which env ``make("plainer")`` built followed the process's hash seed."""
    agentgym.register("edges/Plainer-v0", Plain)
    agentgym.register("others/Plainer-v0", Plain)
    with pytest.raises(ConfigError, match=r"'plainer' names edges/Plainer-v0 and "
                       r"others/Plainer-v0 \(same version, other namespaces\); give the full id"):
        agentgym.make("plainer")  # fmt: skip
    agentgym.register("others/Plainer-v1", Plain)
    assert agentgym.make("plainer").spec.id == "others/Plainer-v1"  # a higher version wins


def test_a_version_with_a_leading_zero_is_refused_when_registered() -> None:
    """Registered, ``-v01`` could be made by neither spelling (Gymnasium reads version 1)."""
    with pytest.raises(ConfigError, match=r"without leading zeros: -v1, not -v01"):
        agentgym.register("edges/Thing-v01", Plain)


GREETER = '''
import agentgym
from agentgym import ToolEnv


class Greeter(ToolEnv):
    def __init__(self, greeting: str) -> None:
        super().__init__(tasks=[{"prompt": greeting}])


agentgym.register("edges/Greeter-v0", Greeter)
'''


def agentgym_cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("agentgym")), *args]
    env = {**os.environ, "AGENTGYM_RUNS_DB": "off", "COLUMNS": "250"}
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120,
                          env=env)  # fmt: skip


def test_an_option_without_default_is_named_with_how_to_give_it(tmp_path: Path) -> None:
    """The line blamed agentgym's own metaclass for "missing 1 required positional argument"
    and never said --env-arg; a number given for a text option did not say how to quote it."""
    (tmp_path / "greeter.py").write_text(GREETER)
    missing = agentgym_cli(tmp_path, "check", "greeter:edges/Greeter-v0")
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "error: edges/Greeter-v0 needs option(s) ['greeting']: give them (--env-arg NAME=VALUE, "
        "env_kwargs in a config, or agentgym.make(id, NAME=VALUE))"
    )
    number = agentgym_cli(tmp_path, "check", "greeter:edges/Greeter-v0", "--env-arg",
                          "greeting=123")  # fmt: skip
    assert number.returncode == 2
    assert number.stderr.strip().endswith("""quote it as JSON: --env-arg 'greeting="123"'""")
    quoted = agentgym_cli(tmp_path, "check", "greeter:edges/Greeter-v0", "--env-arg",
                          'greeting="123"')  # fmt: skip
    assert quoted.returncode == 0, quoted.stderr


def test_a_tool_that_returns_a_task_is_timed_as_a_coroutine_is() -> None:
    """A wrapper returning ``asyncio.ensure_future(...)`` was awaited with no timeout."""

    async def never() -> str:
        await asyncio.Event().wait()  # never set: the hang under test
        return "done"

    def scheduled(city: str) -> Any:
        return asyncio.ensure_future(never())

    async def reference(city: str) -> str:
        """Look a city up.

        Args:
            city: its name.
        """
        return city

    functools.update_wrapper(scheduled, reference)
    lookup = tool(scheduled, timeout=0.2)
    assert lookup.is_async
    assert reply_to(lookup, {"city": "x"}).startswith("Error: 'reference' timed out after 0.2 s")
