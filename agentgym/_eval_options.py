"""Which ``agentgym eval`` options belong to which ``--policy``; the others are refused.

Why: an option ignored under another policy reads as applied (``--model-path DIR`` without
``--policy`` evaluated the env's reference answers and filed them as the model's). A queued
eval job is checked by the same function (`check_policy_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ._errors import ConfigError


class PolicyKind(StrEnum):
    """Where assistant turns come from in `agentgym eval`."""

    reference = "reference"
    openai = "openai"
    vllm = "vllm"
    hf = "hf"

    @property
    def local(self) -> bool:
        """Samples from a local model folder (``--model-path``), token in / token out."""
        return self in (PolicyKind.vllm, PolicyKind.hf)


class RolloutModeChoice(StrEnum):
    """How `eval --policy vllm` builds prompts (see `agentgym.engine.ChatRenderer`)."""

    auto = "auto"  # concat where the chat template allows it, else per_turn
    concat = "concat"  # refuse a template that rewrites history
    per_turn = "per_turn"  # a fresh render every turn


@dataclass(frozen=True)
class Servers:
    """``--server`` URLs (empty: the in-process engine), ``--router-url``, the served name."""

    urls: list[str]
    router_url: str | None
    served_name: str | None


_LOCAL = (PolicyKind.vllm, PolicyKind.hf)
_SAMPLED = (PolicyKind.openai, *_LOCAL)
#: `eval` options only some policies read -> those policies; the rest apply to every one.
#: (``--adapter`` is `trained_adapter_and_base`'s: it is refused on servers too.)
_POLICY_OPTIONS: dict[str, tuple[PolicyKind, ...]] = {
    "model_path": _LOCAL, "chat_template_kwargs": _LOCAL, "rollout_mode": _LOCAL,
    "max_model_len": _LOCAL, "server": (PolicyKind.vllm,), "router_url": (PolicyKind.vllm,),
    "base_url": (PolicyKind.openai,), "api_key": (PolicyKind.openai,),
    "max_retries": (PolicyKind.openai,), "retry_backoff": (PolicyKind.openai,),
    "model": (PolicyKind.openai, PolicyKind.vllm),  # vllm: the name served by --server
    "temperature": _SAMPLED, "max_tokens": _SAMPLED,
}  # fmt: skip


def typed_options(ctx: Any) -> dict[str, str]:
    """The options typed on the command line, name -> flag.

    Not those left at their default (``--temperature`` 1.0) nor read from the environment
    (``OPENAI_API_KEY`` set for other tools): only a typed option asks for something.
    """
    return {
        param.name: param.opts[0]
        for param in ctx.command.params
        if param.name
        and getattr(ctx.get_parameter_source(param.name), "name", None) == "COMMANDLINE"
    }


def check_policy_options(ctx: Any) -> None:
    """`_refuse_option_mix` for a parsed ``eval`` command line (a queued job's, too).

    ``ctx``: the command's click context (typer's, or one `make_context` built).
    """
    p = ctx.params
    servers = Servers(p["server"], p["router_url"], p["model"])
    _refuse_option_mix(PolicyKind(p["policy"]), typed_options(ctx), servers)


def _refuse_option_mix(policy: PolicyKind, typed: dict[str, str], servers: Servers) -> None:
    """Options that belong to another ``--policy``, refused before anything loads.

    Ignored, they would read as applied: ``--model-path DIR`` without ``--policy`` evaluated
    the env's reference answers and filed them as the model's.
    """
    for name, flag in typed.items():
        owners = [p.value for p in _POLICY_OPTIONS.get(name, tuple(PolicyKind))]
        if policy.value not in owners:
            others = f" (or {', '.join(owners[1:])})" if owners[1:] else ""
            raise ConfigError(
                f"{flag} applies to --policy {_either(owners)}, not {policy.value}; "
                f"pass --policy {owners[0]}{others}, or drop {flag}"
            )
    if policy is PolicyKind.openai and not servers.served_name:
        raise ConfigError("--policy openai needs --model NAME (the served model name)")
    if servers.router_url and not servers.urls:
        raise ConfigError("--router-url needs the --server URLs too (adapters and checks)")
    if policy is PolicyKind.vllm and "model" in typed and not servers.urls:
        raise ConfigError(  # the in-process engine serves --model-path under no other name
            f"{typed['model']} names the model a --server serves; the in-process engine "
            "runs --model-path: drop it, or add --server URL"
        )


def _either(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: the choices a message offers."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))
