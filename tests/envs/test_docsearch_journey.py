"""A new user's journey through the DocSearch env: tool inputs a model sends, and scoring.

The first two tests pin defects the journey found (a ``k`` the schema accepts that the tool
could not use; an error that echoed a huge name back whole); the last pins what the docs now
say about the final turn's text.
"""

from __future__ import annotations

import json

import agentgym


def raw_call(name: str, arguments_json: str) -> str:
    """A hermes tool call with its arguments spelled exactly as given."""
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments_json}}}</tool_call>'


def tool_reply(env: agentgym.Env, turn: str) -> str:
    """The tool message one turn got back."""
    new_messages, _, terminated, _, _ = env.step(turn)
    assert not terminated
    return new_messages[-1]["content"]


def test_a_whole_float_k_returns_that_many_hits():
    # Before: JSON Schema passed 3.0 as an integer, then slicing with it raised TypeError.
    env = agentgym.make("docsearch", num_tasks=1)
    env.reset(options={"task": 0})
    reply = tool_reply(env, raw_call("search", '{"query": "arc tangent radians", "k": 3.0}'))
    assert reply.splitlines()[0].startswith("math.atan: "), reply
    assert len(reply.splitlines()) == 3
    refused = tool_reply(env, raw_call("search", '{"query": "arc tangent", "k": 3.5}'))
    assert refused.startswith("Error: invalid arguments for 'search'"), refused


def test_an_unknown_huge_name_is_quoted_cut_in_reads_error():
    # Before: the whole 100,000-character name came back in the error message.
    env = agentgym.make("docsearch", num_tasks=1)
    env.reset(options={"task": 0})
    huge = "x" * 100_000
    reply = tool_reply(env, raw_call("read", json.dumps({"name": huge})))
    assert reply.startswith("Error: 'read' raised ValueError: no document named 'xxx"), reply
    assert "use a name that search returned" in reply
    assert len(reply) < 300
    short = tool_reply(env, raw_call("read", '{"name": "math.arctan"}'))
    assert "no document named 'math.arctan'; use a name that search returned" in short


def test_a_truncated_last_turn_is_scored_on_its_text_before_the_tool_call():
    before = "It is math.atan. " + raw_call("read", '{"name": "math.atan"}')
    after = raw_call("read", '{"name": "math.atan"}') + " It is math.atan."
    rewards = []
    for turn in (before, after):
        [t] = agentgym.rollout(
            "docsearch", agentgym.ScriptedPolicy([turn]), tasks=[0], env_kwargs={"max_turns": 1}
        )
        assert t.status == "truncated", t.error
        rewards.append(t.final_reward)
    assert rewards == [1.0, 0.0]
