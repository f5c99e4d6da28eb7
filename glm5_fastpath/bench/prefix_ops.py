"""`glm5-fastpath bench prefix-ops`: every attention-prefix op, ours vs stock vs its floor.

For each op A0 B0 C0 B1 D1 D0 D2 E1 E2 and each M (decode tokens, M independent sequences of
--kv-len context each, built by testing.decode_step.make_decode_step):

- ours: `glm5_fastpath.ops.<name>` with the reference's signature (ref/prefix.py); a missing
  attribute is recorded "not built", an exception "error" — the run goes on;
- stock: the SGLang-equivalent row of bench/stock_prefix.py (DeepGEMM / cuBLAS / torch.compile);
- bytes and floor of our fused op (cost.fused_prefix_costs), at the copy bandwidth measured in the
  same run and at the project constant 4.27 TB/s; time / floor; speedup = stock / ours.

Before timing, each implementation runs once on set 0 against the reference (computed once on the
device for all sequences with ref.prefix.attention_prefix); cache slots it must write are poisoned
first; the relative errors are recorded (a failing check is flagged, the timing still runs). Timing
is bench/timing.py: CUDA-graph replays over rotating input sets (weights included) > 2x L2.

C0 and B1 are compared together: SGLang runs the wk GEMM and weights_proj as ONE bf16 GEMM (the
stock C0 row), and B1's stock row is only its post kernel; the "C0+B1" row compares our C0 + B1
against stock GEMM + post. E2's stock row is SGLang's fused top-k when sgl_kernel imports (stock_prefix.E2_SGLANG),
else a torch.topk stand-in, far slower than SGLang's fused
top-k, so the sums are given with and without E2.

Robustness: on a GPU the work runs in a worker subprocess that streams one JSON line per (op, M);
if it dies (sticky CUDA error, segfault, hang past the budget) the parent records the op it was
on and restarts a worker for the rest. A soft time budget (--budget-s) skips what is left once
spent. Output (--out DIR, flat): prefix_ops.json, prefix_ops.md, prefix_ops.png (if matplotlib
is installed), prefix_ops.log.

Test hook: GLM5_FASTPATH_BENCH_CRASH=OP:M makes the worker exit abruptly when it reaches (OP, M).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from .. import cost
from ..config import Glm5Config
from ..ref import fp8
from ..testing.numerics import THRESHOLDS, rel_err, topk_overlap
from .meta import git_commit, utc_now
from .stock_prefix import E2_STANDIN, Impl, StockPrefix, deep_gemm_info, prewarm_jobs, start_prewarm, wait_prewarm
from .timing import (CudaContextLost, assert_not_all_zero, cuda_context_error, l2_cache_bytes, measure_copy_bandwidth,
                     plan_rotation, time_launches)

OPS = ("A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2")
DEFAULT_M = (1, 16, 64, 128, 256)
OURS_ATTR = {"A0": "add_rmsnorm_quant", "B0": "b0_qkv_a", "C0": "c0_head_gate", "B1": "b1_indexer_k",
             "D1": "d1_indexer_q", "D0": "d0_q_b", "D2": "d2_absorb_and_kv_store", "E1": "e1_indexer_logits",
             "E2": "e2_topk"}
# the reference module names A0 differently; accepted so `--ours-module glm5_fastpath.ref.prefix` works
OURS_ALIASES = {"A0": ("a0_add_rmsnorm_quant",)}
# stock rows of prefix_costs(b1_c0="sglang_fused", split_rope=True) that each stock op runs (unfused bytes)
STOCK_ROWS = {"A0": ("A0.norm", "A0.quant"), "B0": ("B0.gemm", "B0.q_a_norm", "B0.kv_a_norm"),
              "C0": ("C0+B1.gemm",), "B1": ("B1.post",), "D1": ("D1.quant", "D1.gemm", "D1.post"),
              "D0": ("D0.quant", "D0.gemm", "rope.q"), "D2": ("D2.bmm", "rope.k", "kv_store"),
              "E1": ("E1.logits",), "E2": ("E2.topk",)}
NOT_COMPARABLE = {"C0": "stock C0 is the fused 6144->160 GEMM (C0 + B1's GEMM): see row C0+B1",
                  "B1": "stock B1 is only the post kernel (its GEMM is in stock C0): see row C0+B1"}
SUM_M = 16
KILL_GRACE_S = 30.0  # a worker still busy this long after the budget is killed
CONST_BW = cost.H200_COPY_BW
FILES = ("prefix_ops.json", "prefix_ops.md", "prefix_ops.png", "prefix_ops.log")


# ---- options ------------------------------------------------------------------------------------------


@dataclass
class Options:
    ms: tuple[int, ...] = DEFAULT_M
    kv_len: int = 8192
    ops: tuple[str, ...] = OPS
    out: str | None = None
    stock: bool = True
    device: str = "auto"
    preset: str = "glm5"
    seed: int = 0
    replays: int = 20
    min_launches: int = 20
    max_sets: int = 512
    min_sequences: int = 128  # sequences built on a GPU (>= max M): distinct KV pages to rotate E1 over
    isolate: bool | None = None  # None: on a GPU yes
    budget_s: float = 200.0
    deadline: float | None = None  # absolute time.time(); set by the parent
    max_restarts: int = 3
    prewarm_procs: int = 10
    profile: bool = True
    stock_dynamic: bool = False
    ours_module: str = "glm5_fastpath.ops"
    dry_run: bool = False

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, s: str) -> "Options":
        d = json.loads(s)
        for k in ("ms", "ops"):
            d[k] = tuple(d[k])
        return cls(**d)


def parse_list(s: str, kind=str) -> tuple:
    return tuple(kind(x.strip()) for x in s.split(",") if x.strip())


def validate(opts: Options) -> Options:
    bad = [o for o in opts.ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown ops {bad}; choose from {','.join(OPS)}")
    if not opts.ms or any(m < 1 for m in opts.ms):
        raise ValueError(f"--m needs positive token counts, got {opts.ms}")
    if opts.kv_len < 1:
        raise ValueError(f"--kv-len must be >= 1, got {opts.kv_len}")
    # keep the table order whatever order the user typed
    return replace(opts, ops=tuple(o for o in OPS if o in opts.ops), ms=tuple(sorted(set(opts.ms))))


# ---- logging ----------------------------------------------------------------------------------------------


class Log:
    """Progress lines to stdout (flushed) and to prefix_ops.log when --out is given."""

    def __init__(self, out_dir: str | None, t0: float | None = None):
        self.t0 = time.time() if t0 is None else t0
        self.path = Path(out_dir) / "prefix_ops.log" if out_dir else None

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


# ---- the data every implementation reads -------------------------------------------------------------------


def indexer_layer(cfg: Glm5Config) -> int:
    """The first MoE layer that runs the full indexer (experts are generated lazily there)."""
    for layer in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        if cfg.is_full_indexer_layer(layer):
            return layer
    raise ValueError(f"config {cfg.source} has no full-indexer MoE layer")


class PrefixData:
    """Weights, decode-step inputs and reference outputs of all sequences, on the device.

    Set j of an op at batch M uses sequences rows(M, j) (cycling through the distinct_sets(M)
    disjoint groups, so E1's KV pages rotate too); activations are cloned per set, weights are
    copied per set through copy_of (freed by clear_copies after each op and M).
    """

    def __init__(self, cfg: Glm5Config, device: str, n_seq: int, kv_len: int, seed: int, log: Callable[[str], None]):
        from ..ref.prefix import _bf16_gemm, attention_prefix, b1_indexer_k
        from ..ref.rope import rope_cos_sin
        from ..testing.decode_step import make_decode_step
        from ..weights import random_layer

        self.cfg, self.device, self.n_seq, self.kv_len = cfg, device, n_seq, kv_len
        dev = torch.device(device)
        t0 = time.time()
        self.layer = indexer_layer(cfg)
        self.w = random_layer(cfg, self.layer, seed=seed, device=dev).attn
        log(f"setup: weights of layer {self.layer} on {device} ({time.time() - t0:.1f} s)")
        t0 = time.time()
        self.step = make_decode_step(cfg, [kv_len] * n_seq, seed=seed, device=dev)
        log(f"setup: {n_seq} sequences x KV {kv_len} (make_decode_step, {time.time() - t0:.1f} s)")
        t0 = time.time()
        s = self.step
        out = attention_prefix(s.hidden, s.residual, s.positions, s.out_cache_loc, s.seq_lens, s.block_table, self.w,
                               cfg, s.kv_cache, s.index_k_cache, layer=self.layer)
        t = dict(out.tensors)
        t["hidden"], t["residual"] = s.hidden, s.residual
        idx = self.w.indexer
        t["key_bf16"] = _bf16_gemm(t["x_bf16"], idx.wk.dequant().to(torch.bfloat16))
        scratch = fp8.new_index_k_cache(-(-n_seq // 64), cfg.index_head_dim, device=dev)
        t["index_k_fp8_bf16path"], t["index_k_scale_bf16path"] = b1_indexer_k(
            t["x_bf16"], None, None, idx, s.positions, torch.arange(n_seq, device=dev), scratch, cfg, gemm="bf16")
        t["kv_new"] = s.kv_cache[s.out_cache_loc.long()].clone()
        self.t = t
        r = cfg.qk_rope_head_dim
        cos, sin = rope_cos_sin(torch.arange(int(s.positions.max()) + 1, device=dev), r, cfg.rope_theta)
        self.cos_sin = torch.cat([cos, sin], dim=-1).contiguous()
        self._copies: dict[tuple[str, int], Any] = {}
        self._sync()
        log(f"setup: reference prefix for all {n_seq} sequences ({time.time() - t0:.1f} s)")

    def _sync(self) -> None:
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()

    def distinct_sets(self, M: int) -> int:
        return max(1, self.n_seq // M)

    def rows(self, M: int, j: int) -> tuple[int, int]:
        if M > self.n_seq:
            raise ValueError(f"M={M} > {self.n_seq} sequences built")
        a = (j % self.distinct_sets(M)) * M
        return a, a + M

    def take(self, name: str, M: int, j: int) -> torch.Tensor:
        a, b = self.rows(M, j)
        return self.t[name][a:b].clone()

    def copy_of(self, key: str, j: int, factory: Callable[[], Any]) -> Any:
        k = (key, j)
        if k not in self._copies:
            self._copies[k] = factory()
        return self._copies[k]

    def clear_copies(self) -> None:
        self._copies.clear()

    def restore_caches(self) -> None:
        """Put the reference's current-token entries back (checks of earlier ops overwrote them)."""
        s = self.step
        fp8.index_k_cache_store(s.index_k_cache, s.out_cache_loc, self.t["index_k_fp8"], self.t["index_k_scale"])
        s.kv_cache[s.out_cache_loc.long()] = self.t["kv_new"]

    def poison_index_k(self, loc: torch.Tensor) -> None:
        n, d = loc.numel(), self.cfg.index_head_dim
        nan8 = torch.full((n, d), 0xFF, dtype=torch.uint8, device=loc.device).view(fp8.FP8)
        fp8.index_k_cache_store(self.step.index_k_cache, loc, nan8, torch.full((n,), float("nan"), device=loc.device))

    def poison_kv(self, loc: torch.Tensor) -> None:
        self.step.kv_cache[loc.long()] = float("nan")

    @staticmethod
    def mask_logits(logits: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Logits at live positions (0 elsewhere: kernels leave those columns unwritten or -inf)."""
        t = torch.arange(logits.shape[1], device=logits.device)
        return torch.where(t[None, :] < seq_lens.view(-1, 1).long(), logits.float(), torch.zeros((), device=logits.device))


# ---- our ops ----------------------------------------------------------------------------------------------------


def find_ours(op: str, registry: Mapping[str, Any] | None = None, module: str = "glm5_fastpath.ops"):
    """(callable or None, why not). registry overrides the module (tests)."""
    names = (OURS_ATTR[op],) + OURS_ALIASES.get(op, ())
    if registry is not None:
        for n in names:
            if registry.get(n) is not None:
                return registry[n], ""
        return None, f"not built (no {OURS_ATTR[op]} in the given registry)"
    try:
        import importlib

        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        return None, f"not built ({module} does not import: {type(e).__name__}: {str(e)[:200]})"
    for n in names:
        fn = getattr(mod, n, None)
        if callable(fn):
            return fn, ""
    # an op module the package does not re-export yet: <module>.<name>.<name>
    sub = f"{module}.{OURS_ATTR[op]}"
    try:
        fn = getattr(importlib.import_module(sub), OURS_ATTR[op], None)
    except ModuleNotFoundError as e:
        if e.name != sub:
            return None, f"not built ({sub} does not import: {e})"
        fn = None
    except Exception as e:  # noqa: BLE001
        return None, f"not built ({sub} does not import: {type(e).__name__}: {str(e)[:200]})"
    if callable(fn):
        return fn, ""
    return None, f"not built ({module}.{OURS_ATTR[op]} does not exist yet)"


def _get(out: Any, name: str, index: int) -> torch.Tensor:
    if isinstance(out, Mapping):
        return out[name]
    if hasattr(out, name):
        return getattr(out, name)
    return out[index]


def build_ours(op: str, fn: Callable, d: PrefixData, module: str) -> Impl:
    """An Impl calling our op with the reference's signature (ref/prefix.py) on set j's inputs."""
    c, w = d.cfg, d.w
    idx = w.indexer
    t = d.t

    def pos(M, j):
        a, b = d.rows(M, j)
        return d.step.positions[a:b].clone()

    def loc(M, j):
        a, b = d.rows(M, j)
        return d.step.out_cache_loc[a:b].clone()

    def ref(names_kinds):
        def expected(M, rows):
            a, b = rows
            out = {}
            for name, key, kind in names_kinds:
                v = t[key][a:b]
                out[name] = (v.float() if v.dtype == fp8.FP8 else v, kind)
            return out
        return expected

    def lin(key, L, j):
        return d.copy_of("ours." + key, j, lambda: type(L)(L.weight.clone(), L.scale_inv.clone()))

    poison = None
    avail: Callable[[int], int | None] = lambda M: None
    if op == "A0":
        def make_set(M, j):
            return d.take("hidden", M, j), d.take("residual", M, j), d.copy_of("ours.in", j, lambda: w.input_norm.clone())
        run = lambda h, r, g: fn(h, r, g, c.rms_norm_eps)
        results = lambda args, o: {"x": _get(o, "x", 0), "residual_out": _get(o, "residual_out", 1),
                                   "x_fp8": _get(o, "x_fp8", 2).float(), "x_scale": _get(o, "x_scale", 3)}
        expected = ref([("x", "x_bf16", "bf16"), ("residual_out", "residual_out", "bf16"),
                        ("x_fp8", "x_fp8", "fp8_same_quant"), ("x_scale", "x_scale", "bf16")])
    elif op == "B0":
        def make_set(M, j):
            wj = d.copy_of("ours.b0", j, lambda: replace(w, qkv_a=lin("qkv_a", w.qkv_a, j), q_a_norm=w.q_a_norm.clone(),
                                                          kv_a_norm=w.kv_a_norm.clone()))
            return d.take("x_fp8", M, j), d.take("x_scale", M, j), wj
        run = lambda x8, xs, wj: fn(x8, xs, wj, c)
        names = ("q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe")
        results = lambda args, o: {n: (_get(o, n, i).float() if n == "q_lora_fp8" else _get(o, n, i))
                                   for i, n in enumerate(names)}
        expected = ref([("q_lora", "q_lora", "bf16"), ("q_lora_fp8", "q_lora_fp8", "fp8_same_quant"),
                        ("q_lora_scale", "q_lora_scale", "bf16"), ("c_kv", "c_kv", "bf16"), ("k_pe", "k_pe", "bf16")])
    elif op == "C0":
        def make_set(M, j):
            return d.take("x_bf16", M, j), d.copy_of("ours.wp", j, lambda: idx.weights_proj.clone())
        run = fn
        results = lambda args, o: {"w_raw": o}
        expected = ref([("w_raw", "w_raw", "bf16")])
    elif op == "B1":
        def make_set(M, j):
            ij = d.copy_of("ours.b1", j, lambda: replace(idx, wk=lin("wk", idx.wk, j), k_norm_weight=idx.k_norm_weight.clone(),
                                                          k_norm_bias=idx.k_norm_bias.clone()))
            return (d.take("x_bf16", M, j), d.take("x_fp8", M, j), d.take("x_scale", M, j), ij, pos(M, j), loc(M, j),
                    d.step.index_k_cache, c)
        run = fn

        def results(args, o):
            k8c, sc = fp8.index_k_cache_load(d.step.index_k_cache, args[5], c.index_head_dim)
            return {"index_k_fp8": _get(o, "index_k_fp8", 0).float(), "index_k_scale": _get(o, "index_k_scale", 1),
                    "cache_k8": k8c.float(), "cache_scale": sc}
        expected = ref([("index_k_fp8", "index_k_fp8", "fp8_same_quant"), ("index_k_scale", "index_k_scale", "bf16"),
                        ("cache_k8", "index_k_fp8", "fp8_same_quant"), ("cache_scale", "index_k_scale", "bf16")])
        poison = lambda args: d.poison_index_k(args[5])
    elif op == "D1":
        def make_set(M, j):
            ij = d.copy_of("ours.d1", j, lambda: replace(idx, wq_b=lin("wq_b", idx.wq_b, j)))
            return d.take("q_lora_fp8", M, j), d.take("q_lora_scale", M, j), d.take("w_raw", M, j), ij, pos(M, j), c
        run = fn
        results = lambda args, o: {"index_q_fp8": _get(o, "index_q_fp8", 0).float(),
                                   "index_q_scale": _get(o, "index_q_scale", 1), "head_w": _get(o, "head_w", 2)}
        expected = ref([("index_q_fp8", "index_q_fp8", "fp8_same_quant"), ("index_q_scale", "index_q_scale", "bf16"),
                        ("head_w", "head_w", "bf16_chain")])
    elif op == "D0":
        def make_set(M, j):
            wj = d.copy_of("ours.d0", j, lambda: replace(w, q_b=lin("q_b", w.q_b, j)))
            return d.take("q_lora_fp8", M, j), d.take("q_lora_scale", M, j), wj, pos(M, j), c
        run = fn
        results = lambda args, o: {"q_nope": _get(o, "q_nope", 0), "q_pe": _get(o, "q_pe", 1)}
        expected = ref([("q_nope", "q_nope", "bf16"), ("q_pe", "q_pe", "bf16")])
    elif op == "D2":
        from ..attn_pre.cmp.executor import resolve_d2_weights

        d2_fp8 = resolve_d2_weights(w) == "fp8"  # GLM5_FASTPATH_D2_WEIGHTS: our D2 on the FP8 form of W_UK

        def make_set(M, j):
            wj = d.copy_of("ours.d2", j, lambda: replace(w, w_kc=None, w_kc_fp8=w.w_kc_fp8.clone(),
                                                          w_kc_scale=w.w_kc_scale.clone()) if d2_fp8
                           else replace(w, w_kc=w.w_kc.clone()))
            return (d.take("q_nope", M, j), d.take("c_kv", M, j), d.take("k_pe", M, j), wj, pos(M, j), loc(M, j),
                    d.step.kv_cache, c)
        run = fn
        results = lambda args, o: {"q_lat": o, "kv_new": d.step.kv_cache[args[5].long()]}
        expected = ref([("q_lat", "q_lat", "bf16"), ("kv_new", "kv_new", "bf16")])
        poison = lambda args: d.poison_kv(args[5])
    elif op == "E1":
        def make_set(M, j):
            a, b = d.rows(M, j)
            return (d.take("index_q_fp8", M, j), d.take("head_w", M, j), d.step.index_k_cache,
                    d.step.seq_lens[a:b].clone(), d.step.block_table[a:b].contiguous().clone(), c)
        # A fixed logits width (as a CUDA-graph user passes it) keeps our op free of host syncs.
        max_ctx = int(d.step.seq_lens.max().item())
        run = lambda *args: fn(*args, max_ctx=max_ctx)
        results = lambda args, o: {"logits": d.mask_logits(o, args[3])}

        def expected(M, rows):
            a, b = rows
            return {"logits": (d.mask_logits(t["logits"][a:b], d.step.seq_lens[a:b]), "fp8_same_quant")}
        avail = d.distinct_sets
    elif op == "E2":
        def make_set(M, j):
            a, b = d.rows(M, j)
            return d.take("logits", M, j), d.step.seq_lens[a:b].clone(), d.step.block_table[a:b].contiguous().clone()
        run = lambda lg, sl, bt: fn(lg, sl, bt, c.index_topk)
        results = lambda args, o: {"topk_slots": o}
        expected = ref([("topk_slots", "topk_slots", "topk")])
    else:
        raise ValueError(op)
    label = f"{getattr(fn, '__module__', module)}.{getattr(fn, '__name__', OURS_ATTR[op])}"
    return Impl(op, label, [label], make_set, run, results, expected, poison=poison, available_sets=avail)


# ---- checking and timing one implementation ---------------------------------------------------------------------


def compare(got: Mapping[str, torch.Tensor], exp: Mapping[str, tuple[torch.Tensor, str]]) -> dict[str, Any]:
    """Relative error (or top-k set overlap) of every expected output; ok when all are within THRESHOLDS."""
    errors: dict[str, float] = {}
    fails: list[str] = []
    kinds: dict[str, str] = {}
    for name, (ref_t, kind) in exp.items():
        kinds[name] = kind
        if name not in got:
            fails.append(f"{name}: not returned")
            continue
        o = got[name]
        if tuple(o.shape) != tuple(ref_t.shape):
            fails.append(f"{name}: shape {tuple(o.shape)} != reference {tuple(ref_t.shape)}")
            continue
        if kind == "topk":
            ov = topk_overlap(o, ref_t)
            errors[name] = ov
            if ov < 0.999:
                fails.append(f"{name}: top-k set overlap {ov:.5f} < 0.999")
            continue
        finite = bool(torch.isfinite(o.float()).all())
        e = rel_err(o.float(), ref_t.float()) if finite else float("nan")
        errors[name] = e
        tol = THRESHOLDS[kind]
        if not finite:
            fails.append(f"{name}: non-finite values (unwritten / poisoned outputs?)")
        elif not e <= tol:
            fails.append(f"{name}: rel_err {e:.3e} > {tol:.1e} ({kind})")
    return {"ok": not fails, "errors": errors, "kinds": kinds, "failures": fails}


def profile_kernels(fn: Callable[[], Any], device: str) -> dict[str, Any]:
    """Names of the device kernels (and memsets/copies) one call launches, via torch.profiler."""
    if torch.device(device).type != "cuda":
        return {"kernels": [], "note": "not profiled on CPU"}
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name[:120] for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CUDA]
        return {"kernels": names, "count": len(names)}
    except Exception as e:  # noqa: BLE001
        return {"kernels": [], "note": f"profiler failed: {type(e).__name__}: {str(e)[:200]}"}


def _short_exc(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb))
    return f"{type(e).__name__}: {str(e)[:400]} [{where}]"


def run_impl(impl: Impl, d: PrefixData, M: int, set_bytes: float, opts: Options, *, profile: bool) -> dict[str, Any]:
    """Check on set 0, then time; every failure becomes a recorded status. Raises only CudaContextLost."""
    rec: dict[str, Any] = {"status": "ok", "label": impl.label}
    if impl.skip_reason:
        return {"status": "skipped", "label": impl.label, "reason": impl.skip_reason}
    dev = d.device
    cuda = torch.device(dev).type == "cuda"
    stage = "building inputs"
    try:
        l2 = l2_cache_bytes(dev)
        plan = plan_rotation(set_bytes, l2, min_launches=opts.min_launches, max_sets=opts.max_sets,
                             available_sets=impl.available_sets(M))
        rec["rotation"] = plan.to_dict()
        sets = [impl.make_set(M, j) for j in range(plan.sets)]
        assert_not_all_zero({f"arg{i}": a for i, a in enumerate(sets[0]) if isinstance(a, torch.Tensor)},
                            f"{impl.op} M={M}")
        stage = "check run"
        d.restore_caches()
        if impl.poison is not None:
            impl.poison(sets[0])
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        out = impl.run(*sets[0])
        if cuda:
            torch.cuda.synchronize()
            rec["peak_alloc_bytes_per_call"] = alloc = int(torch.cuda.max_memory_allocated() - base)
            if impl.poison is not None and alloc > 256 << 20:
                rec.setdefault("notes", []).append(
                    f"allocates {alloc / 2**20:.0f} MiB per call: the cache update is NOT in place (a copy of the cache?)")
        stage = "comparing with the reference"
        rec["check"] = compare(impl.results(sets[0], out), impl.expected(M, d.rows(M, 0)))
        del out
        stage = "timing"
        tm = time_launches(lambda i: impl.run(*sets[i % plan.sets]), plan.launches, device=dev, replays=opts.replays)
        rec["timing"] = tm.to_dict()
        if profile:
            stage = "profiling"
            rec["profile"] = profile_kernels(lambda: impl.run(*sets[0]), dev)
        notes = getattr(impl, "notes", lambda: [])()
        if notes:
            rec.setdefault("notes", []).extend(notes)
        if not rec["check"]["ok"]:
            rec["status"] = "check failed"
    except CudaContextLost:
        raise
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec.update(status="error", reason=f"{stage}: {_short_exc(e)}")
        if isinstance(e, torch.OutOfMemoryError) and cuda:
            torch.cuda.empty_cache()
        err = cuda_context_error(dev)
        if err is not None:
            raise CudaContextLost(f"{impl.op} M={M} ({impl.label}): {rec['reason']}; context: {err}") from e
    finally:
        sets = None  # noqa: F841 - free this pair's buffers
        d.clear_copies()
    return rec


# ---- the worker: all pairs in this process -------------------------------------------------------------------


def _meta(opts: Options, dev: str, cfg: Glm5Config) -> dict[str, Any]:
    m: dict[str, Any] = {"date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
                         "cuda": torch.version.cuda, "device": dev, "preset": opts.preset, "kv_len": opts.kv_len,
                         "ms": list(opts.ms), "ops": list(opts.ops), "replays": opts.replays,
                         "min_launches": opts.min_launches, "max_sets": opts.max_sets,
                         "const_bw_Bps": CONST_BW, "stock": opts.stock, "stock_torch_compile_dynamic": opts.stock_dynamic,
                         "ours_module": opts.ours_module, "hidden_size": cfg.hidden_size}
    try:
        import triton

        m["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        m["triton"] = None
    if torch.device(dev).type == "cuda":
        p = torch.cuda.get_device_properties(torch.device(dev))
        m.update(gpu=torch.cuda.get_device_name(torch.device(dev)), sm_count=p.multi_processor_count,
                 l2_bytes=l2_cache_bytes(dev))
    else:
        m.update(gpu="CPU (dry run)", sm_count=None, l2_bytes=0)
    return m


def worker_run(opts: Options, pairs: list[tuple[str, int]], emit: Callable[[dict], None], log: Callable[[str], None],
               registry: Mapping[str, Any] | None = None) -> None:
    """Set up once, then every (op, M) pair: emit {"type": "meta"}, then "start"/"pair" records."""
    dev = opts.resolved_device()
    cuda = torch.device(dev).type == "cuda"
    cfg = Glm5Config.preset(opts.preset)
    crash = os.environ.get("GLM5_FASTPATH_BENCH_CRASH", "")
    deadline = opts.deadline if opts.deadline is not None else time.time() + opts.budget_s
    meta = _meta(opts, dev, cfg)
    prewarm = []
    if opts.stock and cuda and opts.prewarm_procs > 0 and any(o in opts.ops for o in ("B0", "D1", "D0", "E1")):
        info = deep_gemm_info()
        if info["available"]:
            jobs = prewarm_jobs(cfg, [M for M in opts.ms], opts.kv_len)
            prewarm = start_prewarm(jobs, opts.prewarm_procs, log)
            log(f"setup: DeepGEMM JIT prewarm of {len(jobs)} kernels in {len(prewarm)} background processes")
    if opts.stock:
        meta["deep_gemm"] = deep_gemm_info()
    meta["copy_bandwidth"] = measure_copy_bandwidth(dev, nbytes=(1 << 30) if cuda else (64 << 20))
    bw = meta["copy_bandwidth"]["bytes_per_s"]
    log(f"setup: measured copy bandwidth {bw / 1e12:.3f} TB/s (read + written)")
    n_seq = max(max(opts.ms), opts.min_sequences if cuda else 1)
    data = PrefixData(cfg, dev, n_seq, opts.kv_len, opts.seed, log)
    meta["sequences_built"] = n_seq
    stock, stock_err = None, ""
    if opts.stock:
        try:
            stock = StockPrefix(data, compile=None, use_deep_gemm=True)
        except Exception as e:  # noqa: BLE001 - every stock row then says why
            stock_err = f"stock rows could not be set up: {_short_exc(e)}"
            log(stock_err)
    if stock is not None and opts.stock_dynamic:
        for cmp in stock._c.values():
            if cmp._impl is not cmp.fn:
                cmp._impl = torch.compile(cmp.fn, dynamic=True)
    emit({"type": "meta", **meta})
    ours_cache: dict[str, tuple[Impl | None, str]] = {}
    stock_cache: dict[str, Impl | str] = {}
    prof_m = SUM_M if SUM_M in opts.ms else opts.ms[0]
    prewarm_waited = not prewarm
    for op, M in pairs:
        emit({"type": "start", "op": op, "M": M})
        if crash == f"{op}:{M}":
            os._exit(77)
        fused = {c.name: c for c in cost.fused_prefix_costs(cfg, M, opts.kv_len)}
        rows = {c.name: c for c in cost.prefix_costs(cfg, M, opts.kv_len, b1_c0="sglang_fused", split_rope=True)}
        nbytes = fused[op].bytes
        stock_bytes = sum(rows[r].bytes for r in STOCK_ROWS[op])
        rec: dict[str, Any] = {"type": "pair", "op": op, "M": M, "kv_len": opts.kv_len, "bytes": nbytes,
                               "stock_bytes_unfused": stock_bytes, "floor_us_measured_bw": nbytes / bw * 1e6,
                               "floor_us_const_bw": nbytes / CONST_BW * 1e6}
        if time.time() > deadline:
            reason = f"skipped: time budget of {opts.budget_s:.0f} s spent"
            rec["ours"] = {"status": "skipped", "reason": reason}
            rec["stock"] = {"status": "skipped", "reason": reason} if opts.stock else {"status": "off"}
            emit(rec)
            log(f"{op} M={M}: {reason}")
            continue
        # ours
        if op not in ours_cache:
            fn, why = find_ours(op, registry, opts.ours_module)
            try:
                ours_cache[op] = (build_ours(op, fn, data, opts.ours_module) if fn else None, why)
            except Exception as e:  # noqa: BLE001
                ours_cache[op] = (None, f"error building the call: {_short_exc(e)}")
        impl, why = ours_cache[op]
        if impl is None:
            rec["ours"] = {"status": "not built" if why.startswith("not built") else "error", "reason": why}
        else:
            rec["ours"] = run_impl(impl, data, M, nbytes, opts, profile=opts.profile and M == prof_m)
        # stock
        if stock is None:
            rec["stock"] = {"status": "error", "reason": stock_err} if stock_err else {"status": "off", "reason": "--no-stock"}
        else:
            if not prewarm_waited and op in ("B0", "D1", "D0", "E1"):
                log("waiting for the DeepGEMM JIT prewarm to finish...")
                meta_pw = wait_prewarm(prewarm, min(150.0, max(30.0, deadline - time.time())))
                log(f"prewarm done: {meta_pw}")
                prewarm_waited = True
            if op not in stock_cache:
                try:
                    stock_cache[op] = stock.build(op)
                except Exception as e:  # noqa: BLE001
                    stock_cache[op] = f"error building the stock row: {_short_exc(e)}"
            s_impl = stock_cache[op]
            if isinstance(s_impl, str):
                rec["stock"] = {"status": "error", "reason": s_impl}
            else:
                rec["stock"] = run_impl(s_impl, data, M, stock_bytes, opts, profile=opts.profile and M == prof_m)
                rec["stock"]["uses"] = s_impl.uses
        emit(rec)
        log(_progress_line(rec))
    if not prewarm_waited:
        wait_prewarm(prewarm, 1.0)


def _fmt_us(side: Mapping[str, Any]) -> str:
    if side.get("timing"):
        return f"{side['timing']['median_us']:8.2f} us"
    return f"{side.get('status', '?'):>11}"


def _progress_line(rec: Mapping[str, Any]) -> str:
    o, s = rec["ours"], rec["stock"]

    def chk(x):
        c = x.get("check")
        if not c:
            return (" (" + x.get("reason", "")[:90] + ")") if x.get("reason") else ""
        worst = max((v for v in c["errors"].values() if v == v), default=0.0)
        return " check ok" if c["ok"] else f" CHECK FAILED {c['failures'][:2]}" if worst else " check ?"
    return (f"{rec['op']:>3} M={rec['M']:<4} ours {_fmt_us(o)}{chk(o)} | stock {_fmt_us(s)}{chk(s)} | "
            f"floor {rec['floor_us_measured_bw']:.2f} us")


# ---- the parent: isolation and restarts -----------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a crash
    return out


def _failed_pair(op: str, M: int, reason: str, opts: Options) -> dict[str, Any]:
    side = {"status": "error", "reason": reason}
    return {"type": "pair", "op": op, "M": M, "kv_len": opts.kv_len, "ours": side,
            "stock": dict(side) if opts.stock else {"status": "off"}}


def run_isolated(opts: Options, pairs: list[tuple[str, int]], log: Log) -> tuple[dict, list[dict], list[str]]:
    """Run pairs in worker subprocesses; returns (meta, pair records, restart notes)."""
    remaining = list(pairs)
    done: dict[tuple[str, int], dict] = {}
    meta: dict[str, Any] = {}
    notes: list[str] = []
    deadline = opts.deadline
    hard_deadline = deadline + KILL_GRACE_S
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    attempt = 0
    while remaining and attempt <= opts.max_restarts:
        attempt += 1
        with tempfile.TemporaryDirectory(prefix="glm5_bench_") as tmp:
            jl = Path(tmp) / "records.jsonl"
            (Path(tmp) / "opts.json").write_text(opts.to_json())
            (Path(tmp) / "pairs.json").write_text(json.dumps(remaining))
            cmd = [sys.executable, "-m", "glm5_fastpath.bench.prefix_ops", "--worker", str(Path(tmp) / "opts.json"),
                   "--pairs", str(Path(tmp) / "pairs.json"), "--jsonl", str(jl), "--log-t0", str(log.t0)]
            tail: deque[str] = deque(maxlen=25)
            proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)

            def pump():
                for line in proc.stderr:
                    tail.append(line.rstrip())
                    sys.stderr.write(line)
            th = threading.Thread(target=pump, daemon=True)
            th.start()
            killed = ""
            while proc.poll() is None:
                if time.time() > hard_deadline:
                    proc.kill()
                    killed = f"killed: past the time budget (+{KILL_GRACE_S:.0f} s grace)"
                    break
                time.sleep(0.5)
            proc.wait()
            th.join(timeout=5)
            recs = _read_jsonl(jl)
        started = None
        for r in recs:
            if r.get("type") == "meta" and not meta:
                meta = {k: v for k, v in r.items() if k != "type"}
            elif r.get("type") == "start":
                started = (r["op"], r["M"])
            elif r.get("type") == "pair":
                done[(r["op"], r["M"])] = r
                started = None
            elif r.get("type") == "fatal":
                notes.append(f"worker {attempt}: fatal: {r.get('reason')}")
        rc = proc.returncode
        if rc != 0 or killed:
            why = killed or f"worker exited with code {rc}"
            last = " | ".join(x for x in list(tail)[-4:] if x)
            notes.append(f"worker {attempt}: {why}" + (f"; stderr tail: {last[-600:]}" if last else ""))
            if started is not None and started not in done:
                done[started] = _failed_pair(started[0], started[1], f"crashed the worker ({why}); "
                                             f"stderr tail: {last[-400:]}", opts)
                log(f"{started[0]} M={started[1]}: worker died ({why}); restarting for the rest")
            elif started is None and not any(r.get("type") == "pair" for r in recs):
                # died during setup: restarting would die the same way
                for p in remaining:
                    done.setdefault(p, _failed_pair(p[0], p[1], f"worker setup failed ({why}); stderr tail: {last[-400:]}",
                                                    opts))
                remaining = []
                break
            if killed:
                for p in remaining:
                    done.setdefault(p, _failed_pair(p[0], p[1], "skipped: " + killed, opts))
        remaining = [p for p in remaining if p not in done]
    for p in remaining:
        done[p] = _failed_pair(p[0], p[1], f"not run: gave up after {opts.max_restarts} restarts", opts)
    return meta, [done[p] for p in pairs if p in done], notes


# ---- assembling the report ----------------------------------------------------------------------------------------


def _t(side: Mapping[str, Any] | None) -> float | None:
    if side and side.get("timing") and side.get("status") in ("ok", "check failed"):
        return float(side["timing"]["median_us"])
    return None


def assemble(opts: Options, meta: Mapping[str, Any], records: list[dict], notes: list[str]) -> dict[str, Any]:
    bw = (meta.get("copy_bandwidth") or {}).get("bytes_per_s") or CONST_BW
    rows = []
    by = {(r["op"], r["M"]): r for r in records}
    for r in records:
        o, s = _t(r["ours"]), _t(r.get("stock"))
        b = r.get("bytes")
        row = {"op": r["op"], "M": r["M"], "ours_us": o, "stock_us": s, "bytes": b,
               "floor_us_measured_bw": r.get("floor_us_measured_bw"), "floor_us_const_bw": r.get("floor_us_const_bw"),
               "ours_status": r["ours"].get("status"), "stock_status": r.get("stock", {}).get("status")}
        fl = r.get("floor_us_measured_bw")
        row["ours_x_floor"] = o / fl if o and fl else None
        row["stock_x_floor"] = s / fl if s and fl else None
        row["speedup"] = s / o if (o and s and r["op"] not in NOT_COMPARABLE) else None
        if r["op"] in NOT_COMPARABLE:
            row["note"] = NOT_COMPARABLE[r["op"]]
        if r["op"] == "E2" and (r.get("stock") or {}).get("label", E2_STANDIN) == E2_STANDIN:
            row["note"] = E2_STANDIN
        rows.append(row)
    # C0+B1 combined rows
    for M in opts.ms:
        c0, b1 = by.get(("C0", M)), by.get(("B1", M))
        if not (c0 and b1):
            continue
        o = (_t(c0["ours"]) or 0) + (_t(b1["ours"]) or 0) if _t(c0["ours"]) and _t(b1["ours"]) else None
        s = (_t(c0.get("stock")) or 0) + (_t(b1.get("stock")) or 0) if _t(c0.get("stock")) and _t(b1.get("stock")) else None
        b = (c0.get("bytes") or 0) + (b1.get("bytes") or 0)
        fl = b / bw * 1e6
        rows.append({"op": "C0+B1", "M": M, "ours_us": o, "stock_us": s, "bytes": b, "floor_us_measured_bw": fl,
                     "floor_us_const_bw": b / CONST_BW * 1e6, "ours_x_floor": o / fl if o else None,
                     "stock_x_floor": s / fl if s else None, "speedup": s / o if o and s else None,
                     "note": "ours C0 + B1 vs stock fused 6144->160 bf16 GEMM + B1 post kernel"})
    sums = {}
    for M in opts.ms:
        rs = [by[(op, M)] for op in opts.ops if (op, M) in by]
        if not rs:
            continue
        entry: dict[str, Any] = {"ops": [r["op"] for r in rs]}
        for with_e2 in (True, False):
            sel = [r for r in rs if with_e2 or r["op"] != "E2"]
            key = "" if with_e2 else "_no_e2"
            ot = [_t(r["ours"]) for r in sel]
            st = [_t(r.get("stock")) for r in sel]
            entry["ours_us" + key] = sum(ot) if sel and all(x is not None for x in ot) else None
            entry["stock_us" + key] = sum(st) if sel and all(x is not None for x in st) else None
            entry["floor_us" + key] = sum(r.get("floor_us_measured_bw") or 0 for r in sel)
            entry["missing_ours" + key] = [r["op"] for r, x in zip(sel, ot) if x is None]
            entry["missing_stock" + key] = [r["op"] for r, x in zip(sel, st) if x is None]
            o, s = entry["ours_us" + key], entry["stock_us" + key]
            entry["speedup" + key] = s / o if o and s else None
        sums[str(M)] = entry
    stock_info = {}
    ours_info = {}
    for r in records:
        s = r.get("stock") or {}
        if r["op"] not in stock_info and s.get("label"):
            stock_info[r["op"]] = {"label": s.get("label"), "uses": s.get("uses", []), "notes": []}
        if r["op"] in stock_info:
            for n in s.get("notes", []):
                if n not in stock_info[r["op"]]["notes"]:
                    stock_info[r["op"]]["notes"].append(n)
        if s.get("profile") and r["op"] in stock_info:
            stock_info[r["op"]]["kernels_M%d" % r["M"]] = s["profile"]
        o = r["ours"]
        if r["op"] not in ours_info:
            ours_info[r["op"]] = {"status": o.get("status"), "label": o.get("label"), "reason": o.get("reason")}
        if o.get("profile"):
            ours_info[r["op"]]["kernels_M%d" % r["M"]] = o["profile"]
    return {"meta": dict(meta), "notes": notes, "stock_kernels": stock_info, "ours": ours_info, "rows": rows,
            "sums": sums, "records": records, "stock_e2_label": (stock_info.get("E2") or {}).get("label"),
            "method": ("per-op time = median over replays of a CUDA graph holding N launches of the op, divided by N; "
                       "the N launches rotate over input sets (weights, activations, KV pages) whose bytes exceed 2x L2 "
                       "where the op allows it (see records[].*.rotation); one stream; floor = the fused op's bytes "
                       "(cost.fused_prefix_costs) / bandwidth")}


# ---- rendering -----------------------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def _chk(side: Mapping[str, Any] | None) -> str:
    if not side:
        return ""
    c = side.get("check")
    if c is None:
        st = side.get("status", "")
        return st if st in ("off",) else (st + (": " + side.get("reason", "")[:80] if side.get("reason") else ""))
    worst = [f"{k} {v:.1e}" for k, v in c["errors"].items() if c["kinds"].get(k) != "topk" and v == v]
    top = [f"{k} {v:.4f}" for k, v in c["errors"].items() if c["kinds"].get(k) == "topk"]
    return ("ok" if c["ok"] else "FAIL") + " (" + ", ".join((worst + top)[:3]) + ")"


def render_markdown(rep: Mapping[str, Any]) -> str:
    m = rep["meta"]
    bw = (m.get("copy_bandwidth") or {}).get("bytes_per_s")
    dg = m.get("deep_gemm") or {}
    L = [f"# Attention-prefix ops: ours vs stock (SGLang-equivalent), {m.get('kv_len')} KV tokens per sequence", "",
         f"- GPU: {m.get('gpu')} ({m.get('sm_count')} SMs, L2 {((m.get('l2_bytes') or 0) / 2**20):.0f} MiB); date {m.get('date')}; "
         f"commit `{m.get('commit')}`",
         f"- torch {m.get('torch')} (CUDA {m.get('cuda')}), triton {m.get('triton')}, "
         f"deep_gemm {dg.get('version') or 'NOT AVAILABLE: ' + str(dg.get('reason', 'stock off'))}",
         f"- measured copy bandwidth {(_f(bw / 1e12, '.3f') if bw else '—')} TB/s (read + written); floors at that and at "
         f"{CONST_BW / 1e12:.2f} TB/s; preset {m.get('preset')}, {m.get('sequences_built')} sequences built",
         f"- method: {rep['method']}", ""]
    if rep.get("notes"):
        L += ["**Run notes:** " + "; ".join(rep["notes"]), ""]
    L += ["## Stock baseline: what each row runs", "", "| op | stock row | kernels seen (profiler, one call) | notes |",
          "|---|---|---|---|"]
    for op, info in rep["stock_kernels"].items():
        ks = [v for k, v in info.items() if k.startswith("kernels_M")]
        kn = ""
        if ks:
            names = ks[0].get("kernels", [])
            kn = f"{len(names)}: " + "; ".join(n[:60] for n in names[:6]) if names else ks[0].get("note", "")
        L.append(f"| {op} | {info['label']} | {kn} | {'; '.join(info.get('notes', []))} |")
    L += ["", "Ours: " + "; ".join(f"{op} {v.get('status')}" + (f" ({v.get('reason')[:70]})" if v.get("reason") else "")
                                     for op, v in rep["ours"].items()), ""]
    recs = {(r["op"], r["M"]): r for r in rep["records"]}
    ms = sorted({r["M"] for r in rep["rows"]})
    for M in ms:
        L += [f"## M = {M}", "",
              "| op | ours us | stock us | stock / ours | MB | floor us (measured BW) | floor us (4.27 TB/s) | "
              "ours / floor | stock / floor | check ours | check stock | note |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
        for r in [x for x in rep["rows"] if x["M"] == M]:
            rec = recs.get((r["op"], M), {})
            L.append(f"| {r['op']} | {_f(r['ours_us'])} | {_f(r['stock_us'])} | {_f(r['speedup'])} | "
                     f"{_f((r['bytes'] or 0) / 1e6, '.3g')} | {_f(r['floor_us_measured_bw'])} | {_f(r['floor_us_const_bw'])} | "
                     f"{_f(r['ours_x_floor'])} | {_f(r['stock_x_floor'])} | {_chk(rec.get('ours'))} | "
                     f"{_chk(rec.get('stock'))} | {r.get('note', '')} |")
        s = rep["sums"].get(str(M))
        if s:
            for key, what in (("", "sum, all ops"), ("_no_e2", "sum without E2")):
                L.append(f"| **{what}** | {_f(s['ours_us' + key])} | {_f(s['stock_us' + key])} | {_f(s['speedup' + key])} | "
                         f" | {_f(s['floor_us' + key])} | | | | missing ours: {','.join(s['missing_ours' + key]) or '-'} | "
                         f"missing stock: {','.join(s['missing_stock' + key]) or '-'} | |")
        L.append("")
    s = rep["sums"].get(str(SUM_M))
    if s:
        L += [f"## Headline at M = {SUM_M}", "",
              f"- all ops: ours {_f(s['ours_us'])} us vs stock {_f(s['stock_us'])} us -> {_f(s['speedup'])}x "
              f"(stock E2: {rep.get('stock_e2_label') or E2_STANDIN})",
              f"- without E2: ours {_f(s['ours_us_no_e2'])} us vs stock {_f(s['stock_us_no_e2'])} us -> "
              f"{_f(s['speedup_no_e2'])}x; floor {_f(s['floor_us_no_e2'])} us", ""]
    bad = [(r["op"], r["M"], side, r[side]) for r in rep["records"] for side in ("ours", "stock")
           if r.get(side, {}).get("status") not in ("ok", "off", None)]
    if bad:
        L += ["## Not measured / failed", ""]
        L += [f"- {op} M={M} {side}: {x.get('status')}: {x.get('reason', '') or '; '.join(x.get('check', {}).get('failures', []))}"
              for op, M, side, x in bad]
        L.append("")
    return "\n".join(L)


def render_stdout(rep: Mapping[str, Any]) -> str:
    L = []
    for M in sorted({r["M"] for r in rep["rows"]}):
        L.append(f"M={M}: {'op':>6} {'ours':>8} {'stock':>8} {'floor':>7} {'x':>6}")
        for r in [x for x in rep["rows"] if x["M"] == M]:
            L.append(f"{'':>{len(str(M)) + 3}} {r['op']:>6} {_f(r['ours_us']):>8} {_f(r['stock_us']):>8} "
                     f"{_f(r['floor_us_measured_bw']):>7} {_f(r['speedup']):>6}")
    s = rep["sums"].get(str(SUM_M))
    if s:
        L.append(f"sum M={SUM_M}: ours {_f(s['ours_us'])} stock {_f(s['stock_us'])} ({_f(s['speedup'])}x); "
                 f"w/o E2: ours {_f(s['ours_us_no_e2'])} stock {_f(s['stock_us_no_e2'])} ({_f(s['speedup_no_e2'])}x)")
    return "\n".join(L)


def render_png(rep: Mapping[str, Any], path: Path) -> str | None:
    """Bar chart per M (ours, stock, floor); returns why not when matplotlib is missing or fails."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"no PNG: matplotlib unavailable ({type(e).__name__})"
    try:
        ms = sorted({r["M"] for r in rep["rows"]})
        fig, axes = plt.subplots(len(ms), 1, figsize=(11, 2.8 * len(ms)), squeeze=False)
        for ax, M in zip(axes[:, 0], ms):
            rs = [r for r in rep["rows"] if r["M"] == M]
            xs = range(len(rs))
            for k, (key, lab) in enumerate((("ours_us", "ours"), ("stock_us", "stock"), ("floor_us_measured_bw", "floor"))):
                ax.bar([x + (k - 1) * 0.27 for x in xs], [r.get(key) or 0 for r in rs], width=0.27, label=lab)
            ax.set_xticks(list(xs))
            ax.set_xticklabels([r["op"] for r in rs])
            ax.set_yscale("log")
            ax.set_ylabel("us")
            ax.set_title(f"M = {M}, KV {rep['meta'].get('kv_len')}")
            ax.legend(fontsize=7)
        fig.suptitle(f"prefix ops on {rep['meta'].get('gpu')} ({rep['meta'].get('commit', '')[:12]})")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return None
    except Exception as e:  # noqa: BLE001
        return f"no PNG: {type(e).__name__}: {e}"


def write_outputs(rep: dict[str, Any], out: str | None, log: Callable[[str], None]) -> list[str]:
    if not out:
        return []
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "prefix_ops.json").write_text(json.dumps(rep, indent=1, default=str))
    (d / "prefix_ops.md").write_text(render_markdown(rep))
    why = render_png(rep, d / "prefix_ops.png")
    if why:
        log(why)
    return [str(p) for p in sorted(d.iterdir()) if p.name in FILES]


# ---- entry points --------------------------------------------------------------------------------------------------


def run_bench(opts: Options, *, registry: Mapping[str, Any] | None = None, log: Log | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the report (also written to opts.out)."""
    opts = validate(opts)
    if opts.out:
        Path(opts.out).mkdir(parents=True, exist_ok=True)
        (Path(opts.out) / "prefix_ops.log").write_text("")
    log = log or Log(opts.out)
    t0 = time.time()
    opts = replace(opts, deadline=opts.deadline or t0 + opts.budget_s)
    dev = opts.resolved_device()
    if opts.dry_run and opts.preset == "glm5" and dev == "cpu":
        log("dry run on CPU: using the small preset (GLM-5 shapes are too slow for the CPU reference)")
        opts = replace(opts, preset="small")
    isolate = opts.isolate if opts.isolate is not None else (dev != "cpu" and registry is None)
    pairs = [(op, M) for op in opts.ops for M in opts.ms]
    log(f"bench prefix-ops: {len(opts.ops)} ops x M {list(opts.ms)} at KV {opts.kv_len} on {dev}"
        f"{' (worker subprocess)' if isolate else ''}; budget {opts.budget_s:.0f} s")
    if isolate:
        meta, records, notes = run_isolated(opts, pairs, log)
    else:
        recs: list[dict] = []
        notes = []
        try:
            worker_run(opts, pairs, recs.append, log, registry)
        except CudaContextLost as e:
            notes.append(f"CUDA context lost: {e}")
        meta = next((r for r in recs if r.get("type") == "meta"), {})
        meta = {k: v for k, v in meta.items() if k != "type"}
        got = {(r["op"], r["M"]): r for r in recs if r.get("type") == "pair"}
        records = [got.get(p) or _failed_pair(p[0], p[1], "not run (the in-process run stopped)", opts) for p in pairs]
    meta["elapsed_s"] = time.time() - t0
    rep = assemble(opts, meta, records, notes)
    files = write_outputs(rep, opts.out, log)
    print(render_stdout(rep), flush=True)
    log(f"done in {time.time() - t0:.1f} s" + (f"; wrote {', '.join(files)}" if files else ""))
    return rep


def _worker_main(args: argparse.Namespace) -> int:
    opts = Options.from_json(Path(args.worker).read_text())
    pairs = [tuple(p) for p in json.loads(Path(args.pairs).read_text())]
    log = Log(opts.out, t0=args.log_t0)
    jl = open(args.jsonl, "a")

    def emit(rec: dict) -> None:
        jl.write(json.dumps(rec, default=str) + "\n")
        jl.flush()
    try:
        worker_run(opts, pairs, emit, log)
    except CudaContextLost as e:
        emit({"type": "fatal", "reason": f"CUDA context lost: {e}"})
        log(f"worker: CUDA context lost, exiting for a restart: {e}")
        return 3
    except Exception as e:  # noqa: BLE001
        emit({"type": "fatal", "reason": _short_exc(e)})
        log(f"worker: fatal: {_short_exc(e)}")
        return 2
    finally:
        jl.close()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="decode tokens M (one per sequence), comma-separated")
    p.add_argument("--kv-len", type=int, default=8192, help="context length per sequence")
    p.add_argument("--ops", default=",".join(OPS), help="subset of " + ",".join(OPS))
    p.add_argument("--out", default=None, help="directory for prefix_ops.{json,md,png,log}")
    p.add_argument("--no-stock", action="store_true", help="skip the stock baseline")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--dry-run", action="store_true", help="on a CPU: small preset, eager stock, wall-clock timing")
    p.add_argument("--preset", choices=("glm5", "glm5.2", "small"), default="glm5")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--min-launches", type=int, default=20, help="launches per captured graph (at least)")
    p.add_argument("--max-sets", type=int, default=512, help="cap on rotating input sets per op")
    p.add_argument("--budget-s", type=float, default=200.0, help="soft time budget; what is left is skipped")
    p.add_argument("--no-isolate", action="store_true", help="run in this process (no worker subprocess)")
    p.add_argument("--prewarm-procs", type=int, default=10, help="parallel DeepGEMM JIT prewarm processes (0: off)")
    p.add_argument("--no-profile", action="store_true", help="do not list the kernels of each op with torch.profiler")
    p.add_argument("--stock-dynamic", action="store_true",
                   help="torch.compile the stock kernels with dynamic M (fewer compiles; default: static shapes)")
    p.add_argument("--ours-module", default="glm5_fastpath.ops", help="module holding our ops (tests/dry runs)")
    p.add_argument("--seed", type=int, default=0)


def options_from_args(a: argparse.Namespace) -> Options:
    return Options(ms=parse_list(a.m, int), kv_len=a.kv_len, ops=parse_list(a.ops.upper()), out=a.out,
                   stock=not a.no_stock, device=a.device, preset=a.preset, seed=a.seed, replays=a.replays,
                   min_launches=a.min_launches, max_sets=a.max_sets, budget_s=a.budget_s,
                   isolate=False if a.no_isolate else None, prewarm_procs=a.prewarm_procs, profile=not a.no_profile,
                   stock_dynamic=a.stock_dynamic, ours_module=a.ours_module, dry_run=a.dry_run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.prefix_ops", description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", help=argparse.SUPPRESS)
    ap.add_argument("--jsonl", help=argparse.SUPPRESS)
    ap.add_argument("--log-t0", type=float, default=None, help=argparse.SUPPRESS)
    add_arguments(ap)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker_main(a)
    run_bench(options_from_args(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
