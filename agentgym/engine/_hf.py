"""`HFPolicy`: transformers `generate` behind the same token-in/token-out contract as vLLM.

For machines without vLLM (the trainer's ``rollout_engine: hf``), and as the oracle for
vLLM's numbers in tests: `token_logprobs` scores given tokens with a plain forward pass, the
way a trainer does.

Turns that episodes ask for while a batch runs are sampled together in the next one (left
padded, one `generate` call): with G episodes per task that is most of the speed a GPU gives.
LoRA versions load from adapter folders (`load_adapter`), as into vLLM, so a trainer checks
the served version the same way on both engines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._deadline import episode_deadline_at
from .._errors import ConfigError, ModelError
from .._types import Completion
from ._episode import (
    AdapterVersion,
    ModeChoice,
    SamplingConfig,
    TokenPolicy,
    next_adapter_version,
)
from ._model_dir import check_adapter_base, context_length, model_source
from ._render import ChatRenderer, policy_renderer

log = logging.getLogger(__name__)


@dataclass
class _Turn:
    """One queued turn: what to sample, and where the caller waits for it."""

    prompt_ids: list[int]
    max_tokens: int
    seed: int | None
    sampling: SamplingConfig
    session: str | None
    future: asyncio.Future[Completion] = field(repr=False)
    deadline_at: float | None = None  # the episode's (loop time): its batch stops there


@dataclass
class _LoopTurns:
    """One event loop's turns (a future is only ever resolved on the thread of its loop)."""

    queue: list[_Turn] = field(default_factory=list)  # waiting for a batch
    drainer: asyncio.Task[None] | None = None  # the task sampling them
    live: set[str] = field(default_factory=set)  # sessions that asked for a turn, not ended
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # a turn came, or an end


class HFPolicy(TokenPolicy):
    """A `Policy` sampling with `transformers` (queued turns batched).

    Args:
        model: a local model folder.
        sampling: a `SamplingConfig` or a dict of its fields (``min_p`` is not supported).
        adapter: a PEFT adapter folder to apply on top of the model (version 1, which its
            turns record, as a first `load_adapter`), or None.
        device: ``"cpu"``, ``"cuda"`` ...
        dtype: torch dtype name for the weights (``"float32"`` for exact comparisons).
        max_model_len: context window; a longer prompt ends the episode as ``truncated``.
            None: 4096, or the model's positions if fewer (`context_length`).
        chat_template_kwargs: extra chat-template variables.
        rollout_mode: see `TokenPolicy`.
        max_batch_size: most turns sampled in one `generate` call. Each seeded turn draws
            from a generator of its own (`_SeededRows`), so it repeats in any batch (up to the
            float noise a batch's padding adds to the logits).
        straggler_wait: how long a batch may wait for live episodes that are still running
            a tool, as a fraction of the last batch's time (0 waits for none). A turn that
            misses a batch costs a `generate` call of its own, about a whole batch's time;
            see `_await_stragglers`.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        sampling: SamplingConfig | dict[str, Any] | None = None,
        adapter: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        rollout_mode: ModeChoice = "auto",
        max_batch_size: int = 64,
        straggler_wait: float = 0.1,
    ) -> None:
        super().__init__(sampling, rollout_mode)  # its sampling checked by _check_sampling
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not 0 <= straggler_wait <= 1:
            raise ConfigError(f"straggler_wait must be in [0, 1], got {straggler_wait}")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                f"HFPolicy needs transformers: pip install 'agentgym[train]' ({exc})"
            ) from exc
        self.max_batch_size = max_batch_size
        self.straggler_wait = straggler_wait
        self._last_batch_seconds = 0.0
        model = model_source(model)
        self.max_model_len = context_length(model, max_model_len)
        if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ConfigError(
                f"dtype must name a torch dtype ('float32', 'bfloat16', 'float16'), got {dtype!r}"
            )
        self._model_source = model
        tokenizer = AutoTokenizer.from_pretrained(model)
        self._renderer = policy_renderer(tokenizer, chat_template_kwargs)
        local = adapter is not None and (
            os.fspath(adapter).startswith(("/", ".", "~")) or Path(adapter).exists()
        )  # else a hub id, PEFT's to fetch
        if adapter is not None and local:  # before the weights load
            next_adapter_version(Path(adapter).expanduser(), 0, None)  # a PEFT folder
            check_adapter_base(Path(adapter).expanduser(), model)
        net: Any = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
        net.generation_config = _bare_generation_config(net.generation_config)
        if adapter is not None and not local:
            from peft import PeftModel

            net = PeftModel.from_pretrained(net, str(adapter))
        self.model = net.to(device).eval()
        self.device = device
        #: Loaded LoRA versions (the last one serves; 0 is the model as given).
        self.adapters: list[AdapterVersion] = []
        self.adapter_version = 0
        self._lock = threading.Lock()  # one forward pass at a time; torch uses every core
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTurns]
        self._loops = weakref.WeakKeyDictionary()
        if adapter is not None:  # version 1, as a first `load_adapter` (its turns said 0: base)
            if local:
                self.load_adapter(Path(adapter).expanduser())
            else:
                self.adapters = [AdapterVersion(1, "default", str(adapter), 0.0)]
                self.adapter_version = 1

    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer."""
        return self._renderer

    def _check_sampling(self, sampling: SamplingConfig) -> None:
        """Refuse what `generate` would ignore: ``min_p`` and vLLM's ``extra`` fields.

        Checked for the policy's own sampling and for every `with_sampling` view: a view
        with ``min_p`` used to sample without it, silently.
        """
        if sampling.min_p or sampling.extra:
            raise ConfigError(
                "HFPolicy supports neither min_p nor extra vLLM sampling fields; "
                "drop them or use VLLMPolicy"
            )

    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        """Sample one turn from exact prompt ids, batched with the turns queued beside it."""
        s = sampling or self.sampling
        self._check_sampling(s)
        limit = self.turn_limit(prompt_ids, max_tokens, s)
        loop = asyncio.get_running_loop()
        turn = _Turn(list(prompt_ids), limit, seed, s, session, loop.create_future(),
                     episode_deadline_at())  # fmt: skip
        turns = self._loops.setdefault(loop, _LoopTurns())
        turns.queue.append(turn)
        if session is not None:
            turns.live.add(session)
        turns.changed.set()
        if turns.drainer is None or turns.drainer.done():
            turns.drainer = loop.create_task(self._drain(turns))
        return await turn.future

    async def end_session(self, session: str) -> None:
        """The episode ended: a batch no longer waits for its next turn."""
        turns = self._loops.get(asyncio.get_running_loop())
        if turns is not None:
            turns.live.discard(session)
            turns.changed.set()

    async def _drain(self, turns: _LoopTurns) -> None:
        """Sample a loop's queued turns in batches until none is left (one task per loop).

        `generate` runs on the loop's own thread, blocking it for the batch: torch called
        from a worker thread ran 2.2x slower on the CPU here and 5x slower on an H200 machine
        (docs/engine.md), and one model samples one batch at a time anyway. Tools running in
        threads or sandboxes go on; their episodes resume after the batch (and a tool timeout
        counts the batch's time: the loop's clock runs on).
        """
        queue = turns.queue
        try:
            while queue:
                await asyncio.sleep(0)  # the turns other episodes ask for in this tick join in
                await self._await_stragglers(turns)
                batch = self._next_batch(queue)
                if not batch:  # every queued turn's episode was cancelled
                    break
                started = time.perf_counter()
                try:
                    results = self._sample_batch(batch, _seconds_left(batch))
                except Exception as exc:  # out of memory, a driver error: never the model's
                    for turn in batch:
                        failure = ModelError(f"transformers generate failed: {exc!r}")
                        turn.future.set_exception(failure.with_traceback(exc.__traceback__))
                    continue
                self._last_batch_seconds = time.perf_counter() - started
                for turn, completion in zip(batch, results):
                    if _seconds_left([turn]) == 0:
                        continue  # late: its rollout's clock cancels the episode (a cut turn)
                    turn.future.set_result(completion)
        except asyncio.CancelledError:  # the loop is shutting down: no turn waits forever
            for turn in queue:
                turn.future.cancel()
            raise

    async def _await_stragglers(self, turns: _LoopTurns) -> None:
        """Wait, briefly, for live episodes without a queued turn (running a tool) to ask.

        Why: the G episodes of a task usually finish their tools within a millisecond of
        each other, a few event-loop ticks apart. Sampled at once, the early ones go in one
        batch and the rest in a second `generate` call that costs about as long again (in
        the trainer bench, 2 of 5 steps' tool turns came as 4 + 3 and 6 + 1 rows; with the
        wait every step's were one batch: docs/figures.md, "the straggler wait"). The wait
        ends as soon as every live episode has a turn queued (or has ended), the batch is
        full, or ``straggler_wait`` x the last batch's time has passed, so a slow tool
        costs the others at most that fraction of a batch. Episodes are known by their
        ``session`` (every `TokenEpisode` passes one); a caller passing none is not waited for.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.straggler_wait * self._last_batch_seconds
        while len(turns.queue) < self.max_batch_size:
            queued = {t.session for t in turns.queue if not t.future.done()}
            remaining = deadline - loop.time()
            if turns.live <= queued or remaining <= 0:
                return
            turns.changed.clear()
            try:
                await asyncio.wait_for(turns.changed.wait(), remaining)
            except TimeoutError:
                return

    def _next_batch(self, queue: list[_Turn]) -> list[_Turn]:
        """Take the oldest live turn of ``queue`` and those after it with the same sampling.

        Turns with stop strings go alone: `generate` pads a row that stops on one, and only
        a stop token marks where a row of a batch ended.
        """
        queue[:] = [t for t in queue if not t.future.done()]  # their episodes were cancelled
        if not queue:
            return []
        first = queue[0]
        if first.sampling.stop:
            batch = [first]
        else:
            batch = [t for t in queue if t.sampling == first.sampling][: self.max_batch_size]
        queue[:] = [t for t in queue if t not in batch]
        return batch

    def _sample_batch(self, batch: list[_Turn], max_time: float | None) -> list[Completion]:
        """One `generate` call for ``batch`` (left padded); each row cut at its stop or limit.

        ``max_time`` (seconds) stops the whole batch early: its episodes' deadline.
        """
        import torch

        tokenizer = self._renderer.tokenizer
        s, stops = batch[0].sampling, self._renderer.stop_token_ids
        width = max(len(t.prompt_ids) for t in batch)
        limit = max(t.max_tokens for t in batch)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        rows = [[pad] * (width - len(t.prompt_ids)) + t.prompt_ids for t in batch]
        mask = [[0] * (width - len(t.prompt_ids)) + [1] * len(t.prompt_ids) for t in batch]
        greedy = s.temperature == 0
        sampler = None if greedy else _SeededRows([t.seed for t in batch], s, self.device)
        options: dict[str, Any] = {
            "max_new_tokens": limit,
            "do_sample": False,  # greedy over what `_SeededRows` leaves: the token it drew
            "output_scores": greedy,
            "return_dict_in_generate": True,
            "pad_token_id": pad,
            "eos_token_id": sorted(stops) or None,
            "max_time": max_time,
        }
        if sampler is not None:
            from transformers import LogitsProcessorList

            options["logits_processor"] = LogitsProcessorList([sampler])
        if s.stop:
            options |= {"stop_strings": list(s.stop), "tokenizer": tokenizer}
        with self._lock, torch.no_grad():
            inputs = torch.tensor(rows, device=self.device)
            attention = torch.tensor(mask, device=self.device)
            out = self.model.generate(inputs, attention_mask=attention, **options)
            version = self.adapter_version
            new = out.sequences[:, width:]
            picked = sampler.picked if sampler is not None else [
                torch.log_softmax(step.float(), -1).gather(-1, new[:, k : k + 1])[:, 0]
                for k, step in enumerate(out.scores)
            ]  # fmt: skip
            logprobs = torch.stack(picked, 1).tolist() if picked else [[] for _ in batch]
        return [
            self._completion(turn, new[row].tolist(), logprobs[row], version)
            for row, turn in enumerate(batch)
        ]

    def _completion(
        self, turn: _Turn, ids: list[int], logprobs: list[float], version: int
    ) -> Completion:
        """A row of a batch as one turn: cut after its first stop token or at its own limit."""
        stops = self._renderer.stop_token_ids
        end = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
        end = min(end, turn.max_tokens)
        ids = ids[:end]
        stopped = bool(ids) and ids[-1] in stops
        text = self._renderer.tokenizer.decode(ids, skip_special_tokens=False)
        return Completion(
            text=self._renderer.visible_text(text, ids),
            prompt_ids=turn.prompt_ids,
            completion_ids=ids,
            logprobs=logprobs[:end],
            finish_reason="stop" if stopped or len(ids) < turn.max_tokens else "length",
            adapter_version=version,
        )

    # ---- LoRA versions ------------------------------------------------------------------
    def load_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Load a PEFT adapter folder as a new version; later turns sample with it.

        The same contract as `VLLMPolicy.load_adapter` (a version above every earlier one,
        timed in ``adapters[-1].load_seconds``). The model holds one adapter: turns are
        sampled one batch at a time, so no turn still uses the old one. An adapter on the
        loaded one's layers (or fewer) is copied into its slot with PEFT's `hotswap_adapter`
        rather than added beside it and the old one deleted: a trainer syncs every step, and
        the copy took its sync from 0.04 to 0.01 s (``bench/trainer_bench.py --engine hf``);
        any other adapter is added that way.
        """
        from peft import PeftModel

        last = self.adapters[-1].version if self.adapters else 0
        version = next_adapter_version(path, last, version)
        check_adapter_base(path, self._model_source)  # PEFT fails halfway through, model changed
        with self._lock:
            started = time.perf_counter()
            if isinstance(self.model, PeftModel):
                name = self._swap_or_add(path, f"agentgym-v{version}")
            else:
                name = f"agentgym-v{version}"
                self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
            self.model.eval()
            self.adapters = [
                AdapterVersion(version, name, str(Path(path)), time.perf_counter() - started)
            ]
            self.adapter_version = version
        return version

    def _swap_or_add(self, path: str | os.PathLike[str], new_name: str) -> str:
        """Serve ``path``'s adapter; returns its name (the slot's if copied in, else ``new_name``).

        PEFT refuses a copy it cannot make exact (layers the slot lacks, another dropout,
        DoRA); the adapter is then added anew and the slot deleted, so a slot it
        refused halfway is never served.
        """
        from peft.utils.hotswap import hotswap_adapter

        (slot,) = self.model.peft_config
        try:
            hotswap_adapter(self.model, str(path), adapter_name=slot, torch_device=self.device)
            return str(slot)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            log.info("adapter at %s does not fit the loaded one's slot (%s): adding it", path, exc)
        self.model.load_adapter(str(path), adapter_name=new_name)
        self.model.set_adapter(new_name)
        self.model.delete_adapter(slot)
        return new_name

    async def aload_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """`load_adapter` from async code (on the loop's thread, as sampling is)."""
        return self.load_adapter(path, version)

    async def served_adapters(self) -> set[int]:
        """Versions whose weights the model holds now (to check a sync really happened)."""
        loaded = set(getattr(self.model, "peft_config", {}))
        return {a.version for a in self.adapters if a.name in loaded}

    def token_logprobs(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Log-probabilities of ``completion_ids`` after ``prompt_ids`` at ``temperature``.

        One forward pass over the whole sequence, as a trainer computes them: the reference
        for what a sampling engine reports.
        """
        import torch

        ids = torch.tensor([prompt_ids + completion_ids], device=self.device)
        with self._lock, torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits / temperature, -1)
        return logp.gather(-1, torch.tensor(completion_ids, device=self.device)[:, None])[
            :, 0
        ].tolist()


def _seconds_left(batch: list[_Turn]) -> float | None:
    """Seconds to the last of ``batch``'s episode deadlines (0 if past); None: a turn has none."""
    deadlines = [turn.deadline_at for turn in batch if turn.deadline_at is not None]
    if not batch or len(deadlines) < len(batch):
        return None
    return max(0.0, max(deadlines) - asyncio.get_running_loop().time())


class _SeededRows:
    """Draws each row's next token from the row's own generator, as ``generate`` would draw it.

    Why: ``generate`` draws every row from torch's one generator, seeded once per batch (by
    its first turn's seed), so a seeded turn repeated only in the same batch: an eval resumed
    after Ctrl-C sampled other episodes than the seeds it recorded (3 of 120), and other
    batching (a torn last line resumed) 67 of 120. Here a turn's seed seeds its row alone;
    ``generate`` runs greedy over what this returns (the drawn token, every other at -inf).
    The distribution is ``generate``'s: temperature, then top-k, then top-p, with its warpers;
    ``picked`` keeps each step's logprobs of the drawn tokens under it (processed logprobs,
    as vLLM reports them). A row without a seed draws from torch's generator.
    """

    def __init__(self, seeds: list[int | None], sampling: SamplingConfig, device: str) -> None:
        import torch
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers: list[Any] = []
        if sampling.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k > 0:  # 0 and -1 both mean no top-k
            self.warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(sampling.top_p))
        self.generators = [
            None if seed is None else torch.Generator(device=device).manual_seed(seed)
            for seed in seeds
        ]
        #: Per generated step, the logprob of each row's drawn token.
        self.picked: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for warp in self.warpers:
            scores = warp(input_ids, scores)
        logprobs = torch.log_softmax(scores.float(), -1)
        probs = logprobs.exp()
        drawn = torch.cat([torch.multinomial(probs[row], 1, generator=generator)
                           for row, generator in enumerate(self.generators)])  # fmt: skip
        self.picked.append(logprobs.gather(-1, drawn[:, None])[:, 0])
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(-1, drawn[:, None], 0.0)


def _bare_generation_config(loaded: Any) -> Any:
    """The model folder's generation config without its sampling defaults (token ids kept).

    Why: `generate` fills every knob a call leaves unset from ``generation_config.json``, so
    a ``repetition_penalty`` or ``no_repeat_ngram_size`` shipped there (Qwen2.5-Instruct has
    ``repetition_penalty: 1.05``) would change the distribution sampled, which `SamplingConfig`
    does not name, vLLM does not apply, and the trainer's forward pass cannot reproduce.
    """
    from transformers import GenerationConfig

    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    return GenerationConfig(**{k: getattr(loaded, k, None) for k in ids})
