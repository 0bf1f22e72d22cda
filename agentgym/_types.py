"""Types that both sides of an episode share: the env reads them, the policy produces them.

They live apart from `_env` and `_policies` so that neither layer imports the other: an env
(and a process that only steps envs) never loads the policies' HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import ConfigError

#: One OpenAI-format chat message (``role``, ``content``, maybe ``tool_calls`` ...).
Message = dict[str, Any]


@dataclass
class Completion:
    """One assistant turn as the policy produced it.

    ``text`` is the raw text (tool calls unparsed) and is what the env parses; ``message`` is
    set only when the backend already parsed tool calls into an OpenAI message. Token fields
    are None when the backend does not report them. ``completion_tokens`` is how many tokens
    the server says it sampled (an OpenAI ``usage.completion_tokens``), kept where it returned
    no ids: a count to report what an eval cost, never ids to train on. ``adapter_version`` is
    the LoRA adapter version that sampled the turn (0 = base weights) when the backend serves
    adapters.
    """

    text: str
    message: Message | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    adapter_version: int | None = None
    completion_tokens: int | None = None

    def __post_init__(self) -> None:
        """Refuse logprobs that do not pair with the sampled ids, one for one.

        Why: a policy of the user's returned 4 ids and 2 logprobs; the episode ended ``ok`` and
        the trainer's importance ratios read NaN and another token's logprob, with nothing said.
        """
        ids, logprobs = self.completion_ids, self.logprobs
        if ids is not None and logprobs is not None and len(ids) != len(logprobs):
            raise ConfigError(
                f"Completion has {len(ids)} completion_ids and {len(logprobs)} logprobs: give "
                "one logprob per sampled id (the sampling distribution's), or logprobs=None"
            )

    @property
    def sampled_tokens(self) -> int | None:
        """How many tokens the turn sampled (`sampled_tokens`)."""
        return sampled_tokens(self.completion_ids, self.completion_tokens)


def sampled_tokens(ids: list[int] | None, count: int | None) -> int | None:
    """Sampled tokens: the ids when there are some (exact), else the server's count, else None.

    Why one function: the episode's token budget, ``summary.json`` and the dashboard each
    counted ids alone or differently, so a server that returns only a count spent no budget.
    """
    return len(ids) if ids is not None else count
