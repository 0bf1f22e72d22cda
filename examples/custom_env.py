"""Define, register and evaluate a custom tool env in ~20 lines (the README's example)."""

import agentgym


@agentgym.tool
def lookup(city: str) -> str:
    """Return the country a city is in.

    Args:
        city: the city's English name.
    """
    return {"Paris": "France", "Lima": "Peru"}.get(city, "unknown")


def correct(completion: str, answer: str) -> float:
    return float(answer in completion)


class CapitalsEnv(agentgym.ToolEnv):
    def __init__(self, **kwargs):
        tasks = [
            {"prompt": f"Which country is {c} in?", "answer": a}
            for c, a in [("Paris", "France"), ("Lima", "Peru")]
        ]
        super().__init__([lookup], tasks=tasks, rubric=agentgym.Rubric([correct]), **kwargs)

    def reference_turns(self, task):
        city = task["prompt"].split()[3]
        return [
            self.parser.render("", [agentgym.ToolCall("lookup", {"city": city})]),
            task["answer"],
        ]


agentgym.register("example/Capitals-v0", CapitalsEnv)

if __name__ == "__main__":
    env = agentgym.make("example/Capitals-v0")
    trajectories = agentgym.rollout(
        "example/Capitals-v0", agentgym.ScriptedPolicy(env.reference_turns), group_size=2
    )
    print(agentgym.summarize(trajectories))
