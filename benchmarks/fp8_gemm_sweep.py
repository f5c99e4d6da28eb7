#!/usr/bin/env python3
"""One-shot H200 sweep of the skinny FP8 GEMM family (glm5_fastpath.ops.fp8_gemm): both mainloops
("mma": cp.async + mma.sync, "wgmma": TMA + wgmma), diagnostics, fused epilogues, and the tuned table.

Shapes (GLM-5): QKV-A 2624x6144 (B0), q_b 16384x2048 (D0), wq_b 4096x2048 (D1), wk 128x6144 (B1);
M in {1, 16, 64, 128, 256}. Runs in about 5 minutes on one H200 (compile included).

Phases (each writes its records as it goes; the JSON is rewritten after every phase):
  0  probe (a subprocess): the wgmma kernel once per shape at M = 1 and 64 against a float64
     reference. If it fails (wrong numbers, an error, or a trap that would kill this process's CUDA
     context), the wgmma configs are left out of every phase and the report says why.
  A  plain GEMM (EPI_PLAIN, PDL off) over a pruned grid per impl: token block (the smallest block
     holding the tokens and half of it) x K splits (around the split count that fills the SMs) x
     ring stages (mma: 3, 4; wgmma: 4, 6, 8, 10 capped at the K groups per split and at smem).
     Every config's output is checked against a float64 reference; a wrong config is reported and
     never "best". Each (shape, M) gets an equal time slice; candidates run in cost-model order.
  B  diagnostics at the best config of each impl: loads only (the ring alone: achieved streaming
     bandwidth), no split-K reduce, no loads in the K loop (MMA + promotion cost); the best config
     with PDL on; and at M = 1 the wgmma loads-only ring over splits x stages (tm = 8): TB/s by
     bytes in flight per SM.
  C  the fused op of each shape (B0 / D0 / D1 / B1) at the default config (config_for) and at the
     best plain config of each impl, PDL off; for B0 also split mode (plain GEMM at the best plain
     config, then the b0_row_norms row kernel), PDL on.
  T  the tuned table: per (epilogue, shape, M) the fastest correct measured config (plain: phase A;
     fused: phase C), in the format of glm5_fastpath/ops/tuned/fp8_gemm_sm90_132sm.json (each entry
     names its impl). Copy it there to make it the production choice.

Timing: glm5_fastpath.bench.timing.time_launches (CUDA-graph replays), weights rotated over enough
distinct sets to exceed 2x L2 per replay; activations random (never zeros). Floor = (weights +
activations + bf16 output bytes) / measured device copy bandwidth.

    PYTHONPATH=$PWD GLM5_FASTPATH_CACHE_DIR=/tmp/jit python benchmarks/fp8_gemm_sweep.py --out /tmp/sweep
    PYTHONPATH=$PWD GLM5_FASTPATH_CACHE_DIR=/tmp/jit python benchmarks/fp8_gemm_sweep.py --warm   # JIT cache only

Writes DIR/fp8_gemm_sweep.json (every record), DIR/fp8_gemm_sweep.md (summary tables) and
DIR/fp8_gemm_sm90_<sms>sm.json (the table).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from glm5_fastpath.bench.timing import (CudaContextLost, l2_cache_bytes, measure_copy_bandwidth,  # noqa: E402
                                        plan_rotation, time_launches)
from glm5_fastpath.config import INDEXER_K_NORM_EPS, Glm5Config  # noqa: E402
from glm5_fastpath.ops import fp8_gemm as F  # noqa: E402

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
MS = (1, 16, 64, 128, 256)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
MMA_STAGES = (3, 4)
WG_STAGES = (4, 6, 8, 10)
SHAPES = {  # name: (N, K, fused epilogue); EPI_PLAIN = a plain linear (no fused phase C)
    "qkv_a": (2624, 6144, F.EPI_QKV_A),
    "q_b": (16384, 2048, F.EPI_Q_B),
    "wq_b": (4096, 2048, F.EPI_IDX_Q),
    "wk": (128, 6144, F.EPI_IDX_K),
    # the FP8-linear route's shapes (integrations/sglang/linear_route.py), opt-in with --shapes: multi-wave weight
    # streams where config_for's split-K pick trails DeepGEMM (session 8: o_proj 37.0 vs 31.6 us at M = 8)
    "o_proj": (6144, 16384, F.EPI_PLAIN),
    "dense_gate_up": (24576, 6144, F.EPI_PLAIN),
    "dense_down": (6144, 12288, F.EPI_PLAIN),
}
DEFAULT_SHAPES = ("qkv_a", "q_b", "wq_b", "wk")
LINEAR_MS = (1, 8, 16, 32, 64)  # the route's decode sizes (its default token limit is 64)
DIAG_NAMES = {0: "full", 1: "loads_only", 2: "no_reduce", 3: "no_loads"}
REPLAYS = 10
OK_REL_ERR = 2e-2

Knobs = tuple  # (impl, tm, splits, stages, minb[, pipe, reduce]); absent = (0, "global")


def option_knobs(kn: Knobs) -> list[Knobs]:
    """The wgmma options worth timing at config kn: consumer pipelining (tm <= PIPE_MAX_TM) and the
    cluster split-K reduce (2 <= splits <= MAX_CLUSTER_SPLITS), alone and together."""
    impl, tm, s, st, mb = kn[:5]
    if impl != "wgmma":
        return []
    pipes = (0, 1) if tm <= F.PIPE_MAX_TM else (0,)
    reds = ("global", "cluster") if 1 < s <= F.MAX_CLUSTER_SPLITS else ("global",)
    return [(impl, tm, s, st, mb, p, r) for p in pipes for r in reds if (p, r) != (0, "global")]


def _opts(kn: Knobs) -> tuple[int, str]:
    return (kn[5], kn[6]) if len(kn) > 5 else (0, "global")


# ---- grid ---------------------------------------------------------------------------------------------

def tms_for(m: int, impl: str, epi: int = F.EPI_PLAIN) -> list[int]:
    """The smallest token block holding min(M, largest block) tokens, and half of it."""
    blocks = F.token_blocks(impl, epi)
    want = next((tm for tm in blocks if tm >= m), blocks[-1])
    return [tm for tm in blocks if tm == want or (tm == want // 2 and tm >= 8 and m > 1)]


def splits_for(n: int, k: int, m: int, tm: int, sms: int) -> list[int]:
    """K splits around the count that fills the SMs (at most 5 values)."""
    g = k // 128
    tiles = -(-n // 128) * -(-m // tm)
    if tiles * g <= sms:  # even one K group per CTA cannot fill the machine (wk): latency vs reduce cost
        cands = [s for s in SPLITS if s <= g and s * 6 >= g]
    else:
        fill = sms / tiles
        cands = [s for s in SPLITS if s <= g and fill / 2.5 <= s <= fill * 1.6]
        if not cands:
            cands = [min((s for s in SPLITS if s <= g), key=lambda s: abs(s - fill))]
    if len(cands) > 5:  # keep both ends and the middle
        idx = sorted({round(i * (len(cands) - 1) / 4) for i in range(5)})
        cands = [cands[i] for i in idx]
    return cands


def grid_for(m: int, n: int, k: int, sms: int, impls: tuple[str, ...], linear: bool = False) -> list[Knobs]:
    """(impl, tm, splits, stages, minb) candidates of the plain sweep, cheapest estimate first per impl,
    the impls interleaved (so a cut-off time slice still saw the best guesses of both)."""
    per: dict[str, list[tuple[float, Knobs]]] = {}
    for impl in impls:
        out = []
        for tm in tms_for(m, impl):
            for s in splits_for(n, k, m, tm, sms):
                gmax = -(-(k // 128) // s)
                if impl == "wgmma":
                    stages = sorted({max(2, min(st, gmax, F.wgmma_stages(tm, gmax))) for st in WG_STAGES})
                else:
                    stages = list(MMA_STAGES)
                for st in stages:
                    c = F.SkinnyConfig(F.EPI_PLAIN, m, n, k, tm, s, st, 1, 0, impl)
                    if c.smem_bytes > F.SMEM_LIMIT or c.partial_floats * 4 > F.WORKSPACE_CAP_BYTES:
                        continue
                    out.append((F.estimate_us(c, sms), (impl, tm, s, st, 1)))
            if linear:  # the opt-in FP8-linear shapes only: the prefix sweep's time budget stays as it was
                out += two_per_sm(m, n, k, tm, sms, impl)
        per[impl] = [kn for _, kn in sorted(out)]
    merged: list[Knobs] = []
    for i in range(max((len(v) for v in per.values()), default=0)):
        for impl in impls:
            if i < len(per[impl]):
                merged.append(per[impl][i])
    return merged


def two_per_sm(m: int, n: int, k: int, tm: int, sms: int, impl: str) -> list[tuple[float, Knobs]]:
    """Two CTAs per SM (minb = 2, a ring that fits half the shared memory) at 1-3 K splits, for shapes whose
    n tiles alone need more than one wave (o_proj, the dense MLP): no split-K finish, or a short one, instead of
    the many-split waves config_for picks there. Ranked after the estimate's own candidates (estimate x 1.5:
    the cost model does not know two CTAs per SM)."""
    tiles = -(-n // 128) * -(-m // tm)
    if impl != "wgmma" or tiles <= sms or tm > 16:
        return []
    out = []
    for s in (1, 2, 3):
        for st in (3, 4, 5, 6):
            c = F.SkinnyConfig(F.EPI_PLAIN, m, n, k, tm, s, st, 2, 0, impl)
            if c.smem_bytes > F.SMEM_LIMIT // 2 or c.partial_floats * 4 > F.WORKSPACE_CAP_BYTES or st > c.gmax:
                continue
            out.append((1.5 * F.estimate_us(c, sms), (impl, tm, s, st, 2)))
    return out


# ---- cases -----------------------------------------------------------------------------------------------

class Case:
    """Weights (rotated sets), activations and the float64 reference of one (shape, M)."""

    def __init__(self, name: str, m: int, dev, gen: torch.Generator, weights: dict):
        self.name, self.m = name, m
        self.n, self.k, self.epi = SHAPES[name]
        n, k = self.n, self.k
        self.sets, self.w, self.ws, self.plan = weights[name]
        self.x8 = (torch.randn(m, k, device=dev, generator=gen) * 2).to(FP8)
        self.xs = torch.rand(m, k // 128, device=dev, generator=gen) * 0.01 + 0.001
        w0 = self.w[0].float() * self.ws[0].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        x0 = self.x8.float() * self.xs.repeat_interleave(128, 1)
        self.ref = (x0.double() @ w0.double().t()).float()
        self.bytes = n * k + m * k + m * n * 2 + self.ws[0].numel() * 4 + self.xs.numel() * 4

    def plain(self, i: int, pdl: bool = False):
        return torch.ops.glm5_fastpath.fp8_gemm_skinny(self.x8, self.xs, self.w[i % self.sets], self.ws[i % self.sets], pdl)


def make_weights(dev, l2: int, gen, shapes) -> dict:
    out = {}
    for name in shapes:
        n, k, _ = SHAPES[name]
        plan = plan_rotation(n * k, l2, factor=2.0, min_launches=20, max_sets=256)
        w, ws = [], []
        for _ in range(plan.sets):
            w.append((torch.randn(n, k, device=dev, generator=gen) * 0.5).to(FP8))
            ws.append(torch.rand(-(-n // 128), k // 128, device=dev, generator=gen) * 0.02 + 0.001)
        out[name] = (plan.sets, w, ws, plan)
    return out


class Fused:
    """The fused op of a shape with its extra inputs (GLM-5 dims)."""

    def __init__(self, case: Case, cfg: Glm5Config, dev, gen):
        self.c, self.cfgm = case, cfg
        m = case.m
        self.pos = torch.randint(0, 4096, (m,), device=dev, generator=gen, dtype=torch.int64)
        self.table = F.rope_table(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings, dev)
        self.q_norm = (torch.rand(cfg.q_lora_rank, device=dev, generator=gen) + 0.5).to(BF16)
        self.kv_norm = (torch.rand(cfg.kv_lora_rank, device=dev, generator=gen) + 0.5).to(BF16)
        self.w_raw = torch.randn(m, cfg.index_n_heads, device=dev, generator=gen).to(BF16)
        d = cfg.index_head_dim
        self.ln_w = torch.rand(d, device=dev, generator=gen) + 0.5
        self.ln_b = torch.randn(d, device=dev, generator=gen) * 0.1
        pages = -(-max(m, 1) // 64) + 1
        self.cache = torch.zeros(pages, 64 * (d + 4), dtype=torch.uint8, device=dev)
        self.slots = torch.randperm(pages * 64, device=dev, generator=gen)[:m].to(torch.int64)

    def split(self, i: int, pdl: bool = False):
        """B0 split mode: plain GEMM [M, 2624] bf16, then the row kernel (both with `pdl`)."""
        cs, c = self.c, self.cfgm
        w, ws = cs.w[i % cs.sets], cs.ws[i % cs.sets]
        o = torch.ops.glm5_fastpath
        qkv = o.fp8_gemm_skinny(cs.x8, cs.xs, w, ws, pdl)
        return o.b0_row_norms(qkv, self.q_norm, self.kv_norm, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim,
                              float(c.rms_norm_eps), pdl)

    def __call__(self, i: int, pdl: bool = False):
        cs, c = self.c, self.cfgm
        w, ws = cs.w[i % cs.sets], cs.ws[i % cs.sets]
        o = torch.ops.glm5_fastpath
        if cs.epi == F.EPI_QKV_A:
            return o.fp8_qkv_a(cs.x8, cs.xs, w, ws, self.q_norm, self.kv_norm, c.q_lora_rank, c.kv_lora_rank,
                               c.qk_rope_head_dim, float(c.rms_norm_eps), pdl)
        if cs.epi == F.EPI_Q_B:
            return o.fp8_q_b_rope(cs.x8, cs.xs, w, ws, self.pos, self.table, c.num_attention_heads,
                                  c.qk_nope_head_dim, c.qk_rope_head_dim, float(c.rope_theta), pdl)
        if cs.epi == F.EPI_IDX_Q:
            return o.fp8_indexer_q(cs.x8, cs.xs, w, ws, self.w_raw, self.pos, self.table, c.index_n_heads,
                                   c.index_head_dim, c.qk_rope_head_dim, float(c.index_weight_scale),
                                   float(c.rope_theta), pdl)
        return o.fp8_indexer_k(cs.x8, cs.xs, w, ws, self.ln_w, self.ln_b, self.pos, self.slots, self.cache,
                               self.table, c.qk_rope_head_dim, float(INDEXER_K_NORM_EPS), float(c.rope_theta), pdl)


# ---- phase 0: the wgmma probe (its own process) -----------------------------------------------------------

def probe_main(shapes: list[str]) -> int:
    """One wgmma launch per shape at M = 1 and 64 (default config) vs float64: prints one JSON line."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(7)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {}
    for name in shapes:
        n, k, _ = SHAPES[name]
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.5).to(FP8)
        ws = torch.rand(-(-n // 128), k // 128, device=dev, generator=gen) * 0.02 + 0.001
        for m in (1, 64):
            x8 = (torch.randn(m, k, device=dev, generator=gen) * 2).to(FP8)
            xs = torch.rand(m, k // 128, device=dev, generator=gen) * 0.01 + 0.001
            ref = ((x8.float() * xs.repeat_interleave(128, 1)).double()
                   @ (w.float() * ws.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)).double().t()).float()
            c = F.config_for(m, n, k, F.EPI_PLAIN, sms, "wgmma")
            with F.forced_config(c.tm, c.splits, c.stages, impl="wgmma"):
                y = torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, w, ws, False).float()
            torch.cuda.synchronize(dev)
            res[f"{name}/{m}"] = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    ok = all(v < OK_REL_ERR for v in res.values())
    print("PROBE " + json.dumps({"ok": ok, "rel_err": res}), flush=True)
    return 0 if ok else 1


def run_probe(shapes: list[str], timeout_s: float = 240.0) -> tuple[bool, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", "--shapes", ",".join(shapes), "--out", "/dev/null"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return False, f"probe timed out after {timeout_s:.0f} s (a hang in the wgmma kernel?)"
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if r.returncode == 0 and line:
        return True, line[6:]
    tail = (r.stdout + r.stderr)[-1500:]
    return False, f"probe exit {r.returncode}: {line[6:] if line else ''} {tail}"


# ---- main ---------------------------------------------------------------------------------------------------

def compile_all(specs: set, dev, comp_err: dict) -> float:
    from glm5_fastpath.jit import compile_kernel
    t0 = time.time()
    todo = sorted(s for s in specs if s not in comp_err)
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 8)) as ex:
        futs = {ex.submit(compile_kernel, F.kernel_spec(t[1], t[2], t[3], t[4], t[5], t[0], *t[6:]), None, device=dev): t
                for t in todo}
        for f in cf.as_completed(futs):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                comp_err[futs[f]] = f"{type(e).__name__}: {str(e)[:400]}"
    dt = time.time() - t0
    print(f"compiled {len(todo)} variants in {dt:.1f} s ({len(comp_err)} failed so far)", flush=True)
    return dt


def warm_main(arch: str = "sm_90a") -> int:
    """Compile, in parallel and without a GPU, every kernel variant the ops and their GPU tests use
    (both mainloops, the glm5 and small presets, M = 1..256, the compile-check and diagnostic
    variants) into the JIT cache, so a fresh machine does not spend the test run in nvcc."""
    from glm5_fastpath.jit import compile_kernel
    specs = set(F.compile_check_specs()) | set(F.diag_specs())
    for preset in ("glm5", "small"):
        c = Glm5Config.preset(preset)
        for impl in F.IMPLS:
            for im, tm, st, epi, mb in F._variants(c, 132, impl):
                specs.add(F.kernel_spec(tm, st, epi, mb, 0, im))
    t0 = time.time()
    fails = 0
    with cf.ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 8)) as ex:
        futs = {ex.submit(compile_kernel, s, arch): s for s in specs}
        for f in cf.as_completed(futs):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                fails += 1
                print(f"compile failed: {futs[f].describe()}: {str(e)[:2000]}", flush=True)
    print(f"warm: {len(specs)} variants for {arch} in {time.time() - t0:.1f} s, {fails} failed", flush=True)
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory (required unless --warm)")
    ap.add_argument("--warm", action="store_true", help="only fill the JIT cache (parallel nvcc, no GPU needed) and exit")
    ap.add_argument("--budget-s", type=float, default=200.0, help="wall budget of the timing phases A-C")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                    help=f"comma list of {', '.join(SHAPES)} (default: the prefix GEMMs {', '.join(DEFAULT_SHAPES)}; "
                         f"the FP8-linear shapes are opt-in, e.g. --shapes o_proj,dense_gate_up,dense_down "
                         f"--ms {','.join(map(str, LINEAR_MS))})")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--impls", default=",".join(F.IMPLS), help="mainloops to sweep (mma, wgmma)")
    ap.add_argument("--no-probe", action="store_true", help="skip the wgmma probe subprocess")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    if args.warm:
        return warm_main()
    if args.out is None:
        ap.error("--out is required")
    if args.probe:
        return probe_main(shapes)
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("fp8_gemm_sweep: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cc = tuple(torch.cuda.get_device_capability(dev))
    l2 = l2_cache_bytes(dev)
    ms = [int(x) for x in args.ms.split(",") if x]
    impls = tuple(i for i in args.impls.split(",") if i)
    for i in impls:
        if i not in F.IMPLS:
            raise SystemExit(f"--impls: unknown impl {i!r} (known: {F.IMPLS})")
    notes: list[str] = []
    if "wgmma" in impls and not F.wgmma_supported(cc):
        impls = tuple(i for i in impls if i != "wgmma")
        notes.append(f"wgmma skipped: sm_{cc[0]}{cc[1]} has no wgmma")
    cfg = Glm5Config.preset("glm5")
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    comp_err: dict = {}

    # ---- compile batch 1: plain grid + default configs (nvcc subprocesses, process-safe JIT cache) ----
    grids = {(name, m): grid_for(m, SHAPES[name][0], SHAPES[name][1], sms, impls, SHAPES[name][2] == F.EPI_PLAIN)
             for name in shapes for m in ms}
    specs = set()
    for (name, m), grid in grids.items():
        n, k, epi = SHAPES[name]
        for impl, tm, s, st, mb in grid:
            specs.add((impl, tm, st, F.EPI_PLAIN, mb, 0))
        for e in (epi, F.EPI_PLAIN):
            h = F.config_for(m, n, k, e, sms, None, cc)
            specs.add((h.impl, h.tm, h.stages, e, h.minb, 0))
    if "wgmma" in impls:  # the probe's configs
        for name in shapes:
            n, k, _ = SHAPES[name]
            for m in (1, 64):
                c = F.config_for(m, n, k, F.EPI_PLAIN, sms, "wgmma", cc)
                specs.add(("wgmma", c.tm, c.stages, F.EPI_PLAIN, 1, 0))
    t_compile = compile_all(specs, dev, comp_err)

    # ---- phase 0: probe the wgmma kernel in a subprocess (a trap there cannot kill this process) ----
    probe = "skipped"
    if "wgmma" in impls and not args.no_probe:
        ok, probe = run_probe(shapes)
        print(f"wgmma probe: {'ok' if ok else 'FAILED'}: {probe[:600]}", flush=True)
        if not ok:
            impls = tuple(i for i in impls if i != "wgmma")
            notes.append(f"wgmma LEFT OUT: the probe failed: {probe[:1500]}")
            grids = {key: [g for g in grid if g[0] != "wgmma"] for key, grid in grids.items()}
    try:  # B0 split mode's row kernel (phase C); a failure only loses the C_split records
        F._row_kernel(cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, dev)
    except Exception as e:  # noqa: BLE001
        print(f"  b0_row_norms kernel failed to load: {type(e).__name__}: {str(e)[:400]}", flush=True)

    bw = measure_copy_bandwidth(dev, 1 << 30, 10)
    bps = bw["bytes_per_s"]
    weights = make_weights(dev, l2, gen, shapes)
    meta = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(dev),
            "sms": sms, "cc": list(cc), "l2_bytes": l2, "copy_bw": bw, "compile_s": t_compile, "impls": list(impls),
            "probe": probe, "notes": notes, "rotation": {k: v[3].to_dict() for k, v in weights.items()}}
    records: list[dict] = []
    cases = {(name, m): Case(name, m, dev, gen, weights) for name in shapes for m in ms}
    lost = [False]
    t_phases = time.time()
    deadline_a = t_phases + 0.55 * args.budget_s
    deadline_b = t_phases + 0.75 * args.budget_s
    deadline = t_phases + args.budget_s

    def write():
        meta["compile_errors"] = {str(k): v for k, v in comp_err.items()}
        (args.out / "fp8_gemm_sweep.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))

    def run(case: Case, phase: str, fn, knobs: Knobs, epi: int, diag: int = 0, pdl: bool = False,
            check: bool = False, **extra) -> dict | None:
        if lost[0]:
            return None
        impl, tm, s, st, mb = knobs[:5]
        pipe, red = _opts(knobs)
        c = F.SkinnyConfig(epi, case.m, case.n, case.k, tm, s, st, mb, diag, impl, pipe, red)
        rec = {"phase": phase, "shape": case.name, "M": case.m, "epi": epi, "impl": impl, "tm": tm, "splits": s,
               "stages": st, "minb": mb, "pipe": pipe, "reduce": red, "diag": DIAG_NAMES[diag], "pdl": pdl,
               "ctas": c.ctas, "smem": c.smem_bytes, **extra}
        ckey = (impl, tm, st, epi, mb, diag) + ((pipe, red if s > 1 else "global") if (pipe, red) != (0, "global") else ())
        if ckey in comp_err:
            rec["error"] = "compile failed"
            records.append(rec)
            return rec
        try:
            with F.forced_config(tm, s, st, mb, diag, impl, pipe, red):
                if check:
                    y = fn(0, pdl).float()
                    torch.cuda.synchronize(dev)
                    err = float((y - case.ref).abs().max() / case.ref.abs().max().clamp_min(1e-30))
                    rec["rel_err"] = err
                    rec["ok"] = bool(err < OK_REL_ERR)
                t = time_launches(lambda i: fn(i, pdl), case.plan.launches, device=dev, replays=REPLAYS, warmup=2)
        except CudaContextLost as e:
            rec["error"] = f"CUDA context lost: {e}"
            lost[0] = True
            records.append(rec)
            print(f"!! {rec}", flush=True)
            return None
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            records.append(rec)
            return rec
        rec.update(us=t.median_us, us_min=t.min_us, us_p90=t.p90_us, method=t.method,
                   tbps=case.bytes / (t.median_us * 1e-6) / 1e12, x_floor=t.median_us / (case.bytes / bps * 1e6))
        records.append(rec)
        return rec

    def knobs_of(r: dict) -> Knobs:
        kn = (r["impl"], r["tm"], r["splits"], r["stages"], r["minb"])
        opt = (r.get("pipe", 0), r.get("reduce", "global"))
        return kn + opt if opt != (0, "global") else kn

    def default_knobs(case: Case, epi: int) -> Knobs:
        h = F.config_for(case.m, case.n, case.k, epi, sms, None, cc)
        kn = (h.impl, h.tm, h.splits, h.stages, h.minb)
        return kn + (h.pipe, h.reduce) if (h.pipe, h.reduce) != (0, "global") else kn

    # ---- phase A: plain grid, an equal time slice per case -------------------------------------------
    best: dict[tuple, dict] = {}          # (shape, M) -> fastest correct record
    best_impl: dict[tuple, dict] = {}     # (shape, M, impl) -> fastest correct record of that impl
    keys = list(cases)
    for i, key in enumerate(keys):
        case = cases[key]
        slice_end = t_phases + (i + 1) * (deadline_a - t_phases) / len(keys)
        hk = default_knobs(case, F.EPI_PLAIN)
        h = run(case, "A_default", case.plain, hk, F.EPI_PLAIN, check=True) if hk[0] in impls else None
        for g in grids[key]:
            if time.time() > slice_end or lost[0]:
                break
            if g != hk:
                run(case, "A_grid", case.plain, g, F.EPI_PLAIN, check=True)
        ok = [x for x in records if x["shape"] == case.name and x["M"] == case.m and x["phase"].startswith("A")
              and "us" in x and x.get("ok", True)]
        if ok:
            best[key] = min(ok, key=lambda x: x["us"])
            for impl in impls:
                mine = [x for x in ok if x["impl"] == impl]
                if mine:
                    best_impl[key + (impl,)] = min(mine, key=lambda x: x["us"])
            b = best[key]
            per = " | ".join(f"{impl} {best_impl[key + (impl,)]['us']:.2f}" for impl in impls if key + (impl,) in best_impl)
            print(f"A {case.name:6s} M={case.m:3d}: default {h['us'] if h and 'us' in h else float('nan'):7.2f} us | "
                  f"best {b['us']:7.2f} us {b['impl']} tm={b['tm']} s={b['splits']} st={b['stages']} "
                  f"({b['tbps']:.2f} TB/s, x{b['x_floor']:.2f} floor) | {per} [{len(ok)} ok]", flush=True)
        if lost[0]:
            break
    write()

    # ---- compile batch 2: diagnostics + fused variants at the best configs ------------------------------
    specs2 = set()
    for key, case in cases.items():
        for impl in impls:
            b = best_impl.get(key + (impl,))
            if b is None:
                continue
            for d in (1, 2, 3):
                specs2.add((impl, b["tm"], b["stages"], F.EPI_PLAIN, 1, d))
            if b["tm"] in F.token_blocks(impl, case.epi):
                specs2.add((impl, b["tm"], b["stages"], case.epi, b["minb"], 0))
            for kn in option_knobs(knobs_of(b)):  # wgmma options: plain (phase A2) and fused (phase C)
                p_, r_ = _opts(kn)
                r_ = r_ if kn[2] > 1 else "global"
                specs2.add((impl, kn[1], kn[3], F.EPI_PLAIN, kn[4], 0, p_, r_))
                if kn[1] in F.token_blocks(impl, case.epi):
                    specs2.add((impl, kn[1], kn[3], case.epi, kn[4], 0, p_, r_))
        if case.m == 1 and "wgmma" in impls:
            for st in (2, 4, 8):
                specs2.add(("wgmma", 8, st, F.EPI_PLAIN, 1, 1))
    t_compile2 = compile_all(specs2, dev, comp_err) if not lost[0] else 0.0
    meta["compile2_s"] = t_compile2

    # ---- phase A2: wgmma options (pipe, cluster reduce) at each case's best wgmma config ------------------
    for key, case in cases.items():
        if lost[0] or time.time() > deadline_b:
            break
        b = best_impl.get(key + ("wgmma",))
        if b is None:
            continue
        for kn in option_knobs(knobs_of(b)):
            r = run(case, "A_opt", case.plain, kn, F.EPI_PLAIN, check=True)
            if r and "us" in r and r.get("ok", True):
                if r["us"] < best_impl[key + ("wgmma",)]["us"]:
                    best_impl[key + ("wgmma",)] = r
                if r["us"] < best[key]["us"]:
                    best[key] = r
        bw = best_impl[key + ("wgmma",)]
        print(f"A2 {case.name:6s} M={case.m:3d}: best wgmma {bw['us']:.2f} us pipe={bw.get('pipe', 0)} "
              f"reduce={bw.get('reduce', 'global')}", flush=True)
    write()

    # ---- phase B: diagnostics ------------------------------------------------------------------------------
    for key, case in cases.items():
        if lost[0] or time.time() > deadline_b:
            break
        if key in best:
            run(case, "B_pdl", case.plain, knobs_of(best[key]), F.EPI_PLAIN, pdl=True, at="best")
        for impl in impls:
            b = best_impl.get(key + (impl,))
            if b is None:
                continue
            for d in (1, 2, 3):
                run(case, "B_diag", case.plain, (impl, b["tm"], b["splits"], b["stages"], 1), F.EPI_PLAIN, diag=d,
                    at=f"best_{impl}")
                if d == 3 and impl == "wgmma" and b["tm"] <= F.PIPE_MAX_TM:  # consumer cost with pipe=1
                    run(case, "B_diag", case.plain, (impl, b["tm"], b["splits"], b["stages"], 1, 1, "global"),
                        F.EPI_PLAIN, diag=d, at="best_wgmma_pipe1")
        if case.m == 1 and "wgmma" in impls:
            for s in splits_for(case.n, case.k, 1, 8, sms):
                gmax = -(-(case.k // 128) // s)
                for st in sorted({min(x, max(2, gmax)) for x in (2, 4, 8)}):
                    if time.time() < deadline_b:
                        run(case, "B_stream", case.plain, ("wgmma", 8, s, st, 1), F.EPI_PLAIN, diag=1)
    write()

    # ---- phase C: fused ops ------------------------------------------------------------------------------------
    for key, case in cases.items():
        if lost[0] or time.time() > deadline:
            break
        if case.epi == F.EPI_PLAIN:  # a plain linear: phase A is its op
            continue
        fused = Fused(case, cfg, dev, gen)
        seen = set()
        cands = [("default", default_knobs(case, case.epi))]
        cands += [(f"best_{impl}", knobs_of(best_impl[key + (impl,)])) for impl in impls if key + (impl,) in best_impl]
        if key + ("wgmma",) in best_impl:  # the fused epilogue with each wgmma option at the best wgmma config
            base_kn = knobs_of(best_impl[key + ("wgmma",)])[:5]
            cands += [("opt_p{}_{}".format(*_opts(kn)), kn) for kn in option_knobs(base_kn)]
        for label, kn in cands:
            if kn in seen or kn[0] not in impls or kn[1] not in F.token_blocks(kn[0], case.epi):
                continue
            seen.add(kn)
            run(case, "C_fused", fused, kn, case.epi, at=label)
        if case.epi == F.EPI_QKV_A and key in best:  # B0 split mode: plain GEMM at the best config + row kernel
            run(case, "C_split", fused.split, knobs_of(best[key]), F.EPI_PLAIN, pdl=True, at="best")
            dk = default_knobs(case, F.EPI_PLAIN)
            if dk != knobs_of(best[key]) and dk[0] in impls:
                run(case, "C_split", fused.split, dk, F.EPI_PLAIN, pdl=True, at="default")
    write()

    table = make_table(records, cases, best, sms, meta["device"])
    tpath = args.out / f"fp8_gemm_sm90_{sms}sm.json"
    tpath.write_text(json.dumps(table, indent=1) + "\n")
    md = summarize(meta, records, cases, best, best_impl, impls, bps, table)
    (args.out / "fp8_gemm_sweep.md").write_text(md)
    print(md)
    print(f"total {time.time() - t_start:.1f} s; wrote {args.out}/fp8_gemm_sweep.json, .md and {tpath.name}", flush=True)
    return 1 if lost[0] else 0


def make_table(records: list[dict], cases: dict, best: dict, sms: int, device: str) -> dict:
    """Tuned-table JSON: per (epilogue, shape, M) the fastest correct config (plain: phase A; fused:
    phase C without PDL, else the best plain config)."""
    entries = []
    for (name, m), case in sorted(cases.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        b = best.get((name, m))
        if b is None:
            continue
        entries.append(_entry(F.EPI_NAMES[F.EPI_PLAIN], case, b))
        if case.epi == F.EPI_PLAIN:  # a plain linear: one entry
            continue
        fused = [r for r in records if r["shape"] == name and r["M"] == m and r["phase"] == "C_fused" and "us" in r
                 and not r["pdl"]]
        fb = min(fused, key=lambda r: r["us"]) if fused else b
        if fb["tm"] in F.token_blocks(fb["impl"], case.epi):
            entries.append(_entry(F.EPI_NAMES[case.epi], case, fb))
    entries.sort(key=lambda e: (list(F.EPI_NAMES.values()).index(e["epi"]), -e["n"], e["k"], e["m_max"]))
    return {"source": f"benchmarks/fp8_gemm_sweep.py on {device} ({sms} SMs), "
                      f"{_dt.date.today().isoformat()}: fastest measured config per (epilogue, shape, M bucket)",
            "arch": "sm_90", "num_sms": sms, "entries": entries}


def _entry(epi_name: str, case: Case, r: dict) -> dict:
    return {"epi": epi_name, "n": case.n, "k": case.k, "m_max": case.m, "impl": r["impl"], "tm": r["tm"],
            "splits": r["splits"], "stages": r["stages"], "minb": r["minb"], "us": round(r["us"], 2),
            **({"pipe": r["pipe"]} if r.get("pipe", 0) else {}),
            **({"reduce": r["reduce"]} if r.get("reduce", "global") != "global" and r["splits"] > 1 else {})}


def summarize(meta, records, cases, best, best_impl, impls, bps, table) -> str:
    def get(case, **kw):
        for r in records:
            if r["shape"] == case.name and r["M"] == case.m and "us" in r and all(r.get(a) == v for a, v in kw.items()):
                return r
        return None

    def us(r):
        return f"{r['us']:.2f}" if r else "-"

    def cfgs(r):
        return f"{r['impl']} {r['tm']}/{r['splits']}/{r['stages']}" if r else "-"

    lines = [f"# fp8_gemm skinny sweep ({meta['device']}, {meta['date']})", "",
             f"copy bandwidth {bps / 1e12:.3f} TB/s (floor = weight+act+out bytes / that); impls {', '.join(impls)}; "
             f"compile {meta['compile_s']:.0f} + {meta.get('compile2_s', 0):.0f} s; compile failures: "
             f"{len(meta['compile_errors'])}; wgmma probe: {str(meta['probe'])[:300]}", ""]
    for n in meta["notes"]:
        lines.append(f"**{n}**")
    lines += ["", "## Plain GEMM (us): default config, best per impl, best overall; config = impl tm/splits/stages", "",
              "| shape | M | floor | default | best mma | best wgmma | best | TB/s | x floor | target | best+PDL | bad |",
              "|" + "---|" * 12]
    for key, case in cases.items():
        fl = case.bytes / bps * 1e6
        target = max(1.3 * fl, 2.5)
        h = get(case, phase="A_default")
        b = best.get(key)
        bm, bw = best_impl.get(key + ("mma",)), best_impl.get(key + ("wgmma",))
        bad = sum(1 for r in records if r["shape"] == case.name and r["M"] == case.m and r.get("ok") is False)
        lines.append(f"| {case.name} | {case.m} | {fl:.2f} | {us(h)} ({cfgs(h)}) | {us(bm)} ({cfgs(bm)}) | "
                     f"{us(bw)} ({cfgs(bw)}) | {us(b)} | {b['tbps'] if b else 0:.2f} | {b['x_floor'] if b else 0:.2f} | "
                     f"{target:.2f}{' ok' if b and b['us'] <= target else ''} | {us(get(case, phase='B_pdl'))} | {bad} |")
    lines += ["", "## Diagnostics at each impl's best config (us): loads only = the ring alone (TB/s of weights), "
              "no reduce, no loads (MMA + promotion)", "",
              "| shape | M | impl | full | loads only | loads-only TB/s | no reduce | no loads |", "|---|---|---|---|---|---|---|---|"]
    for key, case in cases.items():
        for impl in impls:
            b = best_impl.get(key + (impl,))
            if not b:
                continue
            lo = get(case, phase="B_diag", at=f"best_{impl}", diag="loads_only")
            lines.append(f"| {case.name} | {case.m} | {impl} | {us(b)} | {us(lo)} | {lo['tbps'] if lo else 0:.2f} | "
                         f"{us(get(case, phase='B_diag', at=f'best_{impl}', diag='no_reduce'))} | "
                         f"{us(get(case, phase='B_diag', at=f'best_{impl}', diag='no_loads'))} |")
    lines += ["", "## wgmma streaming (loads only, tm=8, M=1): us (TB/s) by splits/stages", ""]
    for key, case in cases.items():
        rs = [r for r in records if r["shape"] == case.name and r["M"] == case.m and r["phase"] == "B_stream" and "us" in r]
        if rs:
            bs = min(rs, key=lambda r: r["us"])
            lines.append(f"- {case.name}: best {bs['us']:.2f} us ({bs['tbps']:.2f} TB/s) at s={bs['splits']} "
                         f"st={bs['stages']}; " + " ".join(f"{r['splits']}/{r['stages']}:{r['us']:.1f}({r['tbps']:.2f})"
                                                          for r in rs))
    lines += ["", "## Fused ops (us, PDL off)", "", "| shape | M | default | at best mma | at best wgmma | B0 split+PDL (best plain) |",
              "|---|---|---|---|---|---|"]
    for key, case in cases.items():
        rs = [r for r in records if r["shape"] == case.name and r["M"] == case.m and r["phase"] == "C_fused" and "us" in r]
        pick = lambda at: next((r for r in rs if r.get("at") == at), None)  # noqa: E731
        sp = get(case, phase="C_split", at="best")
        lines.append(f"| {case.name} | {case.m} | {us(pick('default'))} ({cfgs(pick('default'))}) | {us(pick('best_mma'))} | "
                     f"{us(pick('best_wgmma'))} | {us(sp)} |")
    lines += ["", f"## Tuned table ({len(table['entries'])} entries; copy fp8_gemm_sm90_{meta['sms']}sm.json to "
              "glm5_fastpath/ops/tuned/)", "", "| epi | n | k | m_max | impl | tm | splits | stages | us |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in table["entries"]:
        lines.append(f"| {e['epi']} | {e['n']} | {e['k']} | {e['m_max']} | {e['impl']} | {e['tm']} | {e['splits']} | "
                     f"{e['stages']} | {e['us']} |")
    errs = [r for r in records if "error" in r or r.get("ok") is False]
    if errs:
        lines += ["", f"## Errors / wrong results ({len(errs)})", ""]
        for r in errs[:40]:
            lines.append(f"- {r['phase']} {r['shape']} M={r['M']} {r['impl']} tm={r['tm']} s={r['splits']} st={r['stages']} "
                         f"mb={r['minb']} diag={r['diag']}: {r.get('error', 'rel_err=%.3g' % r.get('rel_err', -1))}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(3)
