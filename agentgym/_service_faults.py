"""Who a failed request to a tool service is blamed on: the statuses, waits and probe budget.

Shared by the two clients whose requests the model shapes (`agentgym._openapi` tools and the
search env's `HTTPBackend`), so both blame the same way. A failure a model can cause (a 5xx on
its input, a hang) is the model's while the service still answers a plain probe request, since
an ``infra_error`` episode is dropped, not scored; an overloaded service is asked again before
its failure counts as infrastructure.
"""

from __future__ import annotations

BUSY = frozenset({429, 503})
"""Statuses that say the service is overloaded or down, whoever asked: asked again after
`BUSY_WAITS`, then infrastructure, never the model's, however a probe fares (a replica behind
a balancer may answer the probe while this one is full)."""

BUSY_WAITS = (0.5, 1.0, 2.0)
"""Seconds before each new try of a request answered `BUSY`: an overload is often momentary,
and a model whose calls fill a rate limit for a moment must not get its episode dropped."""


def ask_again(status: int, safe: bool) -> bool:
    """Whether a request answered ``status`` is sent again after a `BUSY_WAITS` wait.

    A 429 was not served, so any request is; a 503 may come after the work was done, so only
    a safe one (GET, HEAD ...), which does no harm twice.
    """
    return status == 429 or (status == 503 and safe)


PROBE_TIMEOUT = 5.0
"""Seconds a probe may take; a service slower than that on a plain request is down."""

PROBE_TRIES = 2
"""Probes asked before the service counts as down: a service often closes the connection a
failed request came on (uvicorn does after an unhandled error), and the first probe may be
sent on it as it closes."""
