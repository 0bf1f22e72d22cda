"""Tool parameters real APIs take: models, dataclasses, TypedDicts, dates, enums, unions.

Pydantic writes their schemas and turns the model's JSON arguments into the declared Python
types; the schema the model sees stays clean (no titles, `$defs` inlined unless recursive).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
import sys
import typing
from typing import Annotated, Any, Literal, Optional

import jsonschema
import pydantic
import pytest
from typing_extensions import TypedDict

from agentgym import ConfigError, ToolArgumentsError, ToolEnv, tool
from agentgym._fast_schema import compile_fast_check
from agentgym._tool_schema import example_arguments


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Item(pydantic.BaseModel):
    """One line of an order."""

    sku: str
    quantity: int = pydantic.Field(1, ge=1, description="how many")
    size: Size = Size.SMALL


@dataclasses.dataclass
class Address:
    street: str
    city: str
    title: str = ""  # a field named like the schema keyword must survive tidying


class Customer(TypedDict):
    name: str
    email: str


class Plain(typing.TypedDict):
    """A TypedDict from `typing`, which pydantic takes only on Python 3.12+."""

    a: int


class Opaque:
    """A class pydantic knows nothing about."""


class Folder(pydantic.BaseModel):
    name: str
    children: list[Folder] = []


class Window(pydantic.BaseModel):
    start: datetime.date
    end: datetime.date

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end < self.start:
            raise ValueError("end is before start")
        return self


@tool
def place_order(
    items: list[Item],
    ship_to: Address,
    customer: Customer,
    deliver_on: datetime.date,
    size: Size,
    note: Optional[str] = None,  # noqa: UP045  (the typing spelling is what we test)
    mode: Literal["standard", "express"] = "standard",
    task: dict | None = None,
    state: Any = None,
) -> dict[str, Any]:
    """Place an order.

    Args:
        items: what to order.
        ship_to: where to ship.
        customer: who orders.
        deliver_on: the delivery day.
        size: the box size.
        note: for the courier.
        mode: shipping speed.
    """
    return {
        "items": items, "ship_to": ship_to, "customer": customer, "deliver_on": deliver_on,
        "size": size, "note": note, "mode": mode, "task": task,
    }  # fmt: skip


ORDER = {
    "items": [{"sku": "A1", "quantity": 2, "size": "large"}, {"sku": "B2"}],
    "ship_to": {"street": "1 Main St", "city": "Lima"},
    "customer": {"name": "Ada", "email": "ada@example.com"},
    "deliver_on": "2024-05-01",
    "size": "small",
}


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every schema object in ``node`` (property maps are walked, not counted)."""
    if isinstance(node, list):
        return [s for n in node for s in _walk(n)]
    if not isinstance(node, dict):
        return []
    found = [node]
    for key, value in node.items():
        if key == "properties":
            found += [s for v in value.values() for s in _walk(v)]
        elif key not in ("default", "enum", "const"):
            found += _walk(value)
    return found


async def test_arguments_arrive_as_the_declared_types() -> None:
    result = await place_order.acall(ORDER, {"task": {"id": 7}})
    assert result["items"] == [Item(sku="A1", quantity=2, size=Size.LARGE), Item(sku="B2")]
    assert result["ship_to"] == Address(street="1 Main St", city="Lima")
    assert result["customer"] == {"name": "Ada", "email": "ada@example.com"}
    assert result["deliver_on"] == datetime.date(2024, 5, 1)
    assert result["size"] is Size.SMALL
    assert (result["note"], result["mode"], result["task"]) == (None, "standard", {"id": 7})


async def test_a_whole_float_where_an_int_is_due_arrives_as_an_int() -> None:
    """JSON Schema counts 5.0 as an integer: it reached a plain ``int`` parameter as a float,
    where ``range(count)`` raised and the model was told the tool had failed. Nested ones and
    optional ones too; a float with a fraction is still refused."""
    seen: list[Any] = []

    @tool
    def repeat(count: int, sizes: list[int] | None = None, cap: int | None = None,
               ratio: float = 1.0) -> str:  # fmt: skip
        """Repeat.

        Args:
            count: how many times.
            sizes: their sizes.
            cap: at most this many.
            ratio: a ratio.
        """
        seen.append((count, sizes, cap, ratio))
        return "x" * len(range(count))

    assert await repeat.acall({"count": 2.0, "sizes": [1, 2.0], "cap": 3.0, "ratio": 2.0}) == "xx"
    assert seen[-1] == (2, [1, 2], 3, 2.0)
    assert [type(v) for v in (*seen[-1][:1], *seen[-1][1], seen[-1][2])] == [int, int, int, int]
    assert type(seen[-1][3]) is float  # a number stays what the model wrote
    assert await repeat.acall({"count": 1e3}) == "x" * 1000 and type(seen[-1][0]) is int
    with pytest.raises(ToolArgumentsError, match=re.escape("count: 5.5 is not of type 'integer'")):
        await repeat.acall({"count": 5.5})


def test_schema_is_clean_and_keeps_docstring_descriptions() -> None:
    params = place_order.parameters
    json.dumps(params)
    assert "$defs" not in params and "$ref" not in json.dumps(params)
    assert all("title" not in s for s in _walk(params))
    props = params["properties"]
    assert list(props) == ["items", "ship_to", "customer", "deliver_on", "size", "note", "mode"]
    assert params["required"] == ["items", "ship_to", "customer", "deliver_on", "size"]
    assert props["items"]["description"] == "what to order."
    item = props["items"]["items"]
    assert item["description"] == "One line of an order."  # the model's docstring
    assert item["required"] == ["sku"]
    assert item["properties"]["quantity"] == {
        "type": "integer", "minimum": 1, "default": 1, "description": "how many",
    }  # fmt: skip
    assert item["properties"]["size"]["enum"] == ["small", "large"]
    assert set(props["ship_to"]["properties"]) == {"street", "city", "title"}
    assert props["customer"]["required"] == ["name", "email"]
    date = {"type": "string", "format": "date", "description": "the delivery day."}
    assert props["deliver_on"] == date
    assert props["mode"]["enum"] == ["standard", "express"]
    assert props["mode"]["default"] == "standard"
    jsonschema.Draft202012Validator(params).validate(ORDER)


def test_injected_parameters_stay_out_of_the_schema() -> None:
    assert place_order.injected == {"task", "state"}
    assert "task" not in place_order.parameters["properties"]
    assert "state" not in place_order.parameters["properties"]


async def test_model_cannot_forge_an_injected_parameter() -> None:
    with pytest.raises(ToolArgumentsError, match="task"):
        await place_order.acall({**ORDER, "task": {"id": "forged"}}, {"task": {"id": 7}})


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"items": [{"sku": "A1", "quantity": "two"}]}, "items/0/quantity"),
        ({"items": [{"sku": "A1"}, {"quantity": 2}]}, "items/1"),
        ({"items": [{"sku": "A1", "quantity": 0}]}, "items/0/quantity"),
        ({"items": [{"sku": "A1", "size": "huge"}]}, "items/0/size"),
        ({"ship_to": {"street": "1 Main St"}}, "ship_to"),
        ({"customer": {"name": "Ada", "email": 5}}, "customer/email"),
        ({"deliver_on": "next tuesday"}, "deliver_on"),
        ({"deliver_on": "2024-02-30"}, "deliver_on"),
        ({"size": "SMALL"}, "size"),
        ({"mode": "overnight"}, "mode"),
        ({"note": 3}, "note"),
    ],
)
async def test_bad_nested_argument_is_one_line_naming_its_path(change: dict, path: str) -> None:
    with pytest.raises(ToolArgumentsError) as excinfo:
        await place_order.acall({**ORDER, **change})
    message = str(excinfo.value)
    assert message.startswith("invalid arguments for 'place_order': ")
    assert f"{path}: " in message
    assert "\n" not in message


async def test_bad_date_names_the_value_it_got() -> None:
    with pytest.raises(ToolArgumentsError, match=r"deliver_on: .*date.*\(got 'next tuesday'\)"):
        await place_order.acall({**ORDER, "deliver_on": "next tuesday"})


async def test_a_models_own_validator_is_an_arguments_error() -> None:
    @tool
    def book(window: Window) -> int:
        """Book."""
        return (window.end - window.start).days

    assert await book.acall({"window": {"start": "2024-01-01", "end": "2024-01-03"}}) == 2
    with pytest.raises(ToolArgumentsError, match="window: Value error, end is before start"):
        await book.acall({"window": {"start": "2024-01-03", "end": "2024-01-01"}})


async def test_datetime_enum_and_optional_model() -> None:
    @tool
    def remind(at: datetime.datetime, size: Size, item: Item | None = None) -> str:
        """Remind."""
        return repr((at, size, item))

    expected = (datetime.datetime(2024, 5, 1, 9, 30), Size.LARGE, None)
    assert await remind.acall({"at": "2024-05-01T09:30:00", "size": "large"}) == repr(expected)
    item = {"sku": "Z"}
    got = await remind.acall({"at": "2024-05-01T09:30:00", "size": "large", "item": item})
    assert got == repr((*expected[:2], Item(sku="Z")))
    assert await remind.acall({"at": "2024-05-01T09:30:00", "size": "small", "item": None})


async def test_tuple_and_set_parameters_arrive_converted() -> None:
    @tool
    def span(point: tuple[int, int], tags: set[str]) -> str:
        """Span."""
        return repr((point, sorted(tags)))

    assert await span.acall({"point": [1, 2], "tags": ["b", "a"]}) == repr(((1, 2), ["a", "b"]))
    with pytest.raises(ToolArgumentsError, match="tags: .*non-unique"):
        await span.acall({"point": [1, 2], "tags": ["b", "b"]})
    with pytest.raises(ToolArgumentsError, match="point: "):
        await span.acall({"point": [1, 2, 3], "tags": []})


async def test_recursive_model_keeps_its_definition() -> None:
    @tool
    def count(root: Folder) -> int:
        """Count folders."""
        return 1 + sum(count.fn(c) for c in root.children)

    params = count.parameters
    assert set(params["$defs"]) == {"Folder"}
    assert params["properties"]["root"]["properties"]["children"]["items"] == {
        "$ref": "#/$defs/Folder"
    }
    tree = {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}
    assert await count.acall({"root": tree}) == 3
    with pytest.raises(ToolArgumentsError, match="root/children/0/children/0"):
        await count.acall({"root": {"name": "a", "children": [{"name": "b", "children": [{}]}]}})


def test_defaults_that_are_models_dates_or_enums_are_json_in_the_schema() -> None:
    @tool
    def plan(
        first: Item = Item(sku="A"),  # noqa: B008  (an immutable-enough default for a test)
        on: datetime.date = datetime.date(2024, 1, 2),
        size: Size = Size.LARGE,
    ) -> str:
        """Plan."""
        return ""

    props = plan.parameters["properties"]
    assert props["first"]["default"] == {"sku": "A", "quantity": 1, "size": "small"}
    assert props["on"]["default"] == "2024-01-02"
    assert props["size"]["default"] == "large"
    json.dumps(plan.schema)


def test_simple_tools_skip_conversion_and_keep_the_fast_check() -> None:
    @tool
    def search(query: str, k: int = 3, tags: list[str] | None = None) -> str:
        """Search."""
        return ""

    assert search.converters == {}
    assert compile_fast_check(search.parameters) is not None
    assert set(place_order.converters) == {"items", "ship_to", "customer", "deliver_on", "size"}


def test_example_arguments_fill_nested_and_union_parameters() -> None:
    @tool
    def send(item: Item, when: datetime.date | None, size: Size) -> str:
        """Send."""
        return ""

    example = example_arguments(send.parameters)
    assert example == {"item": {}, "when": "x", "size": "small"}
    assert set(example) == set(send.parameters["required"])


@pytest.mark.parametrize(
    ("hint", "fix"),
    [
        (Opaque, "parameter .x. has type .*Opaque.*cannot be described.*pydantic models"),
        (Annotated[int, lambda v: v], None),  # plain metadata is fine
    ],
)
def test_hints_pydantic_cannot_describe(hint: Any, fix: str | None) -> None:
    def fn(x: Any) -> str:
        """Fn."""
        return ""

    fn.__annotations__["x"] = hint
    if fix is None:
        assert tool(fn).parameters["properties"]["x"] == {"type": "integer"}
    else:
        with pytest.raises(ConfigError, match=fix):
            tool(fn)


def test_a_positional_only_parameter_is_refused_naming_the_fix() -> None:
    """A model's arguments arrive by name: every call raised TypeError, blamed on the model."""

    def posonly(a: int, /, b: int = 2) -> str:
        """Add."""
        return str(a + b)

    with pytest.raises(ConfigError, match=r"tool 'posonly': parameter 'a' is positional-only "
                       r"\(before '/'\), .* remove the '/'"):  # fmt: skip
        tool(posonly)


def test_typing_typeddict_before_312_names_the_fix() -> None:
    def fn(x: Plain) -> str:
        """Fn."""
        return ""

    if sys.version_info >= (3, 12):
        assert tool(fn).parameters["properties"]["x"]["required"] == ["a"]
    else:
        with pytest.raises(ConfigError, match="typing_extensions.TypedDict"):
            tool(fn)


def test_tool_message_names_the_bad_field_in_an_episode() -> None:
    env = ToolEnv([place_order], tasks=[{"prompt": "order", "answer": "ok"}])
    env.reset(options={"task": 0})
    bad = {**ORDER, "items": [{"sku": "A1", "quantity": "two"}]}
    call = {"function": {"name": "place_order", "arguments": json.dumps(bad)}}
    messages, _, terminated, _, info = env.step(
        {"role": "assistant", "content": "", "tool_calls": [call]}
    )
    assert messages[-1]["content"].startswith("Error: invalid arguments for 'place_order'")
    assert "items/0/quantity" in messages[-1]["content"]
    assert len(info["tool_errors"]) == 1 and not terminated
    call = {"function": {"name": "place_order", "arguments": json.dumps(ORDER)}}
    messages, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert '"deliver_on": "2024-05-01"' in messages[-1]["content"]
