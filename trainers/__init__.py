"""GRPO + LoRA trainer on vLLM rollouts.

It lands with its own issue; the rollout engine and `Trajectory.flatten` in `agentgym` are
the interface it will consume.
"""
