"""Training across processes with DistributedDataParallel (torchrun): which rank this is, the
process group, and the data split that makes N processes compute what one process computes with
the same global batch.

    torchrun --nproc-per-node N -m probe train ...     (or `probe train --nproc N`:
    `probe.training.launch`)

NCCL on GPUs, gloo on the CPU. Every step draws one task length from the run's seed (shared by
all ranks) and a global batch made of `shards` sub-batches, sub-batch k from its own seeded
generator (shard 0 from the run's data generator, so one shard is exactly the single-process
stream). Rank r trains on sub-batch r; DDP averages the gradients, which equals the gradient of
the mean loss over the global batch because every sub-batch has the same length and so the same
number of scored tokens. `train(..., shards=N)` in one process computes the same update (up to
floating-point summation order), which is how the tests check N processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch
import torch.distributed as dist

from probe.data.tasks import Batch, Form, TaskConfig, make_batch
from probe.errors import ProbeError
from probe.training.launch import tie_to_parent

SHARD_SEED = 1_000_003  # sub-batch k >= 1 is drawn from seed + k * SHARD_SEED


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the only process that writes checkpoints, logs and progress."""
        return self.rank == 0


def world_from_env() -> World:
    """The rank and world size torchrun sets (RANK, WORLD_SIZE); one process otherwise. A rank
    of several ties its life to its parent's here (`tie_to_parent`): it dies when the launcher
    does."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise ProbeError(
            "RANK and WORLD_SIZE must be whole numbers (torchrun sets them)."
        ) from None
    if size < 1 or not 0 <= rank < size:
        raise ProbeError(f"RANK {rank} does not fit WORLD_SIZE {size}.")
    if size > 1:
        tie_to_parent()
    return World(rank, size)


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """Join the process group torchrun prepared (NCCL on CUDA, gloo on the CPU), and leave it."""
    if world.size == 1:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def local_device(device: torch.device, world: World) -> torch.device:
    """Each rank's GPU (LOCAL_RANK) when training on CUDA; the CPU stays the CPU."""
    if world.size > 1 and device.type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def shard_generators(seed: int, shards: int, data_gen: torch.Generator) -> list[torch.Generator]:
    """Sub-batch k's generator: the run's data generator for k = 0, its own seed otherwise."""
    return [data_gen] + [torch.Generator().manual_seed(seed + k * SHARD_SEED)
                         for k in range(1, shards)]  # fmt: skip


def check_batch_size(batch_size: int, shards: int) -> int:
    """Examples per sub-batch; the global batch must split evenly."""
    if batch_size % shards:
        raise ProbeError(
            f"--batch-size {batch_size} does not split over {shards} processes; use a multiple "
            f"of {shards} (each process trains on batch_size / {shards} examples)."
        )
    return batch_size // shards


def _cat(batches: Sequence[Batch]) -> Batch:
    first = batches[0]
    if len(batches) == 1:
        return first
    merged = {}
    for f in fields(Batch):
        value = getattr(first, f.name)
        if isinstance(value, torch.Tensor):
            merged[f.name] = torch.cat([getattr(b, f.name) for b in batches])
    return replace(first, **merged)


def global_batch(task: TaskConfig, form: Form, length: int, batch_size: int,
                 generators: Sequence[torch.Generator]) -> Batch:  # fmt: skip
    """The step's global batch: one sub-batch per generator, concatenated in shard order."""
    per = check_batch_size(batch_size, len(generators))
    return _cat([make_batch(task, form, length, per, g) for g in generators])


def rank_slice(rows: int, world: World) -> slice:
    """The rows of a global batch of `rows` that are this rank's (all of them in one process)."""
    per = rows // world.size
    return slice(world.rank * per, (world.rank + 1) * per)


def rank_rows(batch: Batch, world: World) -> Batch:
    """This rank's sub-batch of a global batch (all of it in one process)."""
    if world.size == 1:
        return batch
    keep = torch.zeros(batch.inputs.shape[0], dtype=torch.bool)
    keep[rank_slice(batch.inputs.shape[0], world)] = True
    return batch.rows(keep.to(batch.inputs.device))


def mean_over_ranks(value: float, world: World, device: torch.device) -> float:
    """The mean of a per-rank number over all ranks (the rank's own value in one process)."""
    if world.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / world.size


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def active_world() -> World:
    """The process group this process has joined (one process when there is none)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def sum_over_ranks(tensors: Sequence[torch.Tensor], world: World) -> list[torch.Tensor]:
    """Each tensor summed over every rank (unchanged in one process)."""
    if world.size == 1:
        return list(tensors)
    summed = []
    for t in tensors:
        t = t.clone()
        dist.all_reduce(t)
        summed.append(t)
    return summed
