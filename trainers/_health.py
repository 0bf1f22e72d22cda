"""Run health: the troubleshooting table, read off a run's own metrics.

Why: "the reward does not rise" has a handful of causes, and each shows in figures the run
already logs (flat groups, tool errors, truncation, drift, clipping, a held-out success below
the warm start's). A user who does not know which figure to read loses the run; these rules
read them, during training (`HealthWatch`, each finding printed once, as soon as it shows) and
after it (the summary, and ``agentgym runs doctor RUN`` on any run folder, a killed one too).

Each rule is a small function of a `History` that returns a `Finding` or None; its ``rule`` id
is the anchor of its row in docs/troubleshooting.md. A rule looks at the recent steps (the last
third of the run, at least `MIN_STEPS`), so one noisy step does not fire it, and it needs
`MIN_STEPS` steps before it says anything, unless every episode so far failed
(`FAILURE_RULES`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym._summary import ONE_REWARD_KEY
from agentgym._trajectory import Trajectory

log = logging.getLogger(__name__)

#: Checks the watch makes per stretch of steps (every step up to this many steps).
WATCH_CHECKS = 50
#: Steps a rule needs before it judges, and the least a "recent" window holds.
MIN_STEPS = 3
#: Share of groups whose episodes all scored alike (no advantage, no gradient; read from
#: ``ONE_REWARD_KEY``, as the trainer logs it and an eval's summary holds it).
FLAT_GROUPS = 0.9
#: Success rates read as "nothing succeeds" / "everything succeeds".
NOTHING, EVERYTHING = 0.05, 0.95
#: Share of tool calls that failed (malformed, unknown tool, arguments refused by the schema).
TOOL_ERRORS = 0.3
#: Share of turns that hit max_completion_length.
TURNS_CUT = 0.1
#: Share of tool results cut to the env's max_tool_result_chars.
TOOL_RESULTS_CUT = 0.1
#: Shares of episodes cut by a budget, lost to infrastructure, late, or scored with an error.
TRUNCATED, INFRA_ERRORS, LATE, ERRORS = 0.2, 0.1, 0.1, 0.1
#: Outcomes of an episode that failed: a step of nothing else is no noise to wait out.
FAILED = ("error", "infra_error", "late")
#: Mean |engine logprob - trainer logprob| per token, in nats (exp(0.05) = a 5% ratio).
DRIFT = 0.05
#: Share of tokens whose ratio was clipped.
CLIPPED = 0.2
#: Mean KL to the base model per token (``beta`` > 0), in nats.
KL = 0.5
#: Entropy below this share of its start, while the reward did not rise, reads as a collapse.
ENTROPY_LEFT = 0.2
#: Entropy at this multiple of its start, while the reward did not rise, reads as the policy
#: coming apart (a learning rate too high turns it into noise).
ENTROPY_GROWN = 2.0
#: A rise or fall of a success rate (or a reward in [0, 1]) large enough to name.
MOVED = 0.1
#: Held-out success this far below the start's (the warm start's, or the base model's).
WORSE = 0.05


@dataclass(frozen=True)
class Finding:
    """One row of the troubleshooting table that this run's figures match."""

    rule: str  #: stable id; docs/troubleshooting.md#<rule> explains it
    title: str  #: the symptom, in a few words
    evidence: str  #: the figures that show it
    fix: str  #: what to change, or what to run to look closer

    def text(self) -> str:
        """Two lines: the symptom with its figures, then the fix."""
        return f"{self.title}: {self.evidence}\n    fix: {self.fix}"

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "title": self.title, "evidence": self.evidence, "fix": self.fix}


class History:
    """A run's training steps, evals and headline figures, as the rules read them."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        figures: Mapping[str, float] | None = None,
        *,
        batch: bool = False,
        warm_start: Mapping[str, Any] | None = None,
    ) -> None:
        #: one batch of episodes (an eval's, `diagnose_episodes`), judged whole: no steps
        self.batch = batch
        #: where the figures a finding quotes come from, for its evidence
        self.span = "in this eval" if batch else "in the recent steps"
        # a step whose every episode was late or infra_error has no reward/mean: a step still
        self.steps = [r for r in rows if "reward/mean" in r or "rollout/episodes" in r]
        self.figures = dict(figures or {})
        #: the SFT warm start's record (its ``sft.json``), None without one
        self.warm_start = warm_start
        #: (step, held-out success) of every eval: step 0's, periodic ones, the final one
        self.evals = [(int(r["step"]), float(value)) for r in rows
                      for value in (r.get("eval/success", r.get("final/success")),)
                      if _finite(value)]  # fmt: skip
        self.window = 1 if batch else max(MIN_STEPS, math.ceil(len(self.steps) / 3))

    @property
    def judged(self) -> bool:
        """Whether there are enough steps to judge at all."""
        return len(self.steps) >= (1 if self.batch else MIN_STEPS)

    @property
    def failed(self) -> bool:
        """Whether every episode of every step ended in a `FAILED` outcome."""
        shares = [sum(_number(r.get(f"rollout/frac_{status}")) or 0.0 for status in FAILED)
                  for r in self.steps]  # fmt: skip
        return bool(shares) and min(shares) >= 1.0 - 1e-9

    def values(self, key: str) -> list[float]:
        """The finite values of ``key`` over the training steps, in step order."""
        return [float(r[key]) for r in self.steps if _finite(r.get(key))]

    def recent(self, key: str) -> float | None:
        """Mean of ``key`` over the recent window; None if no recent step logged it."""
        return _mean(self.values(key)[-self.window :])

    def early(self, key: str) -> float | None:
        """Mean of ``key`` over the first window of steps."""
        return _mean(self.values(key)[: self.window])

    def success_key(self) -> str:
        """``reward/success`` where the env reports success, else ``reward/mean``."""
        return "reward/success" if self.values("reward/success") else "reward/mean"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> float | None:
    return float(value) if _finite(value) else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _pct(value: float) -> str:
    return f"{value:.0%}"


# ---- the rules ----------------------------------------------------------------------------


def flat_groups(h: History) -> Finding | None:
    """Groups whose G episodes all scored alike carry no advantage: nothing is learned.

    Which fix applies depends on where the reward sits: at nothing, at everything, the same for
    every episode of the step (the reward does not tell episodes apart), or paid without a
    success. An eval with several episodes a task (`diagnose_episodes`) reads the same way,
    as what a run from its model would face: its fixes name the eval's options.
    """
    flat = h.recent(ONE_REWARD_KEY)
    if flat is None or flat < FLAT_GROUPS:
        return None
    reward, spread = h.recent("reward/mean") or 0.0, h.recent("reward/std")
    success = h.recent("reward/success")  # None for rows that lack it
    evidence = f"{_pct(flat)} of groups had one reward for all their episodes {h.span} " \
        f"(reward/mean {reward:.2f}" + ("" if success is None else
                                        f", reward/success {success:.2f}") + ")"  # fmt: skip
    tells_apart = "`agentgym check ENV` warns on that: 'reward of wrong answers'"
    if reward <= NOTHING and (success is None or success <= NOTHING):
        warmed = len((h.warm_start or {}).get("history") or ())  # the run's warm start, if any
        warm_start = (f"a longer or stronger warm start (it ran {warmed} SFT steps: raise "
                      "sft_steps or sft_learning_rate)" if warmed else
                      "an SFT warm start (sft_steps: 200)")  # fmt: skip
        return Finding("flat-groups", "nothing succeeds, so nothing is learned", evidence,
                       "sample with a higher --temperature, or warm start the model "
                       "(`agentgym sft`, or sft_steps in the run) or choose easier tasks "
                       "before training on them" if h.batch else
                       f"start from a model that sometimes succeeds: {warm_start}, easier "
                       "train_tasks, more num_generations, or a higher temperature (a "
                       "near-greedy policy plays one failure G times)")  # fmt: skip
    if success is not None and success >= EVERYTHING:  # in an eval: the model is good
        return None if h.batch else Finding(
            "flat-groups", "every episode succeeds: the train tasks are solved", evidence,
            "harder train_tasks, or stop here (agentgym export RUN OUT --best)")  # fmt: skip
    if spread is not None and spread <= 1e-9:
        return Finding("flat-groups", "every episode is paid the same",
                       f"{evidence}, reward/std 0", "the reward does not tell episodes apart: if "
                       "it pays what does not solve the task, it does not check the outcome "
                       f"({tells_apart})")  # fmt: skip
    if success is not None and success <= NOTHING:  # paid, not solved
        return Finding("flat-groups", "episodes are paid alike, yet none succeeds", evidence,
                       "if the reward pays episodes that do not solve the task, it does not "
                       f"check the outcome ({tells_apart}); a rubric whose best score is under "
                       "1.0 never counts a success")  # fmt: skip
    return Finding("flat-groups", "most groups score all their episodes alike", evidence,
                   "sample with a higher --temperature or --group-size, so a task's episodes "
                   "differ" if h.batch else
                   "raise temperature or num_generations so a group's episodes differ, or "
                   "resample_zero_variance_groups: true")  # fmt: skip


def skipped_updates(h: History) -> Finding | None:
    """Updates the trainer skipped because their gradient was NaN or inf (any step, ever)."""
    skipped = [v for v in h.values("train/skipped_updates") if v > 0]
    if not skipped:
        return None
    return Finding("skipped-updates", "updates were skipped: their gradient was not finite",
                   f"{len(skipped)} of {len(h.steps)} steps skipped an update (NaN or inf "
                   "gradient; the adapter kept its weights)",
                   "lower learning_rate or set max_grad_norm; a bfloat16 or float16 overflow "
                   "is the usual cause (dtype: float32 rules it out)")  # fmt: skip


def no_tool_calls(h: History) -> Finding | None:
    """A tool env whose model never calls a tool: usually a parser or template mismatch."""
    calls, turns = h.values("rollout/tool_calls_per_episode"), h.values("rollout/turns_per_episode")
    if not calls or any(calls) or not turns or max(turns) > 1.0:
        return None
    return Finding("no-tool-calls", "the model never called a tool",
                   "0 tool calls and 1 turn per episode "
                   + (h.span if h.batch else f"in all {len(calls)} steps"),
                   "if the tasks need a tool, run `agentgym check ENV --model MODEL` (the env's "
                   "parser must read the calls the chat template writes); a model that never "
                   "saw the tool format needs a warm start (`agentgym sft`); one that calls only "
                   "now and then, a --temperature that samples it" if h.batch else
                   "if the tasks need a tool, run `agentgym check ENV --model MODEL` (the env's "
                   "parser must read the calls the chat template writes), then warm start "
                   "(sft_steps) on the env's scripted turns; a model that calls only now and "
                   "then needs a temperature that samples it")  # fmt: skip


def _recent_at_least(
    rule: str,
    key: str,
    threshold: float,
    title: str,
    evidence: Callable[[float, str], str],
    fix: str,
    eval_fix: str | None = None,
) -> Callable[[History], Finding | None]:
    """A rule that fires when the recent mean of ``key`` reaches ``threshold``.

    ``evidence(value, span)``: the figures, ``span`` saying where they come from. ``eval_fix``:
    the fix in ``agentgym eval``'s terms, for a rule that judges an eval too (`EPISODE_RULES`).
    """

    def check(h: History) -> Finding | None:
        value = h.recent(key)
        if value is None or value < threshold:
            return None
        return Finding(rule, title, evidence(value, h.span), eval_fix if h.batch and eval_fix
                       else fix)  # fmt: skip

    check.__name__ = rule.replace("-", "_")
    return check


def _of_episodes(what: str) -> Callable[[float, str], str]:
    return lambda share, span: f"{_pct(share)} of episodes {what} {span}"


tool_errors = _recent_at_least(
    "tool-errors", "rollout/tool_error_rate", TOOL_ERRORS, "many tool calls fail",
    lambda rate, span: f"{_pct(rate)} of tool calls were errors {span} (malformed calls, "
    "unknown tools, arguments the schema refuses)",
    "read them: `agentgym runs episodes RUN --tool-errors`; `agentgym check ENV --model MODEL` "
    "tests the parser against the template",
    "read them: `agentgym runs episodes OUT --tool-errors`; `agentgym check ENV --model MODEL` "
    "tests the parser against the template",
)
turns_cut = _recent_at_least(
    "turns-cut", "rollout/frac_turns_cut", TURNS_CUT, "turns hit the token limit",
    lambda share, span: f"{_pct(share)} of turns ended at the token limit {span} (a tool "
    "call cut there is a malformed call)",
    "raise max_completion_length (and max_model_len with it); read the cut turns with "
    "`agentgym runs episodes RUN --turns-cut` (training ones: log_completions, then "
    "RUN/rollouts.jsonl)",
    "raise --max-tokens (and --max-model-len with it); read the cut turns with "
    "`agentgym runs episodes OUT --turns-cut`",
)
tool_results_cut = _recent_at_least(
    "tool-results-cut", "rollout/frac_tool_results_cut", TOOL_RESULTS_CUT,
    "tool results are cut before the model reads them",
    lambda share, span: f"{_pct(share)} of tool results were longer than the env's "
    f"max_tool_result_chars {span}; the model read only their start",
    "read them: `agentgym runs episodes RUN --results-cut`; have the tool return less (a "
    "page, a count, the lines that matter), or raise max_tool_result_chars in env_kwargs (and "
    "max_model_len with it)",
    "read them: `agentgym runs episodes OUT --results-cut`; have the tool return less (a "
    "page, a count, the lines that matter), or raise it with --env-arg "
    "max_tool_result_chars=N (and --max-model-len with it)",
)
truncated = _recent_at_least(
    "truncated", "rollout/frac_truncated", TRUNCATED, "episodes run out of room",
    _of_episodes("were truncated (a turn, token or context budget)"),
    "raise max_completion_length, max_episode_tokens or max_turns (and max_model_len), or keep "
    "truncated episodes out of the loss (mask_truncated_completions: true)",
    "raise --max-tokens, --max-model-len or the env's turns (--env-arg max_turns=N); read "
    "them: `agentgym runs episodes OUT --status truncated`",
)
infra_errors = _recent_at_least(
    "infra-errors", "rollout/frac_infra_error", INFRA_ERRORS,
    "episodes are lost to infrastructure", _of_episodes("ended as infra_error (dropped from "
    "training)"),
    "read why: `agentgym runs episodes RUN --status infra_error`; a sandbox or service that "
    "fails under load wants a smaller max_concurrency",
    "read why: `agentgym runs episodes OUT --status infra_error`; a sandbox or server that "
    "fails under load wants a lower --concurrency; `agentgym eval ... --resume` plays them again",
)
late = _recent_at_least(
    "late", "rollout/frac_late", LATE, "episodes miss the step's deadline",
    _of_episodes("were late (the late_policy dropped or kept them)"),
    "raise episode_deadline_s, or lower max_completion_length or the tools' timeouts",
)
errors = _recent_at_least(
    "errors", "rollout/frac_error", ERRORS, "episodes end in an error",
    _of_episodes("ended with status error (a reward function or the env raised)"),
    "read the tracebacks: `agentgym runs episodes RUN --status error`",
    "read the tracebacks: `agentgym runs episodes OUT --status error`",
)
drift = _recent_at_least(
    "logprob-drift", "sampling/logprob_drift_mean", DRIFT,
    "the engine and the trainer disagree on the tokens",
    lambda mean, span: f"mean |engine - trainer| logprob {mean:.3f} nats per token {span} "
    f"(ratio about {math.exp(mean):.2f}x)",
    "run both in one dtype (dtype: float32 or bfloat16 on both sides), keep max_staleness at 0; "
    "importance correction (on) reweights, but large drift trains off-policy",
)
clipping = _recent_at_least(
    "clipping", "loss/clip_ratio_region", CLIPPED, "updates are too large",
    lambda share, span: f"{_pct(share)} of tokens clipped (ratio outside [1 - epsilon, 1 + "
    f"epsilon_high]) {span}",
    "lower learning_rate or num_iterations",
)
kl = _recent_at_least(
    "kl", "loss/kl", KL, "the policy is far from the base model",
    lambda value, span: f"KL {value:.2f} nats per token {span}",
    "lower learning_rate or raise beta",
)


@dataclass(frozen=True)
class _EntropyMove:
    """Entropy and success over the first steps and the recent ones."""

    start: float
    now: float
    key: str
    first: float
    last: float

    def evidence(self) -> str:
        return (f"entropy {self.start:.3f} -> {self.now:.3f} while {self.key} went "
                f"{self.first:.2f} -> {self.last:.2f}")  # fmt: skip


def _entropy_move(h: History) -> _EntropyMove | None:
    """How entropy moved while the reward did not rise; None if it rose (or too few steps)."""
    key = h.success_key()
    start, now, first, last = h.early("loss/entropy"), h.recent("loss/entropy"), h.early(key), \
        h.recent(key)  # fmt: skip
    if start is None or now is None or first is None or last is None or start <= 0:
        return None
    if len(h.steps) < 2 * MIN_STEPS or last - first >= MOVED:
        return None  # converging on what works: fine
    return _EntropyMove(start, now, key, first, last)


def entropy_collapse(h: History) -> Finding | None:
    """Entropy fell most of the way to zero and the reward did not rise with it."""
    move = _entropy_move(h)
    if move is None or move.now > ENTROPY_LEFT * move.start:
        return None
    return Finding("entropy-collapse", "the policy stopped exploring", move.evidence(),
                   "lower learning_rate, raise temperature, or add an entropy bonus "
                   "(entropy_coef)")  # fmt: skip


def entropy_rises(h: History) -> Finding | None:
    """Entropy grew to several times its start and the reward did not rise with it."""
    move = _entropy_move(h)
    if move is None or move.now < ENTROPY_GROWN * move.start:
        return None
    return Finding("entropy-rises", "the policy is coming apart", move.evidence(),
                   "lower learning_rate (the quickstart's is 1e-3) or max_grad_norm; export an "
                   "earlier checkpoint (agentgym export RUN OUT --step N)")  # fmt: skip


def reward_falls(h: History) -> Finding | None:
    key = h.success_key()
    first, last = h.early(key), h.recent(key)
    if first is None or last is None or len(h.steps) < 2 * MIN_STEPS or first - last < MOVED:
        return None
    return Finding("reward-falls", "the training reward fell",
                   f"{key} {first:.2f} over the first steps -> {last:.2f} over the recent ones",
                   "lower learning_rate; keep the best checkpoint (agentgym export RUN OUT "
                   "--best)")  # fmt: skip


def reward_parts_diverge(h: History) -> Finding | None:
    """One reward function climbs while another stays put: the policy may be gaming it."""
    names = sorted({k for r in h.steps for k in r if k.startswith("reward/") and
                    k.endswith("/mean") and k != "reward/mean"})  # fmt: skip
    moves = {}
    for key in names:
        first, last = h.early(key), h.recent(key)
        if first is not None and last is not None and len(h.steps) >= 2 * MIN_STEPS:
            moves[key.removeprefix("reward/").removesuffix("/mean")] = (first, last)
    risers = [n for n, (a, b) in moves.items() if b - a >= 2 * MOVED]
    stuck = [n for n, (a, b) in moves.items() if b - a < MOVED / 5]
    if not risers or not stuck:
        return None
    rise, flat = risers[0], stuck[0]
    return Finding("reward-parts-diverge", f"{rise} rises, {flat} does not",
                   f"{rise} {moves[rise][0]:.2f} -> {moves[rise][1]:.2f}, {flat} "
                   f"{moves[flat][0]:.2f} -> {moves[flat][1]:.2f}",
                   f"read high-reward episodes (`agentgym runs episodes RUN --min-reward X`): "
                   f"if {rise} pays (a weight above 0 in the env's Rubric) without the task "
                   "being done, the policy games it: lower its weight")  # fmt: skip


def worse_than_start(h: History) -> Finding | None:
    """The seeds' "worse than the SFT baseline": held-out success ended below where it began."""
    start_key = "sft/success" if "sft/success" in h.figures else "base/success"
    start, end = h.figures.get(start_key), h.figures.get("grpo/success")
    if start is None or end is None or start - end < WORSE:
        return None
    label = "the warm start's" if start_key == "sft/success" else "the base model's"
    return Finding("worse-than-start", f"held-out success ended below {label}",
                   f"{start_key} {_pct(start)} -> grpo/success {_pct(end)}",
                   "export the best checkpoint (agentgym export RUN OUT --best); then lower "
                   "learning_rate or max_steps")  # fmt: skip


def warm_start_short(h: History) -> Finding | None:
    """The warm start used every step it was given, its skills still under its target.

    Why: GRPO refines the skills the warm start taught; it rarely adds ones it did not (the
    quickstart's GRPO success tracks the share of validation traces its warm start carried
    out), so a run that ends short may have started short.
    """
    sft: Mapping[str, Any] = h.warm_start or {}
    config: Mapping[str, Any] = sft.get("config") or {}
    history: list[Any] = sft.get("history") or []
    target, cap = _number(config.get("target_accuracy")), _number(config.get("steps"))
    measured = [float(r["reference_accuracy"]) for r in history
                if _finite(r.get("reference_accuracy"))]  # fmt: skip
    if target is None or cap is None or not measured or measured[-1] >= target \
            or len(history) < cap:  # it reached the target, or stopped before its cap
        return None
    return Finding("warm-start-short", "the warm start stopped short of its target",
                   f"all {len(history)} SFT steps run, validation traces carried out "
                   f"{_pct(measured[-1])} (target {_pct(target)})",
                   "raise sft_steps or sft_learning_rate, or give it more sft_num_traces "
                   "(agentgym sft: --steps, --lr, more --tasks or recorded episodes); what GRPO "
                   "reaches is bounded by the skills the warm start taught")  # fmt: skip


def train_up_eval_flat(h: History) -> Finding | None:
    """Training success rose before the latest eval; held-out success did not follow.

    Judged at the latest eval after step 0, on the training steps up to it: an eval lags the
    training figures it is compared with, so a gain made after it says nothing yet.
    """
    key = h.success_key()
    if len(h.evals) < 2 or h.evals[0][0] != 0:
        return None
    (_, start), (at, _) = h.evals[0], h.evals[-1]
    before = [float(r[key]) for r in h.steps if r["step"] <= at and _finite(r.get(key))]
    window = max(MIN_STEPS, math.ceil(len(before) / 3))
    if len(before) < 2 * MIN_STEPS:
        return None
    first, last = _mean(before[:window]), _mean(before[-window:])
    best = max(v for _, v in h.evals[1:])
    if first is None or last is None or last - first < 2 * MOVED or best - start >= MOVED / 5:
        return None
    return Finding("train-up-eval-flat", "the gain does not reach held-out tasks",
                   f"{key} {first:.2f} -> {last:.2f} in training up to step {at}; eval/success "
                   f"{_pct(start)} at step 0, at most {_pct(best)} after",
                   "read eval episodes (`agentgym runs episodes RUN`): a reward paid without "
                   "the task done is being gamed; few train_tasks are being memorised")  # fmt: skip


#: Every rule, in the order a reader should act on them (the root causes first).
RULES: tuple[Callable[[History], Finding | None], ...] = (
    infra_errors, errors, skipped_updates, no_tool_calls, turns_cut, tool_errors,
    tool_results_cut, truncated, late, flat_groups, drift, clipping, kl, entropy_collapse,
    entropy_rises, reward_falls, reward_parts_diverge, warm_start_short, train_up_eval_flat,
    worse_than_start,
)  # fmt: skip


#: The rules that read the warm start alone: it ended before the first step, so they are
#: judged from then on (and on an ``agentgym sft`` run of its own, which has no steps).
WARM_START_RULES: tuple[Callable[[History], Finding | None], ...] = (warm_start_short,)

#: The rules judged before `MIN_STEPS` steps when every episode so far failed (`History.failed`):
#: a run of 2 steps of errors read "no known problem in the metrics", where the trainer stops
#: at the third (`EpisodesFailedError`).
FAILURE_RULES: tuple[Callable[[History], Finding | None], ...] = (infra_errors, errors, late)


def diagnose(
    rows: Sequence[Mapping[str, Any]],
    figures: Mapping[str, float] | None = None,
    warm_start: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """The findings a run's metrics rows (headline figures, warm start) match, in `RULES` order.

    Rules that read steps wait for `MIN_STEPS` of them; `WARM_START_RULES` do not, nor do
    `FAILURE_RULES` while every episode failed.
    """
    history = History(rows, figures, warm_start=warm_start)
    early = (FAILURE_RULES if history.failed else ()) + WARM_START_RULES
    found = [rule(history) for rule in (RULES if history.judged else early)]
    return [f for f in found if f is not None]


class HealthWatch:
    """Findings as they appear during a run, each rule reported once.

    The trainer feeds it every step's metrics; what it returns is new since the last call.
    A resumed run feeds it the rows the killed one wrote first, so what was reported before
    the kill is reported again once (the console that showed it is gone).
    """

    def __init__(
        self, rows: Sequence[Mapping[str, Any]] = (), warm_start: Mapping[str, Any] | None = None
    ) -> None:
        self.rows = list(rows)
        self.warm_start = warm_start
        self.reported: set[str] = set()
        self.broken = False

    def see(self, step: int, metrics: Mapping[str, Any]) -> list[Finding]:
        """The findings that step ``step``'s ``metrics`` (its metrics.jsonl row) make new.

        A rule that raises is logged once and the watch goes quiet: it advises, and must never
        end the run it watches. Each check reads the whole history, so past `WATCH_CHECKS`
        steps it checks every (step // `WATCH_CHECKS`)-th step only: a finding shows at most
        2% of the run late, and the watch's cost stays flat (13 ms a step at step 1,000 when it
        checked every step); the summary reads every row anyway.
        """
        self.rows.append({"step": step, **metrics})
        if self.broken or step % max(1, step // WATCH_CHECKS) != 0:
            return []
        try:
            found = diagnose(self.rows, warm_start=self.warm_start)
        except Exception:  # a bug in a rule: the run goes on without its advice
            log.exception("the health watch stopped at step %d (the run goes on)", step)
            self.broken = True
            return []
        new = [f for f in found if f.rule not in self.reported]
        self.reported.update(f.rule for f in new)
        return new


def format_findings(findings: Sequence[Finding]) -> list[str]:
    """The summary's lines: one finding a line pair, or a line saying none matched."""
    if not findings:
        return ["  health            no known problem in the metrics (docs/troubleshooting.md)"]
    lines = ["  health            see docs/troubleshooting.md#<rule>"]
    for f in findings:
        lines += [f"    [{f.rule}] {f.title}: {f.evidence}", f"      fix: {f.fix}"]
    return lines


# ---- one batch of episodes: an eval ---------------------------------------------------------

#: The rules that read what episodes did, not how training moved: they judge an eval too, with
#: their fixes in its options (``late`` needs a deadline, which an eval does not set;
#: ``flat-groups`` needs an eval with several episodes a task).
EPISODE_RULES: tuple[Callable[[History], Finding | None], ...] = (
    infra_errors, errors, no_tool_calls, turns_cut, tool_errors, tool_results_cut, truncated,
    flat_groups,
)


def diagnose_episodes(trajectories: Sequence[Trajectory]) -> list[Finding]:
    """The findings one batch of episodes matches (an eval's: ``agentgym eval``, ``runs doctor``).

    Why: an eval that scores 0% has the same handful of causes a flat training run has (no
    call parsed, calls cut at the token limit, a sandbox down); the rules that read episodes
    name them, with the fix in the eval's own options. Judged on all the episodes at once;
    with several episodes a task, how many tasks' episodes all scored alike too: a run from
    this model on these tasks would learn nothing from those (``--group-size`` G, a check
    before training).
    """
    from agentgym._summary import one_reward_share

    from ._metrics import episode_metrics

    if not trajectories:
        return []
    row = episode_metrics(trajectories)
    flat = one_reward_share(trajectories)  # only with several episodes a task
    history = History([row | ({} if flat is None else {ONE_REWARD_KEY: flat})], batch=True)
    found = [rule(history) for rule in EPISODE_RULES]
    return [f for f in found if f is not None]


