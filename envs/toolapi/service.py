"""The shop service: customers, orders and refunds over HTTP, one SQLite database per tenant.

A small stateful API in the style of tau-bench's retail domain. The service, not the env,
enforces the business rules (no refund after 30 days of delivery, no cancel after shipping,
never refund more than was paid ...): a request that breaks one gets HTTP 409 with the
reason, and is logged as a violation of the tenant it was made for, which the reward reads.

Isolation: every episode gets a tenant of its own, a fresh in-memory database seeded from
`seed_rows`, named by the ``X-Tenant`` header of its requests. Tenants are created, read
and dropped through ``/admin`` routes that need the server's admin token and are left out of
the OpenAPI document, so the model's tools (built from that document) cannot reach them.
"""

from __future__ import annotations

import enum
import functools
import math
import random
import secrets
import socket
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import httpx
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from agentgym import InfraError

#: The shop's "today": fixed, so that the 30-day rule and the tasks never drift.
TODAY = date(2025, 6, 30)
REFUND_DAYS = 30
TENANT_HEADER = "X-Tenant"
ADMIN_HEADER = "X-Admin-Token"

SCHEMA = """
CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, email TEXT UNIQUE,
    street TEXT, city TEXT, zip TEXT);
CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT, price_cents INTEGER, stock INTEGER);
CREATE TABLE orders (id TEXT PRIMARY KEY, customer_id TEXT, status TEXT, placed_on TEXT,
    delivered_on TEXT, ship_street TEXT, ship_city TEXT, ship_zip TEXT, total_cents INTEGER,
    paid_cents INTEGER, refunded_cents INTEGER, cancel_reason TEXT);
CREATE TABLE order_items (order_id TEXT, product_id TEXT, quantity INTEGER,
    unit_price_cents INTEGER, PRIMARY KEY (order_id, product_id));
CREATE TABLE refunds (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT,
    amount_cents INTEGER, reason TEXT);
"""
#: The tables whose rows make the state the reward compares, with their key columns.
KEYS = {
    "customers": ("id",),
    "products": ("id",),
    "orders": ("id",),
    "order_items": ("order_id", "product_id"),
    "refunds": ("id",),
}

_PRODUCTS = [
    ("P01", "Desk lamp", 3499, 40),
    ("P02", "Office chair", 15900, 12),
    ("P03", "Notebook 5-pack", 1299, 200),
    ("P04", "Wireless mouse", 2599, 60),
    ("P05", "USB-C hub", 4999, 35),
    ("P06", "Monitor stand", 3999, 20),
    ("P07", "Mechanical keyboard", 8999, 25),
    ("P08", "Noise-cancelling headphones", 19900, 10),
]
_FIRST = "Ada Bruno Chloe Dmitri Esther Farid Greta Hiro Ines Jonas Keiko Luis Mara Nils Olga Pavel"
_LAST = ["Moreau", "Okafor", "Lindqvist", "Petrov", "Haddad", "Tanaka", "Rossi", "Novak"]
_STREETS = ["Elm Street", "Harbor Road", "Mill Lane", "Oak Avenue", "Quarry Way"]
_CITIES = [
    ("Springfield", "62704"),
    ("Riverton", "82501"),
    ("Lakewood", "80226"),
    ("Fairview", "37062"),
]
#: Each customer's four orders: (status, days before TODAY it was placed, days delivered).
_ORDER_PLAN = (
    ("delivered", 20, 12),
    ("delivered", 70, 60),
    ("open", 2, None),
    ("shipped", 5, None),
)


def seed_rows() -> dict[str, list[dict[str, Any]]]:
    """Every tenant's starting rows, per table: 16 customers, 8 products, 64 orders."""
    rng = random.Random(7)
    rows: dict[str, list[dict[str, Any]]] = {table: [] for table in KEYS}
    prices = {p[0]: p[2] for p in _PRODUCTS}
    for pid, name, price, stock in _PRODUCTS:
        rows["products"].append({"id": pid, "name": name, "price_cents": price, "stock": stock})
    for i, first in enumerate(_FIRST.split()):
        last, (city, zip_code) = _LAST[i % len(_LAST)], _CITIES[i % len(_CITIES)]
        street = f"{10 + 7 * i} {_STREETS[i % len(_STREETS)]}"
        customer = f"C{101 + i}"
        rows["customers"].append(
            {
                "id": customer,
                "name": f"{first} {last}",
                "email": f"{first}.{last}@example.com".lower(),
                "street": street,
                "city": city,
                "zip": zip_code,
            }
        )
        for k, (status, placed, delivered) in enumerate(_ORDER_PLAN):
            order = f"O{1000 + 4 * i + k}"
            items = sorted(rng.sample(sorted(prices), rng.randint(1, 3)))
            total = 0
            for pid in items:
                quantity = rng.randint(1, 3)
                total += quantity * prices[pid]
                rows["order_items"].append(
                    {
                        "order_id": order,
                        "product_id": pid,
                        "quantity": quantity,
                        "unit_price_cents": prices[pid],
                    }
                )
            status = ("pending" if i % 2 == 0 else "processing") if status == "open" else status
            rows["orders"].append(
                {
                    "id": order,
                    "customer_id": customer,
                    "status": status,
                    "placed_on": str(TODAY - timedelta(days=placed)),
                    "delivered_on": None
                    if delivered is None
                    else str(TODAY - timedelta(delivered)),
                    "ship_street": street,
                    "ship_city": city,
                    "ship_zip": zip_code,
                    "total_cents": total,
                    "paid_cents": 0 if status == "pending" else total,
                    "refunded_cents": 0,
                    "cancel_reason": None,
                }
            )
    return rows


def new_database() -> sqlite3.Connection:
    """A fresh in-memory database holding `seed_rows`."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.executescript(SCHEMA)
    for table, rows in seed_rows().items():
        for row in rows:
            names = ", ".join(row)
            marks = ", ".join("?" * len(row))
            db.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))
    db.commit()
    return db


def dump_state(db: sqlite3.Connection) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row of the state tables, keyed by table, then by key (``"O1001/P03"``)."""
    return {
        table: {
            "/".join(str(row[k]) for k in keys): dict(row)
            for row in db.execute(f"SELECT * FROM {table}")
        }
        for table, keys in KEYS.items()
    }


@dataclass
class Tenant:
    """One episode's world: its database, a lock around it, and its rule violations."""

    db: sqlite3.Connection = field(default_factory=new_database)
    lock: threading.Lock = field(default_factory=threading.Lock)
    violations: list[dict[str, str]] = field(default_factory=list)

    def refuse(self, operation: str, reason: str) -> HTTPException:
        """Log a broken business rule and return the 409 to raise."""
        self.violations.append({"operation": operation, "reason": reason})
        return HTTPException(409, reason)

    def one(self, sql: str, *args: Any, what: str) -> sqlite3.Row:
        row = self.db.execute(sql, args).fetchone()
        if row is None:
            raise HTTPException(404, f"no {what}")
        return row


class Address(BaseModel):
    """A postal address."""

    street: str = Field(min_length=1, max_length=100)
    city: str = Field(min_length=1, max_length=60)
    zip: str = Field(pattern=r"^\d{5}$", description="five digits")


class RefundReason(enum.StrEnum):
    """Why the customer wants money back."""

    damaged = "damaged"
    not_as_described = "not_as_described"
    late = "late"
    changed_mind = "changed_mind"


class RefundRequest(BaseModel):
    amount_cents: int = Field(gt=0, description="amount to refund, in cents")
    reason: RefundReason


class CancelReason(enum.StrEnum):
    ordered_by_mistake = "ordered_by_mistake"
    no_longer_needed = "no_longer_needed"


class CancelRequest(BaseModel):
    reason: CancelReason


class QuantityChange(BaseModel):
    quantity: int = Field(ge=1, le=10, description="the new quantity of this item")


def create_app(admin_token: str) -> FastAPI:
    """The shop as an ASGI app; ``admin_token`` guards the hidden ``/admin`` routes."""
    app = FastAPI(title="Shop", version="1.0")
    app.add_exception_handler(RequestValidationError, _invalid_request)
    tenants: dict[str, Tenant] = {}

    @contextmanager
    def locked(request: Request) -> Iterator[Tenant]:
        tenant = tenants.get(request.headers.get(TENANT_HEADER, ""))
        if tenant is None:  # the env's business, never the model's: a server-side failure
            raise HTTPException(503, f"unknown or missing {TENANT_HEADER} header")
        with tenant.lock, tenant.db:  # one request at a time; commit, or roll back on error
            yield tenant

    def admin(request: Request) -> None:
        if not secrets.compare_digest(request.headers.get(ADMIN_HEADER, ""), admin_token):
            raise HTTPException(403, "admin token required")

    @app.post("/admin/tenants", include_in_schema=False, dependencies=[Depends(admin)])
    def create_tenant() -> dict[str, str]:
        name = secrets.token_hex(8)
        tenants[name] = Tenant()
        return {"tenant": name}

    @app.delete("/admin/tenants/{name}", include_in_schema=False, dependencies=[Depends(admin)])
    def drop_tenant(name: str) -> dict[str, bool]:
        tenant = tenants.pop(name, None)
        if tenant is not None:
            with tenant.lock:  # after the request that may still be running on it
                tenant.db.close()
        return {"dropped": tenant is not None}

    @app.get("/admin/tenants/{name}", include_in_schema=False, dependencies=[Depends(admin)])
    def read_tenant(name: str) -> dict[str, Any]:
        tenant = tenants.get(name)
        if tenant is None:
            raise HTTPException(404, f"no tenant {name!r}")
        with tenant.lock:
            return {"state": dump_state(tenant.db), "violations": list(tenant.violations)}

    _add_routes(app, locked)
    return app


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    r"""FastAPI's 422 for a request that fails validation, its echoed inputs made JSON-safe.

    Why: the 422 names each invalid input, and FastAPI's own handler fails on one that JSON
    cannot carry (a number Python's JSON reads as infinity or NaN: ``1e309``, ``NaN``; a string
    holding a lone surrogate: ``"\ud800"``), answering HTTP 500. A 5xx is the service failing,
    so a request's own mistake could end an episode as ``infra_error`` instead of a tool error.
    """
    errors = exc.errors() if isinstance(exc, RequestValidationError) else [str(exc)]
    return JSONResponse({"detail": _json_safe(jsonable_encoder(errors))}, status_code=422)


def _json_safe(value: Any) -> Any:
    """``value`` (JSON-like) with non-finite floats as their repr and lone surrogates escaped."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _add_routes(app: FastAPI, locked: Any) -> None:
    """The public operations: what the model's tools are made from, in this order."""
    for add in (_customer_routes, _order_routes, _refund_routes, _order_change_routes,
                _product_routes):  # fmt: skip
        add(app, locked)


def _customer_routes(app: FastAPI, locked: Any) -> None:
    """Find and read customers, change their address, list their orders."""

    @app.get("/customers", operation_id="find_customer")
    def find_customer(email: str, request: Request) -> dict[str, Any]:
        """Find a customer by email address."""
        with locked(request) as t:
            return dict(
                t.one(
                    "SELECT * FROM customers WHERE lower(email) = lower(?)",
                    email,
                    what=f"customer with email {email!r}",
                )
            )

    @app.get("/customers/{customer_id}", operation_id="get_customer")
    def get_customer(customer_id: str, request: Request) -> dict[str, Any]:
        """Get a customer's profile and address."""
        with locked(request) as t:
            sql = "SELECT * FROM customers WHERE id = ?"
            return dict(t.one(sql, customer_id, what=f"customer {customer_id!r}"))

    @app.put("/customers/{customer_id}/address", operation_id="update_customer_address")
    def update_customer_address(customer_id: str, address: Address, request: Request) -> dict:
        """Change the address on file (orders already placed keep theirs)."""
        with locked(request) as t:
            t.one(
                "SELECT id FROM customers WHERE id = ?",
                customer_id,
                what=f"customer {customer_id!r}",
            )
            t.db.execute(
                "UPDATE customers SET street = ?, city = ?, zip = ? WHERE id = ?",
                (address.street, address.city, address.zip, customer_id),
            )
            return dict(t.one("SELECT * FROM customers WHERE id = ?", customer_id, what=""))

    @app.get("/customers/{customer_id}/orders", operation_id="list_orders")
    def list_orders(customer_id: str, request: Request, status: str | None = None) -> list[dict]:
        """List a customer's orders (without items), optionally only those with a status."""
        with locked(request) as t:
            rows = t.db.execute(
                "SELECT * FROM orders WHERE customer_id = ? AND "
                "(? IS NULL OR status = ?) ORDER BY placed_on",
                (customer_id, status, status),
            )
            return [dict(r) for r in rows]


def _order_routes(app: FastAPI, locked: Any) -> None:
    """Read an order; cancel one that has not shipped."""

    @app.get("/orders/{order_id}", operation_id="get_order")
    def get_order(order_id: str, request: Request) -> dict[str, Any]:
        """Get an order with its items."""
        with locked(request) as t:
            return _order(t, order_id)

    @app.post("/orders/{order_id}/cancel", operation_id="cancel_order")
    def cancel_order(order_id: str, body: CancelRequest, request: Request) -> dict[str, Any]:
        """Cancel an order that has not shipped yet; its items go back to stock."""
        with locked(request) as t:
            order = _order(t, order_id)
            if order["status"] not in ("pending", "processing"):
                raise t.refuse(
                    "cancel_order",
                    f"order {order_id} is {order['status']}; only "
                    "pending or processing orders can be cancelled",
                )
            for item in order["items"]:
                t.db.execute(
                    "UPDATE products SET stock = stock + ? WHERE id = ?",
                    (item["quantity"], item["product_id"]),
                )
            t.db.execute(
                "UPDATE orders SET status = 'cancelled', cancel_reason = ? WHERE id = ?",
                (body.reason.value, order_id),
            )
            return _order(t, order_id)


def _refund_routes(app: FastAPI, locked: Any) -> None:
    """Refund a delivered order within the refund window; list its refunds."""

    @app.post("/orders/{order_id}/refunds", operation_id="refund_order")
    def refund_order(order_id: str, body: RefundRequest, request: Request) -> dict[str, Any]:
        """Refund part or all of a delivered order, within 30 days of delivery."""
        with locked(request) as t:
            order = _order(t, order_id)
            if order["status"] != "delivered":
                raise t.refuse(
                    "refund_order",
                    f"order {order_id} is {order['status']}; only delivered orders can be refunded",
                )
            age = (TODAY - date.fromisoformat(order["delivered_on"])).days
            if age > REFUND_DAYS:
                raise t.refuse(
                    "refund_order",
                    f"order {order_id} was delivered {age} days ago; "
                    f"refunds close after {REFUND_DAYS} days",
                )
            left = order["paid_cents"] - order["refunded_cents"]
            if body.amount_cents > left:
                raise t.refuse(
                    "refund_order",
                    f"refund of {body.amount_cents} cents exceeds the "
                    f"{left} cents paid and not yet refunded",
                )
            t.db.execute(
                "INSERT INTO refunds (order_id, amount_cents, reason) VALUES (?, ?, ?)",
                (order_id, body.amount_cents, body.reason.value),
            )
            t.db.execute(
                "UPDATE orders SET refunded_cents = refunded_cents + ? WHERE id = ?",
                (body.amount_cents, order_id),
            )
            return _order(t, order_id)

    @app.get("/orders/{order_id}/refunds", operation_id="list_refunds")
    def list_refunds(order_id: str, request: Request) -> list[dict[str, Any]]:
        """List the refunds already made on an order."""
        with locked(request) as t:
            _order(t, order_id)
            rows = t.db.execute("SELECT * FROM refunds WHERE order_id = ?", (order_id,))
            return [dict(r) for r in rows]


def _order_change_routes(app: FastAPI, locked: Any) -> None:
    """Change a pending order's quantities or an unshipped order's address."""

    @app.patch("/orders/{order_id}/items/{product_id}", operation_id="change_item_quantity")
    def change_item_quantity(
        order_id: str, product_id: str, body: QuantityChange, request: Request
    ) -> dict[str, Any]:
        """Change how many of a product a pending order holds (stock permitting)."""
        with locked(request) as t:
            order = _order(t, order_id)
            item = next((i for i in order["items"] if i["product_id"] == product_id), None)
            if item is None:
                raise HTTPException(404, f"order {order_id} has no item {product_id!r}")
            if order["status"] != "pending":
                raise t.refuse(
                    "change_item_quantity",
                    f"order {order_id} is {order['status']}; only pending orders can change",
                )
            delta = body.quantity - item["quantity"]
            stock = t.one("SELECT stock FROM products WHERE id = ?", product_id, what="")[0]
            if delta > stock:
                raise t.refuse(
                    "change_item_quantity", f"only {stock} more of {product_id} in stock"
                )
            t.db.execute("UPDATE products SET stock = stock - ? WHERE id = ?", (delta, product_id))
            t.db.execute(
                "UPDATE order_items SET quantity = ? WHERE order_id = ? AND product_id = ?",
                (body.quantity, order_id, product_id),
            )
            t.db.execute(
                "UPDATE orders SET total_cents = total_cents + ? WHERE id = ?",
                (delta * item["unit_price_cents"], order_id),
            )
            return _order(t, order_id)

    @app.put("/orders/{order_id}/shipping-address", operation_id="update_shipping_address")
    def update_shipping_address(order_id: str, address: Address, request: Request) -> dict:
        """Change where an order that has not shipped yet will be delivered."""
        with locked(request) as t:
            order = _order(t, order_id)
            if order["status"] not in ("pending", "processing"):
                raise t.refuse(
                    "update_shipping_address",
                    f"order {order_id} is {order['status']}; its address can no longer change",
                )
            t.db.execute(
                "UPDATE orders SET ship_street = ?, ship_city = ?, ship_zip = ? WHERE id = ?",
                (address.street, address.city, address.zip, order_id),
            )
            return _order(t, order_id)


def _product_routes(app: FastAPI, locked: Any) -> None:
    """List products; read one."""

    @app.get("/products", operation_id="list_products")
    def list_products(request: Request) -> list[dict[str, Any]]:
        """List every product with its price and stock."""
        with locked(request) as t:
            return [dict(r) for r in t.db.execute("SELECT * FROM products ORDER BY id")]

    @app.get("/products/{product_id}", operation_id="get_product")
    def get_product(product_id: str, request: Request) -> dict[str, Any]:
        """Get one product's price and stock."""
        with locked(request) as t:
            sql = "SELECT * FROM products WHERE id = ?"
            return dict(t.one(sql, product_id, what=f"product {product_id!r}"))


def _order(t: Tenant, order_id: str) -> dict[str, Any]:
    order = dict(t.one("SELECT * FROM orders WHERE id = ?", order_id, what=f"order {order_id!r}"))
    items = t.db.execute(
        "SELECT product_id, quantity, unit_price_cents FROM order_items "
        "WHERE order_id = ? ORDER BY product_id",
        (order_id,),
    )
    return {**order, "items": [dict(i) for i in items]}


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, saying when it has started (or given up) through an event."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.ready.set()


class ShopServer:
    """The shop on 127.0.0.1 at a free port, served by uvicorn in a daemon thread.

    ``users`` counts the envs sharing it (`acquire`/`release`); the last one stops it.
    """

    def __init__(self, start_timeout: float = 30.0) -> None:
        self.admin_token = secrets.token_hex(16)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # bound here: no race for the port with other processes
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(self.admin_token),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = _Uvicorn(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="agentgym-toolapi-shop",
            daemon=True,
        )
        self.users = 0
        self._thread.start()
        if not self._server.ready.wait(start_timeout) or not self._server.started:
            self.stop()
            raise InfraError(f"the shop service did not start within {start_timeout:g} s")

    @functools.cached_property
    def openapi(self) -> dict[str, Any]:
        """The OpenAPI document the running service serves at ``/openapi.json``."""
        try:
            response = httpx.get(self.base_url + "/openapi.json", timeout=10.0)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise InfraError(f"cannot read the shop's OpenAPI document: {exc}") from exc
        doc: dict[str, Any] = response.json()
        return doc

    @property
    def alive(self) -> bool:
        """Whether it still serves (it may have been stopped, or its thread died)."""
        return self._thread.is_alive() and not self._server.should_exit

    def stop(self) -> None:
        """Stop serving and wait for the thread to end (open connections are closed)."""
        self._server.should_exit = True
        self._thread.join(timeout=10)


_shared: ShopServer | None = None
_shared_lock = threading.Lock()


def acquire() -> ShopServer:
    """The process's shop server, started on first use (or again after it died)."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.alive:
            _shared = ShopServer()
        _shared.users += 1
        return _shared


def release(server: ShopServer) -> None:
    """One env is done with ``server``; the last one stops it."""
    if give_back(server):
        server.stop()


def give_back(server: ShopServer) -> bool:
    """One env is done with ``server``: True for the last one, which must stop it.

    Why apart from `release`: stopping waits for the shop's thread, so an env on an event loop
    stops it in a thread, and only the last env need go there.
    """
    global _shared
    with _shared_lock:
        server.users -= 1
        if server.users > 0:
            return False
        if _shared is server:
            _shared = None
    return True
