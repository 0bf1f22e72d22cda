r"""SFT warm start: teach a model an env's tool-call format from its oracle trajectories.

A randomly initialised (or weak) model never calls a tool, so RL has nothing to reinforce.
The warm start plays each task's `reference_turns` through the env (so tool results are the
real ones), renders the conversations with the model's chat template and trains with loss on
the assistant tokens only: each assistant turn's content and its end-of-turn token, exactly
the tokens a rollout engine samples (the ``\n`` after ``<|im_end|>`` and every system, user
and tool token belong to the prompt and carry no loss). A template that rewrites history (Qwen3
drops a finished turn's empty think block) cannot render a conversation as one sequence the
model sampled; such a conversation trains as one sample per assistant turn, each a fresh
prompt and the turn as the model samples it after that prompt: the rollout engine's
``per_turn`` samples.

Full-weight by default: the quickstart's tiny model starts random, and a skill such as copying
numbers into a tool call is learned by the whole network, not by a low-rank delta on random
weights; GRPO then trains a LoRA adapter on top of the warm-started base. ``method="lora"``
trains an adapter instead (for a real pretrained model) and merges it into the saved weights,
so the output is a plain model folder either way.

Example::

    from agentgym.engine.tiny import build_preset
    from agentgym.trainers._sft import SFTConfig, sft_warm_start

    base = build_preset("quickstart", seed=0)
    warm = sft_warm_start(base, "calculator", {"num_tasks": 2000, "seed": 1},
                          "runs/sft", SFTConfig(steps=300))

Every source trains through `sft_on_conversations`: the env's scripts here, recorded
trajectories in ``agentgym sft --trajectories`` (`trainers._sft_cli`).

torch and transformers are imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import pickle
import random
import re
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from agentgym import ScriptedPolicy, make, rollout
from agentgym._check import PLAY_SECONDS, lists_tools
from agentgym._check_template import Call, format_fix, read_calls, template_failure_cause
from agentgym._durable import atomic_write_text, fsync_dir
from agentgym._errors import ConfigError
from agentgym._registry import made_for_a_command
from agentgym.parsers import ToolCallParser
from agentgym.runs._folder import SFT_SUMMARY, sft_checkpoint

from ._config_rules import SEED_LIMIT
from ._run_dir import fsync_tree

if TYPE_CHECKING:
    from agentgym.engine._render import ChatRenderer

Message = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass
class SFTConfig:
    """Knobs of the warm start; checked on construction, before any model loads.

    Every knob is documented where it is declared, below. Who sets which: the train stage's
    warm start builds one from `GRPOConfig` (``sft_steps``, ``sft_learning_rate``,
    ``sft_batch_size``, ``seed``, ``sft_method``, ``lora_r`` as ``lora_rank``, ``lora_alpha``,
    ``max_model_len`` as ``max_length``, ``sft_target_accuracy`` with ``sft_eval_every`` as
    ``eval_every``, and the trainer's ``device``); ``agentgym sft`` from its options (of the
    same names; ``--target-accuracy`` measures every 10 steps). ``warmup_steps``,
    ``weight_decay``, ``max_grad_norm``, ``num_threads`` and ``log`` are set from Python only.
    """

    steps: int = 300
    """Optimiser steps (each one batch)."""
    lr: float = 2e-3
    """Peak learning rate (AdamW), reached after ``warmup_steps`` and held (constant)."""
    batch_size: int = 32
    """Trajectories per step."""
    seed: int = 0
    """Seeds the data order and (for LoRA) the adapter init: same seed, same weights."""
    warmup_steps: int = 20
    """Linear warm-up from 0 to ``lr``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip; None disables it."""
    method: Literal["full", "lora"] = "full"
    """``full`` trains every weight; ``lora`` trains an adapter and merges it before saving."""
    lora_rank: int = 16
    """Adapter rank when ``method="lora"`` (>= 1; ignored by ``full``)."""
    lora_alpha: float = 32
    """Adapter scale numerator when ``method="lora"`` (scale = alpha / rank)."""
    num_threads: int | None = None
    """torch intra-op CPU threads, set with `torch.set_num_threads` for the whole process and
    left so (e.g. 1 beside other work on the machine); None leaves torch's default."""
    eval_every: int = 0
    """Every N steps, measure `reference_accuracy` (the share of eval traces the model carries
    out token for token after their first assistant token) on the eval traces; 0 never does."""
    target_accuracy: float | None = None
    """Stop early once `reference_accuracy` on the eval traces reaches this (needs
    ``eval_every``); None trains all ``steps``."""
    max_length: int | None = None
    """Longest trace in tokens; None: the model's position limit (its config.json). A longer
    trace is refused before the model loads: it would teach positions rollouts never reach."""
    device: str = "cpu"
    """Where SFT trains (``cpu``, ``cuda``, ``cuda:1`` ...), in float32 either way."""
    save_every: int = 50
    """Every N steps a checkpoint (the weights being trained, optimiser, step, metrics) goes to
    ``<out_dir>.partial/``: a run killed mid-way and run again with the same knobs and
    traces (``steps`` and ``save_every`` may change) resumes there instead of from step 0.
    Removed once the model is saved. 0: none."""
    log: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False)
    """Called with each step's metrics (``step``, ``loss``, ``lr``, ``seconds``, ...)."""

    def __post_init__(self) -> None:
        positive = {"steps": self.steps, "batch_size": self.batch_size, "lora_rank": self.lora_rank}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"SFTConfig.{name} must be >= 1, got {value}")
        if not 0 < self.lr < math.inf:  # inf loaded the weights, then trained into nan
            raise ConfigError(f"SFTConfig.lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.seed < SEED_LIMIT:  # as train's: torch's generators take no more
            raise ConfigError(f"SFTConfig.seed must be in [0, 2**31), got {self.seed}")
        if self.save_every < 0:
            raise ConfigError(f"SFTConfig.save_every must be >= 0 (0: no checkpoint), got "
                              f"{self.save_every}")  # fmt: skip
        if self.warmup_steps < 0 or self.eval_every < 0:
            raise ConfigError(
                f"warmup_steps and eval_every must be >= 0, got {self.warmup_steps}, "
                f"{self.eval_every}"
            )
        if self.method not in ("full", "lora"):
            raise ConfigError(f"SFTConfig.method must be 'full' or 'lora', got {self.method!r}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError(
                f"SFTConfig.target_accuracy must be a share in (0, 1] (a share of validation "
                f"traces), or None to train all steps; got {self.target_accuracy}"
            )
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"SFTConfig.max_length must be >= 1 or None, got {self.max_length}")
        if self.target_accuracy is not None and not self.eval_every:
            raise ConfigError("target_accuracy needs eval_every > 0 (how often to measure it)")
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"SFTConfig.device must be cpu, cuda or cuda:N (or mps, xpu), got "
                              f"{self.device!r}")  # fmt: skip


#: The devices SFT trains on, as torch names them.
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")


def check_device_here(
    device: str, fix: str = "train on cpu (or on a machine with that device)"
) -> None:
    """Refuse, before the weights load, a device this machine's torch does not have.

    Why: torch says so only when the model moves there, with a traceback naming no option.
    ``fix`` ends the error: what the caller's user sets instead.
    """
    import torch

    kind, _, index = device.partition(":")
    backend = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None),
               "mps": torch.backends.mps}.get(kind)  # fmt: skip
    if backend is None:  # the CPU
        return
    count = backend.device_count() if hasattr(backend, "device_count") else int(
        backend.is_available())  # fmt: skip
    if not backend.is_available() or (index and int(index) >= count):
        raise ConfigError(
            f"device {device!r}, but torch {torch.__version__} sees {count} {kind} device(s) on "
            f"this machine; {fix}"
        )


@dataclass
class Example:
    """One tokenized conversation: ``mask[i]`` is 1 where ``ids[i]`` carries loss."""

    ids: list[int]
    mask: list[int]


class Played(NamedTuple):
    """What playing an env's script gave: the conversations kept, the tools, the drops."""

    conversations: list[list[Message]]
    tools: list[dict[str, Any]]
    dropped: Counter[str]
    """Episodes not kept, by why: ``status`` (not ``ok``: the script raised, a tool broke)
    or ``reward`` (an oracle episode with no reward): the names `kept_conversations` counts
    recorded episodes' drops under, so ``sft.json`` reads the same for both sources."""


def oracle_conversations(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    tasks: Sequence[int] | None = None,
) -> tuple[list[list[Message]], list[dict[str, Any]]]:
    """Play tasks with the env's oracle (``reference_turns``); returns (conversations, tools).

    `played_script` of the ``reference`` script without its count of dropped episodes.
    """
    played = played_script(env_id, env_kwargs, tasks)
    return played.conversations, played.tools


def played_script(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    tasks: Sequence[int] | None = None,
    script: str = "reference",
) -> Played:
    """Play tasks with one of the env's scripted behaviours.

    ``script`` names an env method ``<script>_turns(task) -> list[str]``: ``reference`` is the
    oracle every env with SFT support has; an env may script other habits (the calculator's
    ``estimate`` answers from a mental estimate, without the tool). ``tasks`` picks task
    indices (e.g. only the training split); None plays every task.

    Reference episodes are kept only when they end ``ok`` with reward > 0 (an oracle that fails
    is no oracle); any other script's episodes are kept whatever their reward, since they
    demonstrate a habit, right or wrong. The dropped ones are counted and logged with the
    first one's error: a script that raised on half the tasks trained on the other half
    without a word. An episode still playing after `PLAY_SECONDS` (the bound of
    ``agentgym check``'s reference episode) is cut and dropped as ``late``: a tool or reward
    that never returned hung the warm start, before step 1, with no word of why.

    Raises:
        ConfigError: the env has no ``<script>_turns``, it raises on the first task, or no
            reference episode succeeded.
    """
    env: Any = make(env_id, **(env_kwargs or {}))
    try:
        turns = getattr(env, f"{script}_turns", None)
        if turns is None or scripted_turns(turns, env.tasks[0], env_id, script) is None:
            raise ConfigError(
                f"env {env_id!r} has no {script}_turns; a warm-start script names a method "
                "<name>_turns of the env (every SFT-ready env has reference_turns)"
            )
        tools = list(getattr(env, "tool_schemas", []))
    finally:
        env.close()  # the rollout below makes its own; this one only showed the script
    trajectories = rollout(
        env_id,
        ScriptedPolicy(turns),
        tasks=list(tasks) if tasks is not None else None,
        env_kwargs=env_kwargs,
        episode_timeout=PLAY_SECONDS,
    )
    oracle = script == "reference"
    reasons = [_script_drop_reason(t, oracle) for t in trajectories]
    good = [t.messages for t, why in zip(trajectories, reasons, strict=True) if why is None]
    if oracle and not good:
        raise ConfigError(f"no oracle episode of {env_id!r} succeeded; check reference_turns")
    dropped = Counter(why for why in reasons if why is not None)
    if dropped:
        errors = [t.error for t in trajectories if t.error]
        first = f"; the first error: {_last_line(errors[0])}" if errors else ""
        log.warning("%d of %d %s_turns episodes of %r dropped (%s)%s", dropped.total(),
                    len(trajectories), script, env_id, dropped_text(dropped), first)  # fmt: skip
    return Played(good, tools, dropped)


def scripted_turns(turns: Callable[[Any], Any], task: Any, env_id: str, script: str) -> Any:
    """``turns(task)``, a script raising as one `ConfigError` naming it and the exception.

    Why: the env author's script raised out of the warm start as a traceback (exit 1).
    """
    try:
        return turns(task)
    except Exception as exc:  # the env author's code: any exception is theirs to fix
        raise ConfigError(f"env {env_id!r}: {script}_turns raised {type(exc).__name__}: {exc}; "
                          f"fix {script}_turns (it returns a task's assistant turns)") \
            from exc  # fmt: skip


def _script_drop_reason(trajectory: Any, oracle: bool) -> str | None:
    """Why a scripted episode is not kept (a `DROP_REASONS` key); None keeps it."""
    if trajectory.status == "late":
        return "late"
    if trajectory.status != "ok":
        return "status"
    return "reward" if oracle and not (trajectory.final_reward or 0) > 0 else None


def _last_line(text: str) -> str:
    """A traceback's last line: the exception, which is what a log line needs of it."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else text


#: How a drop reason reads in a log line and the command's summary.
DROP_REASONS = {
    "status": "not ok (the script or a tool raised, or the episode broke)",
    "reward": "with no reward",
    "late": f"still playing after {PLAY_SECONDS:g} s (a tool or the reward never returned)",
    "no_assistant_turn": "without an assistant turn (nothing to train)",
}


def dropped_text(dropped: Mapping[str, int]) -> str:
    """``4 not ok (...), 2 with no reward``: the nonzero counts, in words."""
    return ", ".join(f"{n} {DROP_REASONS.get(k, k)}" for k, n in dropped.items() if n)


def mixed_conversations(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    tasks: Sequence[int],
    scripts: Mapping[str, float],
    seed: int = 0,
) -> Played:
    """Split ``tasks`` among the env's scripts in the given shares and play each part.

    Why a mix: a warm start on the oracle alone also teaches *when* to use a tool, leaving RL
    nothing to discover. A log of a weaker agent (e.g. ``{"reference": 0.3, "estimate": 0.7}``:
    the tool in 30% of answers) teaches the skills but leaves the decision to GRPO, the way a
    pretrained model that can call tools still has to learn when calling them pays.
    The split is a seeded shuffle: same tasks, shares and seed, same conversations.
    Every part's dropped episodes are counted together.
    """
    order = list(tasks)
    random.Random(seed).shuffle(order)
    total = sum(scripts.values())
    conversations: list[list[Message]] = []
    tools: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    start, cumulative = 0, 0.0
    for script, share in scripts.items():
        cumulative += share
        end = round(len(order) * cumulative / total)
        if end > start:
            part = played_script(env_id, env_kwargs, tasks=order[start:end], script=script)
            conversations += part.conversations
            tools = part.tools
            dropped += part.dropped
        start = end
    return Played(conversations, tools, dropped)


def _renderer(tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None) -> ChatRenderer:
    """The rollout engine's renderer, so SFT renders exactly what the rollouts render.

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) render the template as the
    rollouts render it, so SFT trains the tokens they sample.

    Why theirs: it hands templates tool-call arguments as objects, as real ones expect
    (Qwen2.5's writes ``arguments | tojson``: the OpenAI-format JSON string came out quoted,
    and SFT taught a call format no parser reads), and reports a template's failure in one
    line.
    """
    from agentgym.engine._render import ChatRenderer  # imports the engine's deps: here, late

    return ChatRenderer(tokenizer, dict(chat_template_kwargs or {}))


def _whole_conversation(
    renderer: ChatRenderer, messages: list[Message], tools: list[dict[str, Any]] | None
) -> Example:
    """Token ids of the rendered conversation and its loss mask (assistant tokens only).

    The chat template is rendered prefix by prefix: before each assistant message the prompt
    (``add_generation_prompt=True``) must extend the previous render, and the assistant's
    part is its content through the first stop token the engine ends a turn on (the eos
    token, or one of ``generation_config.json``'s: Gemma's ``<end_of_turn>``); what follows
    that token belongs to the next prompt. ``renderer`` is `_renderer`'s, built once for many
    conversations.

    Raises:
        HistoryRewrittenError: the template rewrites history (not a prefix);
            `conversation_examples` then trains per turn.
        ConfigError: an assistant turn holds no stop token, or the template fails to render
            the conversation.
    """
    segments: list[tuple[str, int]] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = renderer.render_text(messages[:i], tools, True)
        full = renderer.render_text(messages[: i + 1], tools, False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise HistoryRewrittenError(
                "the chat template does not keep history as a prefix; SFT on whole "
                "conversations needs one that does (`conversation_examples` trains per turn)"
            )
        reply = full[len(prompt) :]
        end = _through_first_stop(reply, renderer.stop_texts)
        if end < 0:
            raise ConfigError(
                f"assistant turn {i} holds none of the model's stop tokens "
                f"{renderer.stop_texts}: {reply!r}; the template must end turns with one"
            )
        segments += [(prompt[len(done) :], 0), (reply[:end], 1)]
        done = prompt + reply[:end]
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in segments:
        piece = renderer.encode(text)
        ids += piece
        mask += [trainable] * len(piece)
    return Example(ids, mask)


def _through_first_stop(reply: str, stops: Sequence[str]) -> int:
    """Where ``reply`` ends: after its first stop token's text (-1 when it holds none)."""
    found = [(at, len(stop)) for stop in stops if (at := reply.find(stop)) >= 0]
    return sum(min(found)) if found else -1


class HistoryRewrittenError(ConfigError):
    """The chat template renders a conversation's history other than as the model sampled it."""


def conversation_examples(
    renderer: ChatRenderer, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> tuple[list[Example], str]:
    """A conversation's training samples and their mode: ``concat`` (one) or ``per_turn``.

    ``renderer``: `_renderer`'s, built once per run. Why per turn: a template that rewrites
    history (Qwen3 drops a finished turn's empty think block; ``enable_thinking=False`` opens
    each prompt with one) has no single sequence the model sampled. The rollout engine then
    samples each turn after a fresh prompt; the warm start trains the same samples, instead
    of refusing the model.
    """
    try:
        return [_whole_conversation(renderer, messages, tools)], "concat"
    except HistoryRewrittenError:
        return _per_turn_examples(renderer, messages, tools), "per_turn"


def _per_turn_examples(
    renderer: ChatRenderer, messages: list[Message], tools: list[dict[str, Any]] | None
) -> list[Example]:
    """One sample per assistant turn: its fresh prompt (no loss), then the turn as written.

    The turn is what the template writes after the prompt the engine gives it
    (`ChatRenderer.written_turn_ids`), also where the finished turn does not extend that
    prompt (Mistral v0.3 moves the system prompt; ``enable_thinking=False`` opens the prompt
    with an empty think block the finished turn lacks).
    """
    examples = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        written = renderer.written_turn_ids(messages[: i + 1], tools)
        prompt = renderer.prompt_ids(messages[:i], tools)
        examples.append(Example(prompt + written, [0] * len(prompt) + [1] * len(written)))
    return examples


def _batch_order(count: int, batch_size: int, steps: int, seed: int) -> Iterator[list[int]]:
    """Yield ``steps`` batches of example indices, reshuffled per epoch (seeded).

    Indices, not tensors: a resumed run draws the batches before its checkpoint without
    padding them.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(count, generator=generator).tolist()
        picked, order = order[:batch_size], order[batch_size:]
        yield picked


def _collate(batch: Sequence[Example], pad_id: int = 0) -> dict[str, Any]:
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.where(torch.tensor(e.mask) > 0, torch.tensor(e.ids), -100)
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def _predictions(model: Any, batch: dict[str, Any], share_prefix: bool = True) -> tuple[Any, Any]:
    """Logits that predict the labelled tokens, and those labels (-100 elsewhere), aligned.

    Only the positions from the one before the first label are asked of the model
    (`logits_to_keep`): with a real vocabulary the prompt's logits are most of the memory,
    and nothing reads them.
    """
    from ._prefix import logits_to_keep, policy_logits

    labels = batch["labels"]
    keep = logits_to_keep(labels != -100)
    logits = policy_logits(model, batch["input_ids"], batch["attention_mask"], share_prefix, keep)
    return logits[:, :-1], labels[:, labels.shape[1] - keep + 1 :]


def masked_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Mean next-token cross-entropy over the tokens whose label is not -100."""
    import torch

    logits, targets = _predictions(model, batch)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100
    )


def reference_accuracy(
    model: Any, examples: Sequence[Example], batch_size: int = 64, device: str = "cpu"
) -> float:
    """Share of conversations the model carries out token for token once it has started them.

    Teacher forced, one forward pass, no generation: a conversation counts when every
    assistant token after the first is the model's argmax. The first token is the agent's
    choice of strategy (call a tool, or answer at once); a mixed warm start leaves that choice
    to RL on purpose, so this measures the skills (copying arguments, reading results), not
    the choice. After an oracle-only warm start, where the choice is learned in a few steps,
    it is the share of tasks greedy decoding solves by reproducing the oracle.
    """
    import torch

    hits = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = _collate(examples[start : start + batch_size])
            batch = {k: v.to(device) for k, v in batch.items()}
            logits, targets = _predictions(model, batch, share_prefix=False)
            trained = targets != -100
            wrong = (logits.argmax(-1) != targets) & trained
            first = trained.int().argmax(-1)  # the strategy token, left to RL
            wrong[torch.arange(len(first)), first] = False
            hits += int((~wrong.any(-1)).sum())
    return hits / max(len(examples), 1)


def sft_warm_start(
    model_dir: str | os.PathLike[str],
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    out_dir: str | os.PathLike[str],
    config: SFTConfig | None = None,
    *,
    tasks: Sequence[int] | None = None,
    validation_tasks: Sequence[int] = (),
    scripts: Mapping[str, float] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    length_knob: str = "SFTConfig.max_length",
    traces: WarmStartTraces | None = None,
) -> Path:
    """Fine-tune ``model_dir`` on the env's oracle trajectories; save the result in ``out_dir``.

    Args:
        model_dir: a transformers model folder with a chat template (e.g. `build_preset`'s).
        env_id: a registered env with `reference_turns` (e.g. ``"calculator"``).
        env_kwargs: for `make`.
        tasks: task indices played once each as training data (keep held-out tasks out);
            None plays all of the env's tasks.
        out_dir: written with ``model.safetensors``, config, tokenizer and ``sft.json``
            (config, source, step metrics, time); vLLM and transformers load it as a model folder.
        config: the knobs; None uses `SFTConfig()`.
        validation_tasks: task indices whose oracle traces `reference_accuracy` is measured
            on every ``config.eval_every`` steps (for ``target_accuracy``). Take them from the
            training split: a stopping rule tuned on the eval tasks would leak them.
        scripts: shares of the training tasks played by each of the env's scripted
            behaviours (`mixed_conversations`); None plays all with ``reference``.
        chat_template_kwargs: passed to the chat template, as the rollouts pass them.
        length_knob: how a too-long trace's error names ``config.max_length``: the caller's
            knob (a train run's ``max_model_len``).
        traces: the scripts' conversations, played already (`check_warm_start`'s); None
            plays them.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ConfigError: no trace to train on, or a trace longer than ``config.max_length`` (the
            model's context by default); both before the model loads.
    """
    config = config or SFTConfig()
    if traces is None:
        traces = _env_traces(env_id, env_kwargs, tasks, validation_tasks, scripts, config.seed)
    return sft_on_conversations(
        model_dir, traces.conversations, traces.tools, out_dir, config,
        held_out=traces.held_out, chat_template_kwargs=chat_template_kwargs,
        source=traces.source, length_knob=length_knob,
    )  # fmt: skip


def check_warm_start(
    model_dir: str | os.PathLike[str],
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    config: SFTConfig,
    *,
    tasks: Sequence[int],
    validation_tasks: Sequence[int] = (),
    scripts: Mapping[str, float] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    length_knob: str = "SFTConfig.max_length",
) -> WarmStartTraces:
    """Refuse what `sft_warm_start` would refuse of its traces, without training; return them.

    Why: a train run's warm start failed on its traces (an oracle that never succeeds, a
    trace past ``max_model_len``) only after vLLM had started and the base model was
    evaluated. This plays the same scripts (CPU, no model) and renders them with the
    tokenizer, so the run refuses them before any engine starts. ``tasks``: the ones the
    warm start plays (``sft_num_traces`` of them in a train run); give the traces returned
    to `sft_warm_start`, so they are played once.

    Raises:
        ConfigError: as `sft_warm_start` before its model loads.
    """
    traces = _env_traces(env_id, env_kwargs, tasks, validation_tasks, scripts, config.seed)
    _training_data(model_dir, traces.conversations, traces.tools, config, traces.held_out,
                   chat_template_kwargs, traces.source, length_knob)  # fmt: skip
    return traces


class WarmStartTraces(NamedTuple):
    """The conversations an env's warm start trains on (`sft_warm_start`)."""

    conversations: list[list[Message]]
    tools: list[dict[str, Any]]
    held_out: list[list[Message]]
    """The validation tasks' oracle conversations (``reference_accuracy``)."""
    source: dict[str, Any]
    """What `sft.json` records of where they came from (and what was dropped)."""


def _env_traces(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    tasks: Sequence[int] | None,
    validation_tasks: Sequence[int],
    scripts: Mapping[str, float] | None,
    seed: int,
) -> WarmStartTraces:
    """The conversations of `sft_warm_start`'s tasks, played with the env's scripts."""
    scripts = dict(scripts or {"reference": 1.0})
    if tasks is None:
        tasks = range(env_facts(env_id, env_kwargs).size)
    conversations, tools, dropped = mixed_conversations(env_id, env_kwargs, tasks, scripts, seed)
    if not conversations:
        raise ConfigError(
            f"the SFT warm start on {env_id!r} has no trace to train on (no train task, or "
            "every scripted episode failed); give it train tasks whose scripts play, or skip "
            "SFT (sft_steps 0)"
        )
    held_out: list[list[Message]] = []
    if validation_tasks:
        held_out, _ = oracle_conversations(env_id, env_kwargs, tasks=validation_tasks)
    source = {"kind": "env", "env_id": env_id, "env_kwargs": env_kwargs, "scripts": scripts,
              "dropped": {k: dropped[k] for k in ("status", "reward", "late")}}  # fmt: skip
    return WarmStartTraces(conversations, tools, held_out, source)


class EnvFacts(NamedTuple):
    """What SFT needs of an env besides its conversations."""

    tools: list[dict[str, Any]]
    """The tool schemas every prompt renders."""
    size: int
    """How many tasks "all tasks" is."""
    lists_tools: bool
    """The env's system prompt lists the tools (``tool_prompt="system"``), not the template."""


def env_facts(env_id: str, env_kwargs: Mapping[str, Any] | None) -> EnvFacts:
    """`EnvFacts` of one env built and closed (for ``agentgym sft``: a failing build is a line)."""
    env: Any = made_for_a_command(env_id, dict(env_kwargs or {}))
    try:
        return EnvFacts(list(getattr(env, "tool_schemas", [])), len(getattr(env, "tasks", ())),
                        lists_tools(env))  # fmt: skip
    finally:
        env.close()


def sft_on_conversations(
    model_dir: str | os.PathLike[str],
    conversations: Sequence[list[Message]],
    tools: list[dict[str, Any]],
    out_dir: str | os.PathLike[str],
    config: SFTConfig | None = None,
    *,
    held_out: Sequence[list[Message]] = (),
    chat_template_kwargs: Mapping[str, Any] | None = None,
    source: dict[str, Any],
    length_knob: str = "SFTConfig.max_length",
) -> Path:
    """Train ``model_dir`` on whole conversations; save a plain model folder in ``out_dir``.

    The one training path of every SFT source (an env's scripts, recorded trajectories):
    render with the model's chat template and ``tools`` as the rollouts render them, refuse
    traces the loop cannot train on before the weights load, train with loss on the
    assistant tokens only, then write the model, its tokenizer and ``sft.json``.

    Args:
        model_dir: a transformers model folder with a chat template.
        conversations: chat messages, system, user and tool turns included.
        tools: the tool schemas the env offers (rendered into every prompt).
        out_dir: written as `sft_warm_start` writes it; made if missing.
        config: the knobs; None uses `SFTConfig()`.
        held_out: conversations `reference_accuracy` is measured on (``config.eval_every``).
        source: where the conversations came from, recorded in ``sft.json`` as it is; its
            ``env_id`` names the traces in error messages.
        chat_template_kwargs: passed to the chat template, as the rollouts pass them.
        length_knob: how a too-long trace's error names ``config.max_length``.

    Raises:
        ConfigError: no conversation, or one longer than ``config.max_length`` (the model's
            context by default), both before the model loads; a checkpoint in
            ``<out_dir>.partial/`` of other knobs, model or traces; a loss that is not finite.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = config or SFTConfig()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    started = time.perf_counter()
    tokenizer, examples, validation, modes, source = _training_data(
        model_dir, conversations, tools, config, held_out, chat_template_kwargs, source,
        length_knob,
    )  # fmt: skip
    check_device_here(config.device)
    out = Path(out_dir)
    checkpoint = _Checkpoint(sft_checkpoint(out), _fingerprint(config, model_dir, examples),
                             _knobs(config), str(model_dir))  # fmt: skip
    checkpoint.refuse_another_run(config.steps)
    with _sole_writer(checkpoint.folder, out):
        torch.manual_seed(config.seed)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.to(config.device)
        if config.method == "lora":
            model = _with_lora(model, config)
        history, trained_before = _train(model, examples, validation, config, checkpoint)
        if config.method == "lora":
            model = model.merge_and_unload()
        summary = {
            "config": {k: v for k, v in asdict(config).items() if k != "log"},
            "base_model": str(model_dir),
            "source": source,
            "num_examples": len(examples),
            "conversations": modes,
            "seconds": time.perf_counter() - started + trained_before,  # a killed run's too
            "history": history,
        }
        _save(model.cpu(), tokenizer, out, summary)
        shutil.rmtree(checkpoint.folder, ignore_errors=True)  # the model is saved: done with it
    _log_done(history, len(conversations), len(examples), out)
    return out


class _Data(NamedTuple):
    """The rendered, checked training data of a run (`_training_data`)."""

    tokenizer: Any
    examples: list[Example]
    validation: list[Example]
    modes: dict[str, int]
    source: dict[str, Any]


def _training_data(
    model_dir: str | os.PathLike[str],
    conversations: Sequence[list[Message]],
    tools: list[dict[str, Any]],
    config: SFTConfig,
    held_out: Sequence[list[Message]],
    chat_template_kwargs: Mapping[str, Any] | None,
    source: dict[str, Any],
    length_knob: str,
) -> _Data:
    """The conversations rendered as training samples and checked, with the tokenizer alone.

    Raises:
        ConfigError: whatever of the traces the loop cannot train on (`_check_traces`).
    """
    from transformers import AutoTokenizer

    from agentgym.engine._render import TemplateError

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    renderer = _renderer(tokenizer, chat_template_kwargs)
    render = functools.partial(conversation_examples, renderer, tools=tools)
    parser = _env_parser(source)
    try:
        rendered = [render(messages) for messages in conversations]
    except TemplateError as exc:  # Mistral's refuses the hermes parser's call ids
        raise ConfigError(template_failure_cause(renderer, tools, parser) or str(exc)) from exc
    conversations, rendered, untrained = _with_trained_tokens(conversations, rendered)
    source = _count_untrained(source, untrained, len(conversations))
    _check_trained_calls(conversations, rendered, renderer, parser, source, model_dir)
    examples, modes = _samples(rendered)
    validation, _ = _samples(_with_trained_tokens(held_out, list(map(render, held_out)))[1])
    if modes["per_turn"]:
        log.info("the chat template rewrites history: %d of %d conversations train as one "
                 "sample per assistant turn (the rollouts' per_turn mode)",
                 modes["per_turn"], len(conversations))  # fmt: skip
    _check_traces(examples, validation, model_dir, config, source.get("env_id"), length_knob)
    return _Data(tokenizer, examples, validation, modes, source)


def _with_trained_tokens(
    conversations: Sequence[list[Message]], rendered: Sequence[tuple[list[Example], str]]
) -> tuple[list[list[Message]], list[tuple[list[Example], str]], int]:
    """The conversations whose samples train at least one token, theirs, and how many did not.

    Why: a conversation without an assistant turn (system and user only) renders as no
    trained token; a batch of such rows crashed inside the model after the weights loaded
    (``cannot reshape tensor of 0 elements``), and among others it counted as a trace used.
    """
    kept = [(messages, samples) for messages, samples in zip(conversations, rendered, strict=True)
            if any(1 in e.mask for e in samples[0])]  # fmt: skip
    return [m for m, _ in kept], [r for _, r in kept], len(conversations) - len(kept)


def _count_untrained(source: dict[str, Any], count: int, left: int) -> dict[str, Any]:
    """``source`` with ``count`` conversations dropped for training nothing (`sft.json` keeps it).

    Raises:
        ConfigError: none is ``left``, before the weights load; the line says why and the fix.
    """
    if not count:
        return source
    if not left:
        raise ConfigError(
            f"none of the {count} SFT conversations of {source.get('env_id')!r} has an "
            "assistant turn, so there is no token to train on; give episodes in which the "
            "agent answered (e.g. record them with agentgym eval)"
        )
    dropped = {**(source.get("dropped") or {}), "no_assistant_turn": count}
    log.warning("SFT conversations dropped: %s", dropped_text({"no_assistant_turn": count}))
    return {**source, "dropped": dropped}


def _samples(
    rendered: Iterable[tuple[list[Example], str]],
) -> tuple[list[Example], dict[str, int]]:
    """All samples of the rendered conversations, and how many conversations had each mode."""
    examples: list[Example] = []
    modes = {"concat": 0, "per_turn": 0}
    for samples, mode in rendered:
        examples += samples
        modes[mode] += 1
    return examples, modes


def _check_trained_calls(
    conversations: Sequence[list[Message]],
    rendered: Sequence[tuple[list[Example], str]],
    renderer: ChatRenderer,
    parser: ToolCallParser | None,
    source: Mapping[str, Any],
    model_dir: str | os.PathLike[str],
) -> None:
    """Refuse, before the model loads, a template that writes calls the env's parser misreads.

    Why: the template, not the env's parser, writes the trained tokens. The tiny model's
    Hermes template under ``parser=llama3_json`` taught ``<tool_call>`` JSON that the env
    reads as plain text, so every rollout after the warm start called no tool, silently.
    Each trained assistant turn with calls is decoded as the rollout engine decodes a sampled
    one and must parse with the env's parser into those calls (names and arguments), no
    errors. Turns without calls are not read: a recorded turn whose call was malformed keeps
    its text, which the parser reports as an error, rightly.
    """
    if parser is None:
        return
    for messages, (samples, _) in zip(conversations, rendered, strict=True):
        turns = [m for m in messages if m["role"] == "assistant"]
        for k, (message, ids) in enumerate(zip(turns, _trained_runs(samples), strict=False)):
            text = renderer.visible_text(
                renderer.tokenizer.decode(ids, skip_special_tokens=False), ids
            )
            expected = _message_calls(message)
            if expected and read_calls(parser, text) != expected:
                raise ConfigError(
                    f"the chat template of {model_dir} writes assistant turn {k + 1} of the "
                    f"{source.get('env_id')!r} traces as {text[:80]!r}, which the env's parser "
                    f"{parser.name!r} does not read as its calls {expected}, so SFT would teach "
                    f"a format the rollouts do not parse; {format_fix(text, expected, parser)}"
                )


def _env_parser(source: Mapping[str, Any]) -> ToolCallParser | None:
    """The tool-call parser of the env the traces came from (None: no env, or no parser)."""
    if source.get("env_id") is None:
        return None
    env: Any = make(source["env_id"], **(source.get("env_kwargs") or {}))
    try:
        parser = getattr(env, "parser", None)
    finally:
        env.close()
    return parser if isinstance(parser, ToolCallParser) else None


def _trained_runs(samples: Sequence[Example]) -> Iterator[list[int]]:
    """The ids of each stretch of loss-carrying tokens: one per assistant turn, in order."""
    for sample in samples:
        run: list[int] = []
        for token, trained in zip(sample.ids, sample.mask, strict=True):
            if trained:
                run.append(token)
            elif run:
                yield run
                run = []
        if run:
            yield run


def _message_calls(message: Message) -> list[Call]:
    """(name, arguments) of an assistant message's OpenAI ``tool_calls`` (arguments decoded)."""
    calls = []
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
        calls.append((call["function"]["name"], decoded))
    return calls


def _save(model: Any, tokenizer: Any, out: Path, summary: Mapping[str, Any]) -> None:
    """A plain model folder (weights, config, tokenizer) and its ``sft.json``, written last.

    ``sft.json`` marks the folder done (a train run then reuses it), so the files before it
    are synced first and it is written whole: a crash or power cut must not leave it beside
    a cut-short ``model.safetensors``, which a resumed run's engine fails to load.
    """
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    fsync_tree(out)
    fsync_dir(out.parent)
    atomic_write_text(out / SFT_SUMMARY, json.dumps(summary, indent=1, default=str))


#: In the checkpoint folder: the pid and host of the SFT run writing it (`_sole_writer`).
_OWNER = "owner.json"


@contextlib.contextmanager
def _sole_writer(folder: Path, out: Path) -> Iterator[None]:
    """Hold ``folder`` (the run's checkpoint folder) as its one writer while the run trains.

    Why: two runs into one OUT both trained and both said "output folder: OUT"; one model was
    silently lost (with the same knobs, both wrote one checkpoint). The lock is the eval's
    (`FolderLock`: ``flock``, dropped by the kernel when a run dies, even by ``kill -9``);
    ``owner.json`` beside it names the process holding it, as a train run's ``status.json``
    does. A run whose lock came after another finished finds that one's model and stops.

    Raises:
        ConfigError: a live process holds the folder, or ``out`` holds a finished model.
    """
    from agentgym._eval_folder import FolderLock

    folder.mkdir(parents=True, exist_ok=True)
    with FolderLock(folder, log.warning) as lock:
        try:
            lock.acquire()
        except ConfigError:
            raise ConfigError(
                f"{out} is being written by SFT process {_owner_pid(folder)} on this host; "
                f"wait for it to end (or stop it), or give another OUT"
            ) from None
        if (out / SFT_SUMMARY).is_file():  # the other run finished before the lock came
            raise ConfigError(f"{out} now holds a finished model ({SFT_SUMMARY}) that another "
                              "run saved; give another OUT")  # fmt: skip
        record = {"pid": os.getpid(), "host": socket.gethostname()}
        atomic_write_text(folder / _OWNER, json.dumps(record))
        try:
            yield
        finally:  # a failed run leaves its checkpoint to resume, not its claim
            (folder / _OWNER).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: no checkpoint was saved


def _owner_pid(folder: Path) -> str:
    """The pid ``owner.json`` names (``unknown``: not written yet, or unreadable)."""
    try:
        return str(json.loads((folder / _OWNER).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def _log_done(history: Sequence[Mapping[str, Any]], traces: int, samples: int, out: Path) -> None:
    """One line when the warm start ends: a short one otherwise leaves the log nothing."""
    split = f" ({samples} samples: some trained per turn)" if samples != traces else ""
    if history:
        log.info(
            "sft done: %d steps on %d traces%s, loss %.4f -> %.4f, saved in %s",
            len(history), traces, split, history[0]["loss"], history[-1]["loss"], out,
        )  # fmt: skip


def _check_traces(
    examples: Sequence[Example],
    held_out: Sequence[Example],
    model_dir: str | os.PathLike[str],
    config: SFTConfig,
    env_id: str | None,
    length_knob: str = "SFTConfig.max_length",
) -> None:
    """Refuse, before the model loads, traces the loop cannot train on.

    ``length_knob`` names ``config.max_length`` as the caller's user sets it.

    No trace at all failed inside the first batch (``max() arg is an empty sequence``) after
    the model loaded; traces past the model's context trained silently on positions the
    model was never built for.
    """
    from agentgym.engine._model_dir import _position_limit

    if not examples:
        raise ConfigError(
            f"SFT on {env_id!r} got no conversation to train on; give it at least one"
        )
    limit, why = config.max_length, length_knob
    fix = "raise it to {longest} or more (within the model's context), or shorten the env's " \
        "prompts or turns"  # fmt: skip
    if limit is None:
        found = _position_limit(Path(model_dir) / "config.json")
        if found is None:
            return
        limit, why = found[0], f"model's {found[1]}"
        fix = "shorten the env's prompts or turns, or use a model with a longer context"
    longest = max(len(e.ids) for e in [*examples, *held_out])
    if longest > limit:
        raise ConfigError(f"the longest SFT trace of {env_id!r} has {longest} tokens, over the "
                          f"{why} ({limit}); {fix.format(longest=longest)}")  # fmt: skip


def _with_lora(model: Any, config: SFTConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # PEFT scales by a float
        target_modules="all-linear",
    )
    return get_peft_model(model, lora)


#: `SFTConfig` fields a resumed run may change: the data order (`_batch_order`) and the
#: warm-up-then-constant rate do not depend on them, so the steps a checkpoint holds are the
#: ones the new run would have trained. (``log``, ``device``: not what is learned either.)
_RESUMABLE = ("log", "device", "steps", "save_every")


def _knobs(config: SFTConfig) -> dict[str, Any]:
    """The knobs a resumed run must share with its checkpoint, as JSON values."""
    knobs = {k: v for k, v in asdict(config).items() if k not in _RESUMABLE}
    return json.loads(json.dumps(knobs, sort_keys=True, default=str))


def _fingerprint(config: SFTConfig, model_dir: str | os.PathLike[str],
                 examples: Sequence[Example]) -> str:  # fmt: skip
    """What a checkpoint must have been trained on to be resumed: the knobs and the traces."""
    digest = hashlib.sha256(str(model_dir).encode())
    digest.update(json.dumps(_knobs(config), sort_keys=True).encode())
    for example in examples:
        digest.update(json.dumps([example.ids, example.mask]).encode())
    return digest.hexdigest()


@dataclass
class _Checkpoint:
    """A killed SFT run's state, in ``path``, valid only for the run of ``fingerprint``.

    Beside it, ``checkpoint.json`` holds the fingerprint, knobs and model it was saved with,
    so a run of other ones is refused before its model loads, naming what differs.
    """

    path: Path
    fingerprint: str
    knobs: dict[str, Any] = field(default_factory=dict)
    model: str = ""

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def record(self) -> Path:
        return self.folder / "checkpoint.json"

    def refuse_another_run(self, steps: int | None = None) -> None:
        """Refuse a checkpoint saved by a run of other knobs, model or traces, or past ``steps``.

        Checked on ``checkpoint.json`` alone, before the model loads: the refusal came after the
        weights had loaded (minutes on a real model) and named no knob.
        """
        if not self.path.is_file():
            return
        try:
            saved = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return  # a checkpoint from before the record: `load` checks its fingerprint
        if saved.get("fingerprint") == self.fingerprint:
            done = saved.get("step")
            if steps is not None and isinstance(done, int) and done > steps:
                raise self.past_steps(done, steps)
            return
        knobs = saved.get("knobs") or {}
        # SFTConfig.<knob>: `agentgym sft` names it as its option (``--batch-size``)
        differ = [f"SFTConfig.{k} (saved {knobs.get(k)!r}, now {v!r})"
                  for k, v in self.knobs.items() if knobs.get(k) != v]  # fmt: skip
        if saved.get("model") != self.model:
            differ.append(f"model (saved {saved.get('model')}, now {self.model})")
        raise ConfigError(
            f"{self.folder} holds a checkpoint of another SFT run, whose "
            + ("; ".join(differ) if differ else "traces")
            + " differ; run again with its settings to resume it, or delete that folder"
        )

    def save(self, step: int, model: Any, optimizer: Any, schedule: Any,
             history: list[dict[str, Any]]) -> None:  # fmt: skip
        """Written whole or not at all (a kill mid-write leaves the previous one)."""
        import torch

        self.folder.mkdir(parents=True, exist_ok=True)
        trained = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
        state = {"fingerprint": self.fingerprint, "step": step, "trained": trained,
                 "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                 "history": history}  # fmt: skip
        self.write_record()  # first: whenever state.pt is there, so is its record
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:  # synced before the rename, as a GRPO checkpoint is: a
            torch.save(state, f)  # power cut must not leave a renamed, empty state.pt
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.folder)
        self.write_record(step)  # what state.pt holds now (the first write said no step)

    def write_record(self, step: int | None = None) -> None:
        """``checkpoint.json``: what `refuse_another_run` compares, written whole and synced.

        ``step``: the step ``state.pt`` holds, once it is renamed in (None while it is written).
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"fingerprint": self.fingerprint, "knobs": self.knobs, "model": self.model,
                  **({"step": step} if step is not None else {})}  # fmt: skip
        atomic_write_text(self.record, json.dumps(record))

    def past_steps(self, done: int, steps: int) -> ConfigError:
        """The refusal of a resume whose ``steps`` is below the checkpoint's step ``done``."""
        return ConfigError(f"{self.path} holds step {done}, past SFTConfig.steps {steps}; give "
                           f"{done} or more to resume it, or delete {self.folder}")  # fmt: skip

    def load(self, model: Any, optimizer: Any, schedule: Any) -> tuple[int, list[dict[str, Any]]]:
        """(step, metrics so far) of the checkpoint, loaded into the three; (0, []) if none.

        Raises:
            ConfigError: the checkpoint is another run's (other knobs or traces), or damaged.
        """
        import torch

        if not self.path.is_file():
            return 0, []
        device = next(model.parameters()).device
        try:
            state = torch.load(self.path, map_location=device, weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
            why = " ".join(str(exc).split())[:200]  # cut short: a full disk, a copy cut off
            raise ConfigError(f"{self.path} is damaged ({why}); delete it to start this SFT "
                              "run over from step 1") from exc  # fmt: skip
        if state["fingerprint"] != self.fingerprint:
            raise ConfigError(
                f"{self.folder} holds a checkpoint of another SFT run (other knobs, model or "
                "traces); run again with the same ones to resume it, or delete that folder"
            )
        unexpected = model.load_state_dict(state["trained"], strict=False).unexpected_keys
        if unexpected:
            raise ConfigError(f"{self.folder}: weights {unexpected[:3]} are not this model's; "
                              "delete that folder")  # fmt: skip
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        log.info("sft resumed from %s at step %d", self.path, state["step"])
        return int(state["step"]), list(state["history"])


def _train(
    model: Any,
    examples: list[Example],
    held_out: list[Example],
    config: SFTConfig,
    checkpoint: _Checkpoint | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """The loop: batch -> masked loss -> clip -> AdamW step.

    Returns the per-step metrics and the seconds trained before a resume (0 without one).
    With a ``checkpoint`` it resumes where one was saved: the batches before it are drawn and
    skipped, so the data order is the uninterrupted run's, and a step's ``seconds`` go on
    counting from the killed run's.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(config.warmup_steps, 1))
    )
    done, history = checkpoint.load(model, optimizer, schedule) if checkpoint else (0, [])
    if checkpoint and done > config.steps:  # steps may change, not below the checkpoint
        raise checkpoint.past_steps(done, config.steps)  # (a record of before its step)
    trained_before = float(history[-1]["seconds"]) if history else 0.0
    t0 = time.perf_counter() - trained_before
    model.train()
    for step, picked in enumerate(
        _batch_order(len(examples), config.batch_size, config.steps, config.seed), start=1
    ):
        if step <= done:
            continue
        batch = {k: v.to(config.device) for k, v in _collate([examples[i] for i in picked]).items()}
        loss = masked_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        schedule.step()
        record: dict[str, Any] = {
            "step": step,
            "loss": loss.item(),
            "lr": schedule.get_last_lr()[0],
            "seconds": time.perf_counter() - t0,
        }
        if held_out and config.eval_every and step % config.eval_every == 0:
            model.eval()
            record["reference_accuracy"] = reference_accuracy(model, held_out,
                                                              device=config.device)  # fmt: skip
            model.train()
        history.append(record)
        if config.log is not None:
            config.log(record)
        if not math.isfinite(record["loss"]):
            raise ConfigError(f"SFT loss became {record['loss']} at step {step}; lower lr")
        target = config.target_accuracy
        if target is not None and record.get("reference_accuracy", -1.0) >= target:
            break
        if checkpoint and config.save_every and step % config.save_every == 0:
            checkpoint.save(step, model, optimizer, schedule, history)
    model.eval()
    return history, trained_before
