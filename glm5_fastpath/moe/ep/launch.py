"""Run one function on N local processes that form a torch.distributed group (gloo on CPU, NCCL on GPUs).

    results = run_ranks(fn, world_size=4, args=(...))       # fn(rank, world_size, *args) -> picklable result

Each process: torch.set_num_threads(threads), init_process_group(backend, FileStore in a temp dir: no ports),
fn, destroy_process_group; its return value comes back through torch.save files, in rank order. A failing
rank raises in the caller (torch.multiprocessing's ProcessRaisedException, with the rank's traceback).

NVLink multicast is forced off (NO_MULTICAST_ENV) before any rank starts.
Start method: "fork" on Linux for gloo (no re-import of torch per rank: a 4-rank group starts in ~0.1 s
instead of ~12 s on a 2-core CI machine; safe because each child sets one intra-op thread before any
parallel op, as torch's DataLoader workers do); "spawn" for NCCL (CUDA cannot be used after fork).
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile
from typing import Any, Callable, Sequence

import torch


def _entry(rank: int, fn: Callable, world_size: int, backend: str, store: str, outdir: str, args: Sequence[Any],
           threads: int, timeout_s: float) -> None:
    import torch.distributed as dist
    torch.set_num_threads(threads)
    kw: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        kw["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)
    try:
        res = fn(rank, world_size, *args)
        torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - already torn down
            pass


# NVLink multicast stays off (a program using it can take a shared host's GPUs out of service): NCCL NVLS,
# torch symmetric-memory multicast and NVSHMEM NVLS. Forced for every process this module starts.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def run_ranks(fn: Callable, world_size: int, args: Sequence[Any] = (), *, backend: str = "gloo",
              start_method: str | None = None, threads: int = 1, timeout_s: float = 120.0) -> list[Any]:
    """fn(rank, world_size, *args) on world_size processes; returns the per-rank results."""
    import torch.multiprocessing as mp
    os.environ.update(NO_MULTICAST_ENV)
    if start_method is None:
        start_method = "fork" if backend == "gloo" and sys.platform.startswith("linux") else "spawn"
    with tempfile.TemporaryDirectory(prefix="glm5_ep_") as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(_entry, args=(fn, world_size, backend, store, tmp, tuple(args), threads, timeout_s),
                           nprocs=world_size, join=True, start_method=start_method)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
