"""Host-loop timing of SGLang's scheduler without a profiler: is a decode step paced by the host or by the GPU?

Why: at batch 1 the engine's decode step (ITL p50 2.00-2.22 ms with glm5_fastpath, session 35) is barely longer than
the GPU's busy time per step (1.95 ms), and the torch profiler, the usual way to see the host, doubles the host's
time per step, so a profile cannot say which side sets the pace. These timers cost ~1 us per wrapped call.

What it records, per scheduler loop iteration that ran a decode batch (one JSON line each, in the file named by
GLM5_FASTPATH_HOST_TIMING):
  t           wall-clock time (time.time()) of the iteration's start, to match the bench's timed windows
  bs          the decode batch size
  iter_us     from this iteration's get_next_batch_to_run call to the next one's (the loop period)
  stage_us    time inside the wrapped Scheduler methods (those that exist in the installed SGLang):
              process_input_requests, get_next_batch_to_run, run_batch, process_batch_result,
              launch_batch_sample_if_needed
  gpu_wait_us time inside torch.cuda.Event.synchronize() (SGLang's result processing waits on the copy_done event
              of the previous step there: the host waiting for the GPU)
  probe_us    time inside finer methods (PROBES: prepare_for_decode, ModelRunner.forward, the decode graph runner's
              load_batch / execute, the DSA backend's per-step metadata), summed per iteration
The host is the pacer when iter_us - gpu_wait_us (host_busy) is about iter_us: the host never waits for the GPU.
A GPU sync outside Event.synchronize (a .item() on a GPU tensor) would count as host time; SGLang's decode loop
does not do that in 0.5.14.

How it gets into the scheduler process: SGLang starts its scheduler with multiprocessing's spawn, which imports the
parent's main module in the child (`python -m glm5_fastpath.bench.offline worker ...` -> this package), and
`bench/offline.py` calls install_from_env() at import; with the variable set, a meta-path hook wraps the Scheduler
class as soon as `sglang.srt.managers.scheduler` is imported (or at once if it already is). Lines are buffered and
written every FLUSH_LINES iterations or FLUSH_S after the last write (one write call each); the scheduler loop keeps
iterating while idle, so the lines of a finished pass reach the file within FLUSH_S. Works the same for the stock engine and glm5_fastpath's (nothing of the plugin is needed).

`bench offline --host-timing` sets the variable per mode and adds the summary (summarize()) to the report.
"""
from __future__ import annotations

import functools
import importlib.abc
import json
import os
import statistics
import sys
import time
from typing import Any, Iterable

ENV = "GLM5_FASTPATH_HOST_TIMING"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
SCHEDULER_CLASS = "Scheduler"
LOOP_ENTRY = "get_next_batch_to_run"  # one call per loop iteration, at its start (after the request intake)
STAGES = ("process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result",
          "launch_batch_sample_if_needed")
# Finer probes inside the stages (SGLang 0.5.14 names; a module, class or method that does not exist is skipped):
# timed on every call, nested or not, summed per iteration under "Class.method".
PROBES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sglang.srt.managers.schedule_batch": ("ScheduleBatch", ("prepare_for_decode",)),
    "sglang.srt.model_executor.model_runner": ("ModelRunner", ("forward",)),
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner": ("DecodeCudaGraphRunner", ("load_batch", "execute")),
    "sglang.srt.layers.attention.dsa_backend": ("DeepseekSparseAttnBackend", ("init_forward_metadata_out_graph",)),
}
FLUSH_LINES = 64
FLUSH_S = 0.5  # and at the first loop iteration this long after the last write (an idle loop keeps iterating)
_MARK = "__glm5_fastpath_host_timing__"


class Recorder:
    """Per-iteration accumulators of one scheduler process; `clock` is injectable for tests."""

    def __init__(self, path: str | None, clock=time.perf_counter, wall=time.time):
        self.path = path
        self.clock = clock
        self.wall = wall
        self.iter_wall = 0.0
        self.last_flush = clock()
        self.lines: list[str] = []
        self.iter_start: float | None = None
        self.bs: int | None = None
        self.stage: dict[str, float] = {}
        self.probe: dict[str, float] = {}
        self.gpu_wait = 0.0
        self.depth = 0  # nested wrapped calls (a stage calling another): only the outermost one is timed

    # ---- events from the wrappers -------------------------------------------------------------------------
    def loop_entry(self, now: float) -> None:
        """A new loop iteration starts: close the previous one (kept only if it ran a decode batch)."""
        if self.iter_start is not None and self.bs is not None:
            rec = {"t": round(self.iter_wall, 4), "bs": self.bs, "iter_us": round((now - self.iter_start) * 1e6, 1),
                   "gpu_wait_us": round(self.gpu_wait * 1e6, 1),
                   "stage_us": {k: round(v * 1e6, 1) for k, v in self.stage.items()}}
            if self.probe:
                rec["probe_us"] = {k: round(v * 1e6, 1) for k, v in self.probe.items()}
            self.lines.append(json.dumps(rec, separators=(",", ":")))
        if self.lines and (len(self.lines) >= FLUSH_LINES or now - self.last_flush >= FLUSH_S):
            self.flush()
            now = self.clock()  # the write is not part of the next iteration
        self.iter_start, self.iter_wall, self.bs, self.gpu_wait = now, self.wall(), None, 0.0
        self.stage, self.probe = {}, {}

    def batch(self, batch: Any) -> None:
        """The batch get_next_batch_to_run returned: remember its size if it is a decode batch."""
        try:
            mode = getattr(batch, "forward_mode", None)
            if batch is not None and mode is not None and mode.is_decode():
                self.bs = int(batch.batch_size())
        except Exception:  # diagnostics never break the scheduler
            self.bs = None

    def add_stage(self, name: str, dt: float) -> None:
        self.stage[name] = self.stage.get(name, 0.0) + dt

    def add_probe(self, name: str, dt: float) -> None:
        self.probe[name] = self.probe.get(name, 0.0) + dt

    def add_wait(self, dt: float) -> None:
        if self.iter_start is not None:
            self.gpu_wait += dt

    def flush(self) -> None:
        if not self.lines:
            return
        lines, self.lines = self.lines, []
        self.last_flush = self.clock()
        if not self.path:
            return
        try:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")
        except OSError:
            pass


_recorder: Recorder | None = None


def recorder() -> Recorder | None:
    return _recorder


def _wrap_stage(cls: type, name: str, rec: Recorder) -> bool:
    fn = getattr(cls, name, None)  # may come from a mixin: the wrapper goes on `cls`
    if fn is None or not callable(fn) or getattr(fn, _MARK, False):
        return False

    @functools.wraps(fn)
    def timed(self, *a, **kw):
        t0 = rec.clock()
        if name == LOOP_ENTRY and rec.depth == 0:
            rec.loop_entry(t0)
        rec.depth += 1
        try:
            out = fn(self, *a, **kw)
        finally:
            rec.depth -= 1
            if rec.depth == 0:
                rec.add_stage(name, rec.clock() - t0)
        if name == LOOP_ENTRY:
            rec.batch(out)
        return out

    setattr(timed, _MARK, True)
    setattr(cls, name, timed)
    return True


def _wrap_probe(cls: type, name: str, rec: Recorder) -> bool:
    fn = getattr(cls, name, None)  # may be inherited: the wrapper goes on `cls`
    if fn is None or not callable(fn) or getattr(fn, _MARK, False):
        return False
    label = f"{cls.__name__}.{name}"

    @functools.wraps(fn)
    def probed(self, *a, **kw):
        t0 = rec.clock()
        try:
            return fn(self, *a, **kw)
        finally:
            rec.add_probe(label, rec.clock() - t0)

    setattr(probed, _MARK, True)
    setattr(cls, name, probed)
    return True


def _wrap_event_sync(rec: Recorder, ev: type | None = None) -> bool:
    if ev is None:
        try:
            import torch
        except Exception:
            return False
        ev = torch.cuda.Event
    fn = ev.__dict__.get("synchronize")
    if fn is None or getattr(fn, _MARK, False):
        return False

    @functools.wraps(fn)
    def timed_sync(self, *a, **kw):
        t0 = rec.clock()
        try:
            return fn(self, *a, **kw)
        finally:
            rec.add_wait(rec.clock() - t0)

    setattr(timed_sync, _MARK, True)
    ev.synchronize = timed_sync
    return True


def patch_scheduler(cls: type, rec: Recorder, event_cls: type | None = None) -> list[str]:
    """Wrap the stages `cls` defines (STAGES) and the synchronize of `event_cls` (default torch.cuda.Event);
    -> the wrapped stage names."""
    done = [n for n in STAGES if _wrap_stage(cls, n, rec)]
    _wrap_event_sync(rec, event_cls)
    return done


Target = tuple  # (class name, method names, "stage" | "probe")


def default_targets() -> dict[str, Target]:
    t: dict[str, Target] = {SCHEDULER_MODULE: (SCHEDULER_CLASS, STAGES, "stage")}
    for mod, (cls, names) in PROBES.items():
        t[mod] = (cls, names, "probe")
    return t


def patch_module(module: Any, target: Target, rec: Recorder, event_cls: type | None = None) -> list[str]:
    """Wrap `target` in an imported module; -> the wrapped method names ([] when the class is missing)."""
    cls_name, names, kind = target
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        done: list[str] = []
    elif kind == "stage":
        done = patch_scheduler(cls, rec, event_cls)
    else:
        done = [n for n in names if _wrap_probe(cls, n, rec)]
    # one line saying what was wrapped (read() skips it: no "bs"), so a file without records can be diagnosed
    rec.lines.append(json.dumps({"patched": f"{getattr(module, '__name__', '?')}.{cls_name}", "methods": done}))
    return done


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the targets' classes right after their modules execute (the spawned scheduler process imports the
    scheduler module to unpickle run_scheduler_process, the others as it builds the model runner)."""

    def __init__(self, rec: Recorder, targets: dict[str, Target], event_cls: type | None = None):
        self.rec, self.targets, self.event_cls = rec, dict(targets), event_cls

    def find_spec(self, fullname, path=None, target=None):
        tgt = self.targets.get(fullname)
        if tgt is None:
            return None
        spec = None
        for finder in sys.meta_path:  # the real spec, from the finders after this one
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        loader, rec, event_cls = spec.loader, self.rec, self.event_cls

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                patch_module(module, tgt, rec, event_cls)

        spec.loader = _Loader()
        del self.targets[fullname]
        if not self.targets:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        return spec


def install(path: str | None, *, targets: dict[str, Target] | None = None,
            event_cls: type | None = None) -> Recorder:
    """Start recording into `path` (JSON lines, appended) in this process: wrap each target (default: the scheduler
    loop's stages and PROBES) now if its module is imported, else as soon as it is. Once per process (a second call
    returns the first recorder)."""
    global _recorder
    if _recorder is not None:
        return _recorder
    rec = _recorder = Recorder(path)
    pending = {}
    for mod_name, tgt in (default_targets() if targets is None else targets).items():
        mod = sys.modules.get(mod_name)
        if mod is not None:
            patch_module(mod, tgt, rec, event_cls)
        else:
            pending[mod_name] = tgt
    if pending:
        sys.meta_path.insert(0, _PatchOnImport(rec, pending, event_cls))
    import atexit
    atexit.register(rec.flush)
    return rec


def install_from_env() -> Recorder | None:
    """install() when GLM5_FASTPATH_HOST_TIMING names a file; a no-op otherwise (the default)."""
    path = os.environ.get(ENV, "").strip()
    return install(path) if path else None


# ---- reading -------------------------------------------------------------------------------------------

def read(path: str) -> list[dict]:
    """The records of a timing file; lines that do not parse (a torn last line) are skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and isinstance(r.get("bs"), int) and isinstance(r.get("iter_us"), (int, float)):
                    out.append(r)
    except OSError:
        return []
    return out


def _p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def summarize(records: Iterable[dict], skip_first: int = 8) -> dict[int, dict]:
    """Per decode batch size: iterations, p50 of the loop period, GPU wait, host busy (period - wait) and each
    stage; the first `skip_first` iterations of each size (graph warm-up, a batch filling up) are left out."""
    by: dict[int, list[dict]] = {}
    for r in records:
        by.setdefault(int(r["bs"]), []).append(r)
    out: dict[int, dict] = {}
    for bs, rs in sorted(by.items()):
        rs = rs[skip_first:] if len(rs) > 2 * skip_first else rs
        iters = [float(r["iter_us"]) for r in rs]
        waits = [float(r.get("gpu_wait_us", 0.0)) for r in rs]
        busy = [i - w for i, w in zip(iters, waits)]
        stages = sorted({k for r in rs for k in r.get("stage_us", {})})
        probes = sorted({k for r in rs for k in r.get("probe_us", {})})
        out[bs] = {"iterations": len(rs), "iter_us_p50": _p50(iters), "gpu_wait_us_p50": _p50(waits),
                   "host_busy_us_p50": _p50(busy),
                   "host_busy_share": round(statistics.median(b / i for b, i in zip(busy, iters) if i > 0), 3)
                   if any(i > 0 for i in iters) else None,
                   "stage_us_p50": {k: _p50([float(r.get("stage_us", {}).get(k, 0.0)) for r in rs]) for k in stages}}
        if probes:
            out[bs]["probe_us_p50"] = {k: _p50([float(r.get("probe_us", {}).get(k, 0.0)) for r in rs]) for k in probes}
    return out


def render(summary: dict[int, dict], title: str) -> list[str]:
    """Markdown lines: one row per batch size."""
    if not summary:
        return [f"{title}: no decode iterations recorded"]
    stages = [s for s in STAGES if any(s in v["stage_us_p50"] for v in summary.values())]
    head = ["batch", "iterations", "loop period us", "GPU wait us", "host busy us", "host busy share"] + \
        [f"{s} us" for s in stages]
    lines = [f"{title} (p50 per scheduler loop iteration; bench/host_timing.py):", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for bs, v in summary.items():
        share = v.get("host_busy_share")
        row = [str(bs), str(v["iterations"]), f"{v['iter_us_p50']:.1f}", f"{v['gpu_wait_us_p50']:.1f}",
               f"{v['host_busy_us_p50']:.1f}", "-" if share is None else f"{100 * share:.0f} %"] + \
            [f"{v['stage_us_p50'].get(s, 0.0):.1f}" for s in stages]
        lines.append("| " + " | ".join(row) + " |")
    for bs, v in summary.items():
        if v.get("probe_us_p50"):
            lines.append(f"- batch {bs}, inside the stages (p50 us per iteration): " +
                         ", ".join(f"{k} {x:.1f}" for k, x in v["probe_us_p50"].items()))
    return lines
