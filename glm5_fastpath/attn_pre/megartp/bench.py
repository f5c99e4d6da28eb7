"""MegaRTP benchmark: the megakernel's fixed framework cost and the time of a plan, per M.

    python -m glm5_fastpath.attn_pre.megartp.bench [--ms 1,16,64] [--kv-len 8192] [--preset glm5] [--json out.json]

- framework cost: an empty plan (every queue NOOPs without waits or signals, one queue per SM) of length 1
  and of the timed plan's queue length: kernel launch, CTA setup, instruction fetch / publish / release
  and exit, per launch (issue #5 target: <= 3 us);
- plan time: the megakernel v1 runs only some families (device.SUPPORTED_FAMILIES), so the plan timed is
  the prefix graph's supported subgraph (device.supported_subgraph: today A0, B0, B1, D1, D2, E1 with w_raw
  and q_nope as inputs computed by the reference), M independent sequences of kv_len.
Timing: bench.timing.time_launches: `launches` megakernel launches captured in one CUDA graph (epoch taken
from device memory, so replays stay correct), replayed `replays` times; median per launch. The weights are
NOT rotated past L2 (one set; the subgraph's ~38 MB of GLM-5 weights mostly fit the H200's 50 MB L2), so
plan times are optimistic against a cold-L2 step; the framework cost does not depend on it.
The lead wires this into `glm5-fastpath bench prefix --executors ...`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ...config import Glm5Config
from ...graph.op_graph import OpGraph, ShapeContext
from .plan import SCHEDULERS

DEFAULT_MS = (1, 16, 64)


def _log(msg: str) -> None:
    print(f"[megartp-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def reference_env(cfg: Glm5Config, graph: OpGraph, ctx: ShapeContext, *, seed: int = 0, device: Any = "cuda"
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(env, ref): `env` = the external tensors `graph` needs (a subgraph's inputs computed by the reference
    prefix; a cache the graph writes as it was before the step, one it only reads as the reference left it);
    `ref` = every tensor of the reference prefix's step
    (caches after the step under ref["kv_cache"], ref["index_k_cache"])."""
    from ...graph import build_prefix_graph, prefix_env, run_eager
    from ...testing.decode_step import make_decode_step
    from ...weights import random_layer

    full = build_prefix_graph(cfg)
    s = make_decode_step(cfg, list(ctx.seq_lens), seed=seed, device=device)
    w = random_layer(cfg, cfg.first_k_dense_replace, seed=seed, device=device).attn
    base = prefix_env(full, w=w, hidden=s.hidden, residual=s.residual, positions=s.positions,
                      out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table,
                      kv_cache=s.kv_cache.clone(), index_k_cache=s.index_k_cache.clone())
    ref = run_eager(full, base)
    env = {}
    for t in graph.external_tensors():
        before = {"kv_cache": s.kv_cache, "index_k_cache": s.index_k_cache}.get(t)
        if before is not None and _writes(graph, t):
            env[t] = before.clone()  # the graph writes this cache in the step: start from the old one
        elif graph.tensors[t].kind == "cache":
            # a cache the step only reads (E1 without B1 reads index_k_cache_written): as the reference left it
            env[t] = ref[t].clone()
        else:
            env[t] = ref[t]
    return env, ref


def _writes(graph: OpGraph, cache: str) -> bool:
    """Does an op of `graph` write `cache` in place (an output aliasing it)?"""
    return any(graph.tensors[o].inplace_of == cache for op in graph.ops.values() for o in op.outputs)


def bind_tensors(plan: Any, env: dict[str, torch.Tensor], device: Any) -> dict[str, torch.Tensor]:
    """env + fresh (NaN-poisoned) buffers for every produced tensor and the split-K workspaces."""
    from ...testing.numerics import poison_
    g, dims = plan.graph, plan.taskgraph.ctx.dims()
    out = dict(env)
    for name in g.produced_tensors():
        td = g.tensors[name]
        if td.inplace_of is None:
            out[name] = poison_(torch.empty(td.resolve(dims), dtype=td.dtype, device=device))
    out.update(plan.alloc_workspaces(device))
    return out


def prepared_runner(cfg: Glm5Config, graph: OpGraph, m: int, kv_len: int, dev: torch.device, *, seed: int = 0,
                    trace: bool = False, scheduler: str = "list"):
    """(plan, runner) of `graph` for M independent sequences of kv_len: validated plan, reference inputs bound,
    one warm-up step run and checked (first touch of weights and caches)."""
    from .device import PlanRunner
    from .plan import build_plan
    from .validator import validate
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ctx = ShapeContext.independent([kv_len] * int(m))
    plan = validate(build_plan(graph, ctx, cfg, num_sms=sms, scheduler=scheduler))
    env, _ = reference_env(cfg, graph, ctx, seed=seed, device=dev)
    runner = PlanRunner(plan, cfg, dev, trace=trace)
    runner.bind(bind_tensors(plan, env, dev))
    runner.launch(1)
    runner.check()
    return plan, runner


def framework_cost(device: Any = "cuda", lengths: Sequence[int] = (1,), *, launches: int = 50, replays: int = 20
                   ) -> dict[int, dict[str, Any]]:
    """Per queue length: the per-launch time of an all-NOOP plan with one queue per SM."""
    from ...bench.timing import time_launches
    from .device import PlanRunner, noop_plan
    dev = torch.device(device)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {}
    for length in lengths:
        runner = PlanRunner(noop_plan(sms, int(length)), None, dev)
        t = time_launches(lambda i: runner.launch(None), launches, device=dev, replays=replays)
        runner.check()
        out[int(length)] = t.to_dict() if hasattr(t, "to_dict") else t.__dict__
    return out


def parse_tiling(spec: str | None) -> Any:
    """`b0_split_k=6,d1_split_k=2` -> PrefixTiling with those fields changed (None / "" -> the default)."""
    from ...graph.prefix_graph import PrefixTiling
    if not spec:
        return PrefixTiling()
    try:
        fields = {f.strip(): int(v) for f, v in (kv.split("=", 1) for kv in spec.split(",") if kv)}
    except ValueError:
        raise ValueError(f"--tiling {spec!r}: expected FIELD=INT[,FIELD=INT...]") from None
    unknown = sorted(set(fields) - set(PrefixTiling.__dataclass_fields__))
    if unknown:
        raise ValueError(f"--tiling: unknown PrefixTiling fields {unknown} "
                         f"(known: {sorted(PrefixTiling.__dataclass_fields__)})")
    return PrefixTiling(**fields)


COST_TABLES = {"fixed": "FIXED_US", "cold": "COLD_US", "setup": "SETUP_US"}


def apply_cost_overrides(spec: str | None) -> dict[str, float]:
    """`E2.fixed=9.5,E2.cold=1` -> the scheduler's cost tables (scheduler.FIXED_US / COLD_US / SETUP_US) changed in
    this process, for calibration runs that compare cost models in one call. -> the overrides applied."""
    from . import scheduler as S
    out: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item:
            continue
        try:
            key, val = item.split("=", 1)
            op, field = key.strip().split(".", 1)
            value = float(val)
        except ValueError:
            raise ValueError(f"--cost {item!r}: expected OP.FIELD=US (FIELD: {', '.join(COST_TABLES)})") from None
        if field not in COST_TABLES or value < 0:
            raise ValueError(f"--cost {item!r}: FIELD must be one of {sorted(COST_TABLES)} and US >= 0")
        getattr(S, COST_TABLES[field])[op] = value
        out[key.strip()] = value
    return out


def _prefix_graph(cfg: Glm5Config, tiling: Any) -> OpGraph:
    from ...graph import build_prefix_graph
    return build_prefix_graph(cfg) if tiling is None else build_prefix_graph(cfg, tiling=tiling)


def bench_megartp(cfg: Glm5Config | None = None, *, ms: Sequence[int] = DEFAULT_MS, kv_len: int = 8192,
                  device: Any = "cuda", launches: int = 20, replays: int = 20, seed: int = 0,
                  print_table: bool = True, tiling: Any = None, scheduler: str = "list") -> dict[str, Any]:
    """Framework cost and per-M plan time of the supported subgraph (see the module doc). -> a JSON-able dict."""
    from ...bench.timing import time_launches
    from .device import supported_subgraph

    cfg = cfg or Glm5Config.preset("glm5")
    dev = torch.device(device)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    graph = supported_subgraph(_prefix_graph(cfg, tiling), cfg)
    rows, lengths = [], {1}
    for m in ms:
        _log(f"M={m}: plan of {graph.name}")
        plan, runner = prepared_runner(cfg, graph, m, kv_len, dev, seed=seed, scheduler=scheduler)
        lengths.add(int(plan.instructions.shape[1]))
        t = time_launches(lambda i: runner.launch(None), launches, device=dev, replays=replays)
        runner.check()
        rows.append({"M": int(m), "tasks": plan.stats["tasks"], "queue_len": int(plan.instructions.shape[1]),
                     "scheduler": scheduler, "est_us": plan.stats["est_makespan_us"][scheduler],
                     "median_us": t.median_us, "min_us": t.min_us, "p90_us": t.p90_us, "method": t.method})
    fw = framework_cost(dev, sorted(lengths), launches=max(launches, 50), replays=replays)
    result = {"graph": graph.name, "ops": list(graph.ops), "kv_len": kv_len, "num_sms": sms,
              "tiling": dataclasses.asdict(tiling) if tiling is not None else None, "scheduler": scheduler,
              "framework_cost_us": {L: v.get("median_us") for L, v in fw.items()}, "framework": fw, "plans": rows}
    if print_table:
        print(f"MegaRTP megakernel v1 on {torch.cuda.get_device_name(dev)} ({sms} SMs)")
        for L, v in fw.items():
            print(f"  framework cost, empty plan [{sms}, {L}]: median {v.get('median_us'):.2f} us per launch "
                  f"(target <= 3 us)")
        print(f"  plan: {graph.name} (ops {', '.join(graph.ops)}), independent sequences of {kv_len}, "
              f"{scheduler} scheduler" + (f", tiling {tiling}" if tiling is not None else ""))
        print(f"  {'M':>5}{'tasks':>7}{'queue':>7}{'median us':>11}{'min us':>9}{'p90 us':>9}{'model us':>10}")
        for r in rows:
            print(f"  {r['M']:>5}{r['tasks']:>7}{r['queue_len']:>7}{r['median_us']:>11.2f}{r['min_us']:>9.2f}"
                  f"{r['p90_us']:>9.2f}{r['est_us']:>10.1f}")
    return result


def trace_steps(cfg: Glm5Config | None = None, *, ms: Sequence[int] = DEFAULT_MS, kv_len: int = 8192,
                out: Any = "megartp_trace", device: Any = "cuda", seed: int = 0, tiling: Any = None,
                scheduler: str = "list") -> dict[str, Any]:
    """One traced step of the supported subgraph per M (trace build of the megakernel): a Chrome / Perfetto
    trace JSON per M and the summary (critical path, which ops' work was hidden) as text + JSON."""
    from . import trace as T
    from .device import supported_subgraph

    cfg = cfg or Glm5Config.preset("glm5")
    dev = torch.device(device)
    graph = supported_subgraph(_prefix_graph(cfg, tiling), cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"graph": graph.name, "kv_len": kv_len, "steps": {}}
    for m in ms:
        _, runner = prepared_runner(cfg, graph, m, kv_len, dev, seed=seed, trace=True, scheduler=scheduler)
        runner.launch(2)  # the traced step, after the warm-up
        runner.check()
        recs = runner.trace_records()
        s = T.summarize(recs)
        T.write_chrome_trace(out / f"trace_m{m}.json", recs)
        text = T.format_summary(s)
        (out / f"summary_m{m}.txt").write_text(text + "\n")
        res["steps"][int(m)] = s
        _log(f"M={m}: trace of {len(recs)} instructions -> {out}/trace_m{m}.json\n{text}")
    (out / "summary.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)))
    ap.add_argument("--kv-len", type=int, default=8192)
    ap.add_argument("--preset", default="glm5")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="also run one traced step per M (trace build): Chrome trace JSON + critical-path summary "
                         "in DIR")
    ap.add_argument("--tiling", default=None, metavar="F=N,...",
                    help="PrefixTiling fields to change for the plan, e.g. b0_split_k=6,d1_split_k=2")
    ap.add_argument("--scheduler", default="list", choices=SCHEDULERS,
                    help="queue placement: the critical-path list scheduler (default), the same with insertion "
                         "into idle gaps, the round-robin baseline, or dynamic (no placement: the CTAs claim from "
                         "one list in the list scheduler's priority order at run time)")
    ap.add_argument("--claim-lead", default=None, metavar="US|ready|done",
                    help="dynamic scheduler: claim the next task this many us before the current one's estimated "
                         "end (default 1.5), as soon as it has its inputs (ready) or when it is done (done); sets "
                         "GLM5_FASTPATH_MRTP_CLAIM_LEAD_US for this run")
    ap.add_argument("--cost", default=None, metavar="OP.FIELD=US,...",
                    help="planner cost-model overrides for this run (FIELD: fixed, cold, setup), e.g. "
                         "E2.fixed=9.5,E2.cold=1: compares cost models in one call")
    a = ap.parse_args(argv)
    try:
        tiling = parse_tiling(a.tiling) if a.tiling else None
        costs = apply_cost_overrides(a.cost)
    except ValueError as e:  # GraphError (a non-positive split) is a ValueError too
        ap.error(str(e))
    if a.claim_lead is not None:
        from .plan import CLAIM_LEAD_ENV, claim_lead_us
        try:
            claim_lead_us(a.claim_lead)
        except ValueError as e:
            ap.error(str(e))
        os.environ[CLAIM_LEAD_ENV] = a.claim_lead
        print(f"claim lead: {a.claim_lead}")
    if costs:
        print(f"planner cost overrides: {costs}")
    res = bench_megartp(Glm5Config.preset(a.preset), ms=[int(x) for x in a.ms.split(",") if x],
                        kv_len=a.kv_len, launches=a.launches, replays=a.replays, tiling=tiling,
                        scheduler=a.scheduler)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    if a.trace:
        trace_steps(Glm5Config.preset(a.preset), ms=[int(x) for x in a.ms.split(",") if x], kv_len=a.kv_len,
                    out=a.trace, tiling=tiling, scheduler=a.scheduler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
