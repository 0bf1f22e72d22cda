"""Rubric: weighted reward functions that ask for what they need by argument name.

A reward function declares parameters from `Rubric.INJECTABLE` (``task``, ``messages``,
``completion``, ``answer``, ``state``, ``sandbox``, ``env``, ``trajectory``) and gets exactly
those. Every function's score is logged under its name; weight-0 functions are metrics only.
A function that raises is *recorded* (its score is None and the rubric reports the error):
silently scoring 0 would corrupt the training signal. An `InfraError` (a sandbox or backend
failure) propagates instead, so the episode becomes ``infra_error`` and is not scored at all.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._errors import ConfigError, InfraError


@dataclass
class RubricResult:
    """Weighted total, per-function scores, and the errors of functions that raised."""

    reward: float
    scores: dict[str, float | None]
    errors: dict[str, str] = field(default_factory=dict)


class Rubric:
    """A weighted sum of reward functions (sync or async)."""

    INJECTABLE = frozenset(
        {"task", "messages", "completion", "answer", "state", "sandbox", "env", "trajectory"}
    )

    def __init__(
        self, funcs: Sequence[Callable[..., Any]] = (), weights: Sequence[float] | None = None
    ) -> None:
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ConfigError(
                f"Rubric got {len(funcs)} functions but {len(weights)} weights; give one each"
            )
        self.funcs = list(funcs)
        self.weights = weights
        self._params: list[tuple[str, ...]] = []
        for fn in self.funcs:
            params = tuple(inspect.signature(fn).parameters)
            unknown = [p for p in params if p not in self.INJECTABLE]
            if unknown:
                raise ConfigError(
                    f"reward function {fn.__name__!r} asks for {unknown}; "
                    f"it may ask only for {sorted(self.INJECTABLE)}"
                )
            self._params.append(params)

    @property
    def names(self) -> list[str]:
        """Names under which scores are logged."""
        return [fn.__name__ for fn in self.funcs]

    async def score(self, context: Mapping[str, Any]) -> RubricResult:
        """Run every function with the arguments it asked for from ``context``."""
        scores: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        total = 0.0
        for fn, weight, params in zip(self.funcs, self.weights, self._params):
            try:
                value = fn(**{p: context.get(p) for p in params})
                if inspect.isawaitable(value):
                    value = await value
                value = float(value)
            except InfraError:
                raise  # the sandbox/backend failed: the episode is infra_error, not scored
            except Exception:
                scores[fn.__name__] = None
                errors[fn.__name__] = traceback.format_exc()
                continue
            scores[fn.__name__] = value
            total += weight * value
        return RubricResult(reward=total, scores=scores, errors=errors)
