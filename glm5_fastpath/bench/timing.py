"""Shared timing for every benchmark: CUDA-graph replays over rotating input sets, with fallbacks.

Method (shared/style.md practice 11, .library/device/METHOD.md "Time properly"):

- The caller provides `launch(i)`: it issues ONE op (however many kernels that op is) on input set
  `i % sets` and returns its outputs; the outputs are kept alive until the graph is destroyed, so
  every launch in a graph writes its own memory.
- `plan_rotation` sizes the input sets: enough distinct sets that the bytes one pass over all of
  them touches exceed `factor` x L2 (L2 size read from the device), so a replay cannot be served
  from L2. The number of sets can be capped (memory / capture time, or because the caller has
  only so many distinct sets, e.g. KV-cache pages); the plan then says it does not cover L2.
- `time_launches`: warm-up calls (compilation, JIT, autotuning, handle creation happen there),
  then `launches` calls captured in one CUDA graph, replayed `replays` times, each replay timed
  with CUDA events; per-launch time = replay time / launches; median, min, p90 reported.
  If capture fails, the same launches run eagerly between CUDA events (method "cuda-events",
  with the reason in `note`); on a CPU device, wall-clock time of eager calls ("cpu-wall").
- `measure_copy_bandwidth`: a large device-to-device copy, bytes read + written per second: the
  measured ceiling floors are computed at (next to the 4.27 TB/s project constant).
- `assert_not_all_zero`: never time on zeros (they hide unwritten outputs and can run faster).
- `cuda_context_error`: after an op failed, tells whether the CUDA context is still usable (a
  sticky error such as an illegal address poisons every later launch in the process).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import torch

L2_FALLBACK_BYTES = 50 * 2**20  # used only when the device does not report its L2 size


def is_cuda(device: torch.device | str | None) -> bool:
    return torch.device(device if device is not None else "cpu").type == "cuda"


def l2_cache_bytes(device: torch.device | str | None = None) -> int:
    """L2 size of a CUDA device (bytes); 0 for a CPU device."""
    if not is_cuda(device) or not torch.cuda.is_available():
        return 0
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 0) or L2_FALLBACK_BYTES


@dataclass(frozen=True)
class RotationPlan:
    """How many distinct input sets to rotate over, and how many launches one graph holds.

    sets: distinct input sets; launches: calls per captured graph, a multiple of sets (each set
    used equally often); set_bytes: bytes one launch touches (what must not stay in L2);
    covers_l2: sets * set_bytes >= factor * l2_bytes (False when capped, or on a CPU).
    """

    sets: int
    launches: int
    set_bytes: int
    l2_bytes: int
    factor: float
    capped_by: str = ""  # "" | "max_sets" | "available_sets"

    @property
    def rotated_bytes(self) -> int:
        return self.sets * self.set_bytes

    @property
    def covers_l2(self) -> bool:
        return self.l2_bytes > 0 and self.rotated_bytes >= self.factor * self.l2_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(rotated_bytes=self.rotated_bytes, covers_l2=self.covers_l2)
        return d


def plan_rotation(set_bytes: float, l2_bytes: int, *, factor: float = 2.0, min_launches: int = 20,
                  max_sets: int = 512, available_sets: int | None = None) -> RotationPlan:
    """Sets = ceil(factor * L2 / set_bytes), clamped to [1, max_sets] and to available_sets.

    launches = sets * ceil(min_launches / sets): at least min_launches, every set equally often.
    With l2_bytes == 0 (CPU) one set is enough.
    """
    if set_bytes <= 0:
        raise ValueError(f"plan_rotation: set_bytes must be > 0, got {set_bytes}")
    if min_launches < 1 or max_sets < 1:
        raise ValueError(f"plan_rotation: need min_launches >= 1 and max_sets >= 1, got {min_launches=}, {max_sets=}")
    want = math.ceil(factor * l2_bytes / set_bytes) if l2_bytes > 0 else 1
    sets, capped = max(1, want), ""
    if sets > max_sets:
        sets, capped = max_sets, "max_sets"
    if available_sets is not None and sets > max(1, available_sets):
        sets, capped = max(1, available_sets), "available_sets"
    launches = sets * math.ceil(min_launches / sets)
    return RotationPlan(sets, launches, int(set_bytes), int(l2_bytes), float(factor), capped)


@dataclass
class Timing:
    """Per-launch time statistics in microseconds."""

    median_us: float
    min_us: float
    p90_us: float
    mean_us: float
    replays: int
    launches: int
    method: str  # "cuda-graph" | "cuda-events" | "cpu-wall"
    note: str = ""
    samples_us: list[float] = field(default_factory=list)

    def to_dict(self, samples: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not samples:
            d.pop("samples_us")
        return d


def summarize(samples_us: Iterable[float], *, launches: int, method: str, note: str = "") -> Timing:
    s = sorted(float(x) for x in samples_us)
    if not s:
        raise ValueError("summarize: no samples")
    return Timing(median_us=statistics.median(s), min_us=s[0], p90_us=s[int(0.9 * (len(s) - 1))],
                  mean_us=statistics.fmean(s), replays=len(s), launches=launches, method=method, note=note,
                  samples_us=s)


class CudaContextLost(RuntimeError):
    """The CUDA context is unusable after a failure (sticky error): the process must be restarted."""


def cuda_context_error(device: torch.device | str | None = None) -> str | None:
    """None if a trivial kernel still runs and synchronizes on `device`, else the error text."""
    if not is_cuda(device):
        return None
    try:
        torch.cuda.synchronize(device)
        x = torch.ones(4, device=device)
        if float((x + 1).sum().item()) != 8.0:
            return "a trivial kernel returned a wrong result"
        return None
    except Exception as e:  # noqa: BLE001 - any failure means the context is gone
        return f"{type(e).__name__}: {e}"


def _sync(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def _time_cpu(launch: Callable[[int], Any], launches: int, replays: int) -> list[float]:
    out = []
    for _ in range(replays):
        t0 = time.perf_counter()
        keep = [launch(i) for i in range(launches)]
        out.append((time.perf_counter() - t0) * 1e6 / launches)
        del keep
    return out


def _time_events(launch: Callable[[int], Any], launches: int, replays: int, device) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(replays):
        start.record()
        keep = [launch(i) for i in range(launches)]
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / launches)
        del keep
    return out


def _time_graph(launch: Callable[[int], Any], launches: int, replays: int, device) -> list[float]:
    keep: list[Any] = []
    g = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        with torch.cuda.graph(g):
            for i in range(launches):
                keep.append(launch(i))
        for _ in range(2):
            g.replay()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(replays):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / launches)
    del g, keep
    return out


def time_launches(launch: Callable[[int], Any], launches: int, *, device: torch.device | str, replays: int = 20,
                  warmup: int = 2, graph: bool = True) -> Timing:
    """Time `launch(i)` for i < launches as described in the module doc; returns per-launch statistics.

    Raises CudaContextLost when a failure left the CUDA context unusable (the caller should then
    stop using this process), and the launch's own exception when even eager launches fail.
    """
    if launches < 1 or replays < 1:
        raise ValueError(f"time_launches: need launches >= 1 and replays >= 1, got {launches=}, {replays=}")
    for i in range(max(1, min(warmup, launches))):
        launch(i)
    _sync(device)
    if not is_cuda(device):
        return summarize(_time_cpu(launch, launches, replays), launches=launches, method="cpu-wall")
    note = ""
    if graph:
        try:
            return summarize(_time_graph(launch, launches, replays, device), launches=launches, method="cuda-graph")
        except Exception as e:  # noqa: BLE001 - fall back to eager timing, record why
            note = f"graph capture/replay failed ({type(e).__name__}: {str(e)[:300]}); timed eagerly with CUDA events"
            err = cuda_context_error(device)
            if err is not None:
                raise CudaContextLost(f"{note}; CUDA context unusable afterwards: {err}") from e
    return summarize(_time_events(launch, launches, replays, device), launches=launches, method="cuda-events",
                     note=note)


def measure_copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30, reps: int = 10) -> dict[str, Any]:
    """Device-to-device copy of `nbytes` (random bytes), median of `reps`: bytes read + written per second.

    On a CPU device it measures a host memcpy of min(nbytes, 64 MiB) (only so a dry run has a number).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        nbytes = min(nbytes, 64 << 20)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    _sync(dev)
    times = []
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    ok = bool(torch.equal(dst[:4096], src[:4096]))
    t = statistics.median(times)
    del src, dst
    return {"bytes": int(nbytes), "seconds_median": t, "bytes_per_s": 2 * nbytes / t, "reps": reps,
            "verified": ok, "what": "device-to-device copy, bytes read + written" if dev.type == "cuda"
            else "host memcpy (CPU dry run), bytes read + written"}


def assert_not_all_zero(named: dict[str, Any], what: str = "") -> None:
    """Raise ValueError if any tensor in `named` is all zeros (fp8 compared as bytes). Non-tensors are skipped."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        v = t.view(torch.uint8) if t.element_size() == 1 and t.dtype.is_floating_point else t
        if int(torch.count_nonzero(v).item()) == 0:
            raise ValueError(f"{what}: input {name!r} {tuple(t.shape)} is all zeros: never time on zeros")
