#!/usr/bin/env python3
"""Small MegaRTP plans for compute-sanitizer (issue #5: racecheck / memcheck / synccheck of the megakernel).

Each case builds a plan, runs epochs 1 and 2 on the GPU and checks what it produced; run the whole script
under one sanitizer tool (scripts/megartp_sanitize.sh does memcheck, synccheck and racecheck, restricted to
the megakernel with --kernel-name regex:glm5_megartp). Cases, smallest first:

    noop1            1 queue x 4 NOOPs (the runtime alone: slots, handshakes, exit bookkeeping)
    chain4           4 queues x 3 NOOPs whose events cross queues (cross-CTA waits)
    prefix1          GLM-5's whole prefix, 1 token, KV 300, every task on ONE queue (no cross-CTA wait: safe even
                     if a tool runs the CTAs one after another)
    prefix5          5 tokens, odd KV lengths, 4 queues (static list plan)
    prefix5_dynamic  the same, dynamic dispatch on 4 CTAs
    prefix16_q8      16 tokens on 8 queues: the shape of the megakernel GPU test that hung once in session 23 (c5)

Waits get a long budget (--wait-budget-ms, default 120 s): the tools slow the kernel by orders of magnitude, and
a tool that serialises CTAs turns a cross-CTA wait into a MegaRtpWaitTimeout (reported, not a hang).

    python3 scripts/megartp_sanitize.py --cases noop1,prefix1     (plain run: every case checks its results)
    SAN=/tmp/san/nvidia/cu13/bin/compute-sanitizer scripts/megartp_sanitize.sh OUTDIR
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("noop1", "chain4", "prefix1", "prefix5", "prefix5_dynamic", "prefix16_q8")
PREFIX_CASES = {"prefix1": ([300], 1, "list"), "prefix5": ([40, 41, 300, 77, 1000], 4, "list"),
                "prefix5_dynamic": ([40, 41, 300, 77, 1000], 4, "dynamic"),
                "prefix16_q8": ([500 + 3 * i for i in range(16)], 8, "list")}


def _noop_case(plan_fn: Callable, budget_ms: float) -> str:
    import torch

    from glm5_fastpath.attn_pre.megartp import device as D
    plan = plan_fn()
    r = D.PlanRunner(plan, None, "cuda", wait_budget_ms=budget_ms)
    r.launch(1)
    r.launch(2)
    r.check()
    events = plan.num_counters
    ok = bool((r.counters[:events] == 2).all()) if events else True
    if not ok:
        raise AssertionError(f"counters {r.counters[:events].tolist()} != 2 after two epochs")
    return f"{tuple(plan.instructions.shape)} epochs 1-2, state {r.state.tolist()}, device {torch.cuda.get_device_name()}"


def _prefix_case(lens: list[int], num_sms: int, scheduler: str, budget_ms: float) -> str:
    from glm5_fastpath.attn_pre.megartp import device as D
    from glm5_fastpath.attn_pre.megartp.bench import bind_tensors, reference_env
    from glm5_fastpath.attn_pre.megartp.plan import build_plan
    from glm5_fastpath.attn_pre.megartp.validator import validate
    from glm5_fastpath.config import Glm5Config
    from glm5_fastpath.graph import ShapeContext, build_prefix_graph
    from glm5_fastpath.testing.numerics import assert_close, assert_no_poison

    cfg = Glm5Config.preset("glm5")
    g = D.supported_subgraph(build_prefix_graph(cfg), cfg)
    ctx = ShapeContext.independent(lens)
    plan = validate(build_plan(g, ctx, cfg, num_sms=num_sms, scheduler=scheduler))
    env, ref = reference_env(cfg, g, ctx, seed=11, device="cuda")
    t = bind_tensors(plan, env, "cuda")
    r = D.PlanRunner(plan, cfg, "cuda", wait_budget_ms=budget_ms).bind(t)
    for e in (1, 2):
        r.launch(e)
        r.check()
    outs = ["q_lat", "c_kv", "k_pe", "head_w", "x_bf16", "residual_out", "topk_slots", "q_nope", "q_pe"]
    assert_no_poison("megartp sanitize", *[t[n] for n in outs], names=outs)
    assert_close("megartp sanitize", t["q_lat"], ref["q_lat"], kind="bf16", context="q_lat")
    assert_close("megartp sanitize", t["c_kv"], ref["c_kv"], kind="bf16", context="c_kv")
    return f"{plan.stats['tasks']} tasks, {tuple(plan.instructions.shape)} ({scheduler}), epochs 1-2, q_lat / c_kv ok"


def run_case(name: str, budget_ms: float) -> str:
    from glm5_fastpath.attn_pre.megartp import device as D
    if name == "noop1":
        return _noop_case(lambda: D.noop_plan(1, 4), budget_ms)
    if name == "chain4":
        return _noop_case(lambda: D.chain_plan(4, 3, seed=1), budget_ms)
    if name in PREFIX_CASES:
        lens, sms, sched = PREFIX_CASES[name]
        return _prefix_case(lens, sms, sched, budget_ms)
    raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASES)}")


def parse_cases(spec: str) -> list[str]:
    names = [c.strip() for c in spec.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if bad or not names:
        raise ValueError(f"--cases: unknown {bad or spec!r}; choose from {', '.join(CASES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--wait-budget-ms", type=float, default=120_000.0)
    a = ap.parse_args(argv)
    try:
        cases = parse_cases(a.cases)
    except ValueError as e:
        ap.error(str(e))
    failed = 0
    for name in cases:
        t0 = time.time()
        try:
            msg = run_case(name, a.wait_budget_ms)
            print(f"[megartp-sanitize] {name}: ok ({msg}; {time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            failed += 1
            print(f"[megartp-sanitize] {name}: FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
