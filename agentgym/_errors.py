"""The exception tree, grouped by where a failure happened.

::

    Error                       base of everything agentgym raises on purpose
    ├── ConfigError             bad user input: unknown env id, bad option, bad knob value
    │   └── UnknownEnvError     `make` got an id nobody registered
    ├── ToolError               a tool call failed; goes back to the model as a tool message
    │   ├── ToolArgumentsError  arguments did not match the tool's JSON schema
    │   ├── ToolTimeoutError    the tool ran past its per-call timeout
    │   └── Forfeit             the call destroyed what the episode is scored on: it ends, 0
    ├── ConversationError       the model's turns made the conversation unservable: truncated
    │   └── ContextLengthError  the conversation outgrew the model's context
    └── InfraError              the machinery failed, not the model: the episode is infra_error
        ├── ModelError          the policy/backend failed (HTTP error, server down)
        └── SandboxError        the execution backend failed (daemon, container)

Why the grouping matters: tool errors (and malformed tool calls, which parsers record in
`ParsedTurn.errors` rather than raise) are *data* (the model made a mistake, the
episode goes on), `ModelError`/`SandboxError` are *infrastructure* (the episode is marked
``infra_error`` and must never count as a reward of 0), and `ConfigError` is the user's to fix
before anything runs.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error agentgym raises on purpose."""


class ConfigError(Error, ValueError):
    """Bad user input; the message says what was wrong, the value received, and the fix."""


class UnknownEnvError(ConfigError, KeyError):
    """`agentgym.make` was given an id that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class ToolError(Error):
    """A tool call failed; the episode goes on and the model sees this message."""


class ToolArgumentsError(ToolError):
    """The arguments did not validate against the tool's JSON schema."""


class ToolTimeoutError(ToolError):
    """The tool ran longer than its per-call timeout."""


class Forfeit(ToolError):
    """The model's call destroyed what its episode is scored on: the episode ends, reward 0.

    Why not a plain `ToolError`: after such a call (one that crashed the server holding the
    episode's world, whose restart starts that world over) the rubric would score a world
    the model did not leave, and a model could undo its mistakes by breaking the server. Why
    not an `InfraError`: that episode would be dropped, not scored, and a model could escape
    a low reward the same way. So the model reads the message, and the episode ends after
    the turn with final reward 0, every rubric score 0 and the rubric not run (`ToolEnv`);
    step rewards already given stay.
    """


class ConversationError(Error):
    """The conversation cannot go on: what the model wrote made it unservable.

    It outgrew the context (`ContextLengthError`), or the chat template or the server refused
    a conversation it had accepted until the model's last turn (Llama 3's template refuses two
    tool calls in one turn). Not an infrastructure failure, which would drop the episode
    instead of scoring it: the rollout ends it as ``truncated`` and scores it, as if it had
    hit ``max_turns`` (``Trajectory.info["truncated_by"]`` says why).
    """


class ContextLengthError(ConversationError):
    """The conversation no longer fits the model's context window."""


class InfraError(Error):
    """A failure of the machinery, not of the model: the episode becomes ``infra_error``."""


class ModelError(InfraError):
    """The policy backend failed (HTTP error, timeout, malformed response)."""


class SandboxError(InfraError):
    """The execution backend failed (daemon unreachable, container died)."""
