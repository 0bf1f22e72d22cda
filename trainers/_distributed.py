"""Several training processes under torchrun: which one this is, and the collectives the loop uses.

`World.from_env` reads what torchrun gives each process (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Plain ``agentgym train`` is a world of one
whose collectives return their input, so the training loop reads the same for one process or
many, and one process never touches `torch.distributed`.

Why `torch.distributed` directly rather than `accelerate.Accelerator` or the
`DistributedDataParallel` wrapper: the loop needs five collectives at known points (a
broadcast, a gather, one gradient all-reduce per update, a metrics merge, joining the group),
and ranks may hold different numbers of samples in a step (per-turn episodes, dropped
groups). The wrapper all-reduces inside every ``backward``, so ranks that call it a different
number of times hang; one explicit all-reduce per optimiser update has no such constraint.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agentgym._errors import ConfigError

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: How long a rank waits in a collective. Rank 0 alone runs the SFT warm start and the evals
#: while the others wait for its next broadcast; torchrun ends every rank as soon as one
#: fails, so a long wait costs nothing when something breaks.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=6)
#: Variables `accelerate launch` sets in the processes it starts.
_ACCELERATE_LAUNCH = frozenset({"ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"})
#: Variables torch.distributed's ``env://`` rendezvous needs besides ``WORLD_SIZE``.
_TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_LAUNCH_FIX = (
    "launch with `torchrun --standalone --nproc_per_node N --no-python agentgym train CONFIG`, "
    "or `agentgym train CONFIG` for one process"
)


@dataclass(frozen=True)
class World:
    """A process's place among the training processes (one, unless torchrun started more).

    Attributes:
        rank: 0 .. world_size - 1; rank 0 owns the run folder, trackers and console.
        world_size: processes training together.
        local_rank: the rank among this machine's processes (picks its GPU).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> World:
        """The world torchrun's variables describe (``os.environ`` by default).

        Raises:
            ConfigError: the process was started by a launcher that runs one process
                whatever count it was asked for (`accelerate launch` on a CPU), or the
                torchrun variables are incomplete.
        """
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env:
            if _ACCELERATE_LAUNCH & env.keys():
                raise ConfigError(
                    "`accelerate launch` started this process without torch.distributed (on a "
                    "CPU its launcher runs ONE process whatever --num_processes says); "
                    + _LAUNCH_FIX
                )
            return cls()
        try:
            ranks = (env.get("RANK", "0"), env["WORLD_SIZE"], env.get("LOCAL_RANK", "0"))
            world = cls(*map(int, ranks))
        except ValueError as exc:
            raise ConfigError(f"bad torchrun variable ({exc}); {_LAUNCH_FIX}") from None
        if world.world_size == 1:
            return cls()
        missing = [name for name in _TORCHRUN_VARIABLES if name not in env]
        if missing:
            raise ConfigError(
                f"WORLD_SIZE={world.world_size} is set but {', '.join(missing)} are not; "
                + _LAUNCH_FIX
            )
        return world

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run folder and evaluates."""
        return self.rank == 0

    def check_divides(self, name: str, value: int) -> None:
        """Refuse a per-step count the processes cannot share equally (before models load)."""
        if value % self.world_size:
            raise ConfigError(
                f"{name}={value} cannot be split equally among the {self.world_size} training "
                f"processes (each rolls out whole groups); set it to a multiple of "
                f"{self.world_size}, or change --nproc_per_node"
            )

    def shard(self, count: int) -> range:
        """The positions of this rank's items among ``count``: a contiguous, equal share."""
        size = count // self.world_size
        return range(self.rank * size, (self.rank + 1) * size)

    def pin_gpu(self) -> None:
        """Show this process only its own GPU, the ``LOCAL_RANK``-th visible one.

        vLLM's engine takes the first GPU it sees, whatever the process's rank: without this
        every rank's engine would land on GPU 0. Must run before CUDA is initialised.
        """
        if self.world_size == 1:
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(self.local_rank + 1)]
        if visible and len(devices) == 1:
            return  # the launcher already gave each process one GPU
        if self.local_rank >= len(devices):
            raise ConfigError(
                f"LOCAL_RANK={self.local_rank} but CUDA_VISIBLE_DEVICES={visible!r} lists "
                f"{len(devices)} GPUs; start at most one process per GPU"
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[self.local_rank]

    @contextlib.contextmanager
    def joined(self, device: str) -> Iterator[None]:
        """The process group for the block: gloo on CPU, nccl on CUDA; nothing for one process."""
        if self.world_size == 1:
            yield
            return
        import torch.distributed as dist

        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        log.info("rank %d of %d joined (%s)", self.rank, self.world_size, backend)
        try:
            yield
        finally:
            dist.destroy_process_group()

    def broadcast(self, value: _T | None) -> _T:
        """Rank 0's ``value`` on every rank; the others pass None and wait for it."""
        if self.world_size == 1:
            return cast(_T, value)
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return cast(_T, box[0])

    def gather(self, value: _T) -> list[_T]:
        """Every rank's ``value`` (pickled: keep it small), in rank order, on every rank."""
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def sum_gradients(self, parameters: Iterable[Any]) -> None:
        """Sum each parameter's gradient over the ranks (DDP's all-reduce, one flat tensor).

        No averaging: the loss of each rank is already divided by the whole step's counts,
        so the sum is the gradient of one process's loss on the union of the samples. A rank
        without samples contributes zeros.
        """
        if self.world_size == 1:
            return
        import torch
        import torch.distributed as dist

        params = list(parameters)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for param, grad in zip(params, flat.split([g.numel() for g in grads])):
            param.grad = grad.view_as(param)
