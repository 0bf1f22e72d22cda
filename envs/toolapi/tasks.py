"""The shop's tasks: a customer's request, the calls that fulfil it, and the state it leaves.

Each task is derived from the seed data (`service.seed_rows`), so the list is the same on
every run. ``expected`` holds exactly the rows the request must change, as they must end up
(``{table: {key: row}}``); the reward compares it with what really changed in the episode's
database. ``calls`` is the oracle's script of tool calls (reads first, as a person would).
Customers C101-C112 make the train split, C113-C116 the eval split: eval customers, their
orders and their new addresses are never seen in training.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Literal

from agentgym import ConfigError

from .service import KEYS, seed_rows

Split = Literal["train", "eval"]
State = dict[str, dict[str, dict[str, Any]]]
EVAL_CUSTOMERS = 4


@functools.cache
def seed_state() -> State:
    """The starting rows of every tenant, keyed like `service.dump_state`."""
    rows = seed_rows()
    return {
        table: {"/".join(str(r[k]) for k in keys): r for r in rows[table]}
        for table, keys in KEYS.items()
    }


def changes(before: State, after: State) -> dict[str, dict[str, dict[str, Any] | None]]:
    """The rows of ``after`` that are new or differ from ``before``; a removed row is None."""
    diff: dict[str, dict[str, dict[str, Any] | None]] = {}
    for table in KEYS:
        old, new = before.get(table, {}), after.get(table, {})
        rows: dict[str, dict[str, Any] | None] = {k: v for k, v in new.items() if old.get(k) != v}
        rows |= {k: None for k in old if k not in new}
        if rows:
            diff[table] = rows
    return diff


class _Task:
    """Builds one task: its calls and the rows they change, starting from the seed."""

    def __init__(self, kind: str, customer: dict[str, Any], order: dict[str, Any]) -> None:
        self.id = f"{kind}-{order['id'] if kind != 'address' else customer['id']}"
        self.customer, self.order = customer, order
        self.calls: list[tuple[str, dict[str, Any]]] = [
            ("find_customer", {"email": customer["email"]}),
            ("list_orders", {"customer_id": customer["id"]}),
        ]
        self.expected: State = {}

    def change(self, table: str, key: str, **values: Any) -> None:
        rows = self.expected.setdefault(table, {})
        row = rows.get(key) or copy.deepcopy(seed_state()[table].get(key, {}))
        rows[key] = {**row, **values}

    def done(self, prompt: str) -> dict[str, Any]:
        name, email = self.customer["name"], self.customer["email"]
        return {
            "id": self.id,
            "prompt": f"Hi, this is {name} ({email}). {prompt}",
            "calls": [[tool, args] for tool, args in self.calls],
            "expected": self.expected,
        }


def _items(order_id: str) -> list[dict[str, Any]]:
    return [r for r in seed_rows()["order_items"] if r["order_id"] == order_id]


def _refund(i: int, customer: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    task = _Task("refund", customer, order)
    if i % 2 == 0:
        amount, reason = order["paid_cents"], "damaged"
        prompt = (
            f"My order placed on {order['placed_on']} arrived damaged. Please refund it in full."
        )
    else:
        item = _items(order["id"])[0]
        product = seed_state()["products"][item["product_id"]]["name"]
        amount, reason = item["quantity"] * item["unit_price_cents"], "not_as_described"
        prompt = (
            f"In my order placed on {order['placed_on']}, the {product} is not as described. "
            f"Please refund just that item (all {item['quantity']} of them)."
        )
        task.calls.append(("get_order", {"order_id": order["id"]}))
    args = {"order_id": order["id"], "amount_cents": amount, "reason": reason}
    task.calls.append(("refund_order", args))
    task.change("orders", order["id"], refunded_cents=amount)
    task.change("refunds", "1", id=1, order_id=order["id"], amount_cents=amount, reason=reason)
    return task.done(prompt)


def _open_order(i: int, customer: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    """Cancel it, change a quantity (pending) or send it elsewhere (processing)."""
    placed, items = order["placed_on"], _items(order["id"])
    if i % 4 in (0, 1):
        task = _Task("cancel", customer, order)
        task.calls.append(("cancel_order", {"order_id": order["id"], "reason": "no_longer_needed"}))
        task.change("orders", order["id"], status="cancelled", cancel_reason="no_longer_needed")
        for item in items:
            stock = seed_state()["products"][item["product_id"]]["stock"]
            task.change("products", item["product_id"], stock=stock + item["quantity"])
        return task.done(f"Please cancel my order from {placed}; I no longer need it.")
    if i % 4 == 2:
        task, item = _Task("quantity", customer, order), items[0]
        pid, quantity = item["product_id"], item["quantity"] + 1
        task.calls.append(("get_order", {"order_id": order["id"]}))
        task.calls.append(
            (
                "change_item_quantity",
                {"order_id": order["id"], "product_id": pid, "quantity": quantity},
            )
        )
        task.change("order_items", f"{order['id']}/{pid}", quantity=quantity)
        task.change(
            "orders", order["id"], total_cents=order["total_cents"] + item["unit_price_cents"]
        )
        task.change("products", pid, stock=seed_state()["products"][pid]["stock"] - 1)
        name = seed_state()["products"][pid]["name"]
        return task.done(
            f"In my order from {placed}, I would like {quantity} of the {name} "
            f"instead of {item['quantity']}."
        )
    task, address = _Task("reship", customer, order), _new_address(i)
    _reship(task, order, address)
    return task.done(
        f"Please send my order from {placed} to {_text(address)} instead. Keep "
        "the address on file as it is."
    )


def _address(i: int, customer: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    """Update the address on file; every third customer also reships the open order."""
    task, address = _Task("address", customer, order), _new_address(i)
    task.calls = task.calls[:1] + [
        ("update_customer_address", {"customer_id": customer["id"], **address})
    ]
    task.change("customers", customer["id"], **address)
    prompt = f"I moved to {_text(address)}. Please update my address on file."
    if i % 3 == 0:
        task.calls.append(
            ("list_orders", {"customer_id": customer["id"], "status": order["status"]})
        )
        _reship(task, order, address)
        prompt += f" My order from {order['placed_on']} has not shipped yet: send it there too."
    return task.done(prompt)


def _reship(task: _Task, order: dict[str, Any], address: dict[str, str]) -> None:
    task.calls.append(("update_shipping_address", {"order_id": order["id"], **address}))
    task.change(
        "orders",
        order["id"],
        ship_street=address["street"],
        ship_city=address["city"],
        ship_zip=address["zip"],
    )


def _new_address(i: int) -> dict[str, str]:
    return {"street": f"{200 + 3 * i} Birch Road", "city": "Northfield", "zip": str(55057 + i)}


def _text(address: dict[str, str]) -> str:
    return f"{address['street']}, {address['city']} {address['zip']}"


@functools.cache
def _all_tasks() -> tuple[tuple[dict[str, Any], ...], ...]:
    rows = seed_rows()
    per_customer = []
    for i, customer in enumerate(rows["customers"]):
        orders = [o for o in rows["orders"] if o["customer_id"] == customer["id"]]
        delivered_recently, open_order = orders[0], orders[2]
        per_customer.append(
            (
                _refund(i, customer, delivered_recently),
                _open_order(i, customer, open_order),
                _address(i, customer, open_order),
            )
        )
    return tuple(per_customer)


def make_tasks(split: Split) -> list[dict[str, Any]]:
    """The tasks of ``split``: 36 for ``train``, 12 for ``eval``; fresh copies each call."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}")
    groups = _all_tasks()
    chosen = groups[:-EVAL_CUSTOMERS] if split == "train" else groups[-EVAL_CUSTOMERS:]
    return [copy.deepcopy(task) for group in chosen for task in group]
