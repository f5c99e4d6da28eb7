"""The GLM5_FASTPATH_* environment variables of the kernel layer: one definition each.

Every variable is read when it is used (not at import), so a test or a shell can change it
between calls; a cubin already loaded in a process is not rebuilt when a variable changes.
Flags accept 1/true/yes/on and 0/false/no/off/empty (case-insensitive); anything else raises.

| Variable | Default | Effect |
|---|---|---|
| `GLM5_FASTPATH_CACHE_DIR` | `~/.cache/glm5_fastpath/jit` | Root of the JIT cache; cubins go to `<root>/<arch>/<kernel>.<key>/`. |
| `GLM5_FASTPATH_DISABLE_CACHE` | off | Ignore the disk cache: compile into a temporary directory on every first use in a process. |
| `GLM5_FASTPATH_NVCC` | unset | Path of the nvcc to use; checked before `CUDA_HOME/bin/nvcc`, `PATH`, `/usr/local/cuda/bin/nvcc` and the `nvidia-cuda-nvcc` wheel. |
| `GLM5_FASTPATH_CSRC` | the package's `csrc/` | Directory holding the kernel sources (`csrc/`), e.g. a checkout being edited. |
| `GLM5_FASTPATH_CUTLASS_DIR` | the `nvidia-cutlass` wheel | CUTLASS/CuTe include directory, for kernels that use CuTe (the first kernels do not). |
| `GLM5_FASTPATH_JIT_VERBOSE` | off | Print every compile command, its compiler output, and every cache hit, to stderr. |
| `GLM5_FASTPATH_JIT_KEEP` | off | Keep PTX and the other nvcc intermediates (`--keep`) plus SASS (`cuobjdump -sass`, when found) in `keep/` next to the cubin. Part of the cache key. |
| `GLM5_FASTPATH_PTXAS_VERBOSE` | off | Compile with `-Xptxas -v` (registers, shared memory, spills) and print that report, also on cache hits. Part of the cache key. |
| `GLM5_FASTPATH_LINEINFO` | off | Compile with `-lineinfo` (source lines in compute-sanitizer / ncu). Part of the cache key. |
| `GLM5_FASTPATH_PRINT_CONFIGS` | off | Print each kernel configuration choice (threads, tiles, ...) once per problem descriptor. |
| `GLM5_FASTPATH_DISABLE_PDL` | off | Launch every kernel without the Programmatic Dependent Launch attribute (for bisecting). |
| `GLM5_FASTPATH_B0_MODE` | unset | B0 (`b0_qkv_a`) implementation when the call passes no `mode`: `fused` (one kernel) or `split` (plain GEMM + row kernel); unset = `glm5_fastpath.ops.fp8_gemm.B0_DEFAULT_MODE`. |
| `GLM5_FASTPATH_FP8_GEMM_IMPL` | unset | Mainloop of every skinny FP8 GEMM op (`glm5_fastpath.ops.fp8_gemm`): `mma` (cp.async + mma.sync) or `wgmma` (TMA + wgmma, sm_90 only); unset = the tuned table's entry, else `wgmma` on sm_90. |
| `GLM5_FASTPATH_FP8_GEMM_PIPE` | unset | wgmma consumer mode of every skinny FP8 GEMM op's chosen config (token blocks <= 64): `0` per stage, `1` next stage issued before the promotion, `2` stage pairs with one wait; unset = the config's own (for measuring before the tuned table adopts a mode; set it before `precompile`). |
| `GLM5_FASTPATH_FP8_GEMM_INFLIGHT` | 0 | every wgmma skinny FP8 GEMM (one CTA per unit): issue at most n stages of the ring fill at once, each later one when the stage n before it has landed (so a CTA's first box does not wait for the whole grid's burst); 0 = the whole ring at once. Measured (session 24, H200): bitwise identical results, no per-op change at 2 or 3 (B0 / B1 / D1 / D0 within ±0.5 us), the whole prefix within run-to-run noise; kept for re-measuring. Read when a kernel spec is built (set it before `precompile`). |
| `GLM5_FASTPATH_CMP_L2_BULK` | 0 | CMP modes with `l2:OP=F` modifiers: `1` issues bulk (TMA) L2 prefetches instead of 128-byte line prefetches; read when an executor is built. |
| `GLM5_FASTPATH_D2_WEIGHTS` | bf16 | The form of W_UK the CMP prefix's D2 reads: `bf16` (SGLang's load-time dequant of kv_b_proj), `fp8` (the checkpoint's FP8 kv_b bytes with one scale per row and 128-column block: half of D2's weight bytes, q_lat bit for bit the same; the weights must carry `AttnWeights.w_kc_fp8`), `auto` (fp8 when the weights carry it). Read when an executor is built. |
| `GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES` | unset | Gather ring of the sparse-MLA wgmma split tile: 3 (default) or 4 (the partial-S exchange moves into the ring, one more block in flight). A separate cubin. |
| `GLM5_FASTPATH_MRTP_GEMM_STAGES` | unset | Weight stages in flight of the MegaRTP megakernel's GEMM families (B0, B1, D1, D0), 4..8; unset = 6. Changes the kernel build and its shared memory (for measuring; set it before the first plan runs). |
| `GLM5_FASTPATH_MRTP_E1_EVICT_FIRST` | 0 | 1: the MegaRTP megakernel's E1 family loads the index-K cache pages with an L2 evict-first hint (each page is read once per step: 18 MB at 16 sequences of 8192 tokens, 72 MB at 64). Changes the kernel build (for measuring; not yet run on a GPU). |
| `GLM5_FASTPATH_W_EVICT_FIRST` | auto | Standalone FP8 GEMMs (`fp8_gemm`, both mainloops: the prefix's B0 / B1 / D1 / D0 under CMP, the FP8-linear route) and D2: weight loads with an L2 evict-first hint. `auto`: at M <= 16 tokens (session 22: CMP's whole prefix 45.5 -> 40.8 us at 1 token, 51.7 -> 47.9 at 16; 3 % slower at 64); `1` always; `0` never. Changes the kernel builds (set it before the first call). |
| `GLM5_FASTPATH_MRTP_CLAIM_LEAD_US` | 1.5 | MegaRTP plans with the `dynamic` scheduler (the CTAs claim instructions from one list at run time): claim the next instruction this many us before the current one's estimated end; `ready`: as soon as it has its inputs; `done`: when it is done. Read when a plan is built (`bench --claim-lead`). |
| `GLM5_FASTPATH_MRTP_CLAIM_TERMS` | run | What that estimated end includes: `run` the cost model's run time, `cold` + its first-of-a-run cost, `finish` + its split-K group's finish (session 23: `run` fastest). |
| `GLM5_FASTPATH_MRTP_W_EVICT_FIRST` | 1 | The MegaRTP megakernel's weight loads (GEMM families B0 / B1 / D1 / D0, D2's W_UK) carry an L2 evict-first hint, so the ~70 MB of weights streamed per step do not push the kernel's code and the step's activations out of L2 (session 22: 87 -> 66 us at 1 token, 113 -> 92 at 16). 0: plain loads. Changes the kernel build (set it before the first plan runs). |
| `GLM5_FASTPATH_ROUTER_TOPK_ROUNDS` | 0 | 1: the MoE router kernels (`ops.moe_router`, split-K and decode) select with the top-k epilogue's round loop (kTopK rounds of a warp max) instead of the default bitonic merge; the same ids and weights bit for bit, for A/B measurements (`bench router --topk-rounds` times both in one run). Read when a router kernel is first loaded. |
| `GLM5_FASTPATH_MOE_PLAN_ACTIVE` | 0 | 1: MegaMoE's plan kernel deals the active experts (a compact list its scan writes) over its warps in the task phase, instead of every expert id round-robin (`GLM5_MEGAMOE_PLAN_ACTIVE`, single-GPU builds; the same task list and outputs). Opt-in, written in session 38 and not yet GPU-run: the task phase took 4 us at 8 tokens against 1.1 at 1. Read when a launch looks its kernels up. |
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str  # "flag" | "path" | "text"
    default: str
    doc: str


_VARS: tuple[EnvVar, ...] = (
    EnvVar("GLM5_FASTPATH_CACHE_DIR", "path", "~/.cache/glm5_fastpath/jit", "Root of the JIT cache."),
    EnvVar("GLM5_FASTPATH_DISABLE_CACHE", "flag", "0", "Ignore the disk cache."),
    EnvVar("GLM5_FASTPATH_NVCC", "path", "", "Path of the nvcc to use."),
    EnvVar("GLM5_FASTPATH_CSRC", "path", "", "Directory holding the kernel sources."),
    EnvVar("GLM5_FASTPATH_CUTLASS_DIR", "path", "", "CUTLASS/CuTe include directory."),
    EnvVar("GLM5_FASTPATH_JIT_VERBOSE", "flag", "0", "Print compile commands, compiler output and cache hits."),
    EnvVar("GLM5_FASTPATH_JIT_KEEP", "flag", "0", "Keep PTX/SASS/intermediates next to the cubin."),
    EnvVar("GLM5_FASTPATH_PTXAS_VERBOSE", "flag", "0", "Compile with -Xptxas -v and print the report."),
    EnvVar("GLM5_FASTPATH_LINEINFO", "flag", "0", "Compile with -lineinfo."),
    EnvVar("GLM5_FASTPATH_PRINT_CONFIGS", "flag", "0", "Print kernel configuration choices once each."),
    EnvVar("GLM5_FASTPATH_DISABLE_PDL", "flag", "0", "Launch without the PDL attribute."),
    EnvVar("GLM5_FASTPATH_B0_MODE", "text", "", "B0 implementation: fused / split (unset: the module default)."),
    EnvVar("GLM5_FASTPATH_FP8_GEMM_IMPL", "text", "", "FP8 GEMM mainloop: mma / wgmma (unset: tuned table, then wgmma on sm_90)."),
    EnvVar("GLM5_FASTPATH_FP8_GEMM_PIPE", "text", "", "FP8 GEMM wgmma consumer mode 0 / 1 / 2 (unset: the chosen config's)."),
    EnvVar("GLM5_FASTPATH_FP8_GEMM_INFLIGHT", "text", "0",
           "FP8 GEMM wgmma mainloop: at most n ring-fill stages in flight per CTA (0: the whole ring at once)."),
    EnvVar("GLM5_FASTPATH_CMP_L2_BULK", "flag", "0", "CMP l2:OP=F modifiers: bulk (TMA) L2 prefetches instead of lines."),
    EnvVar("GLM5_FASTPATH_D2_WEIGHTS", "text", "bf16",
           "W_UK form D2 reads in the CMP prefix: bf16 / fp8 (checkpoint kv_b bytes, half the weight bytes) / auto."),
    EnvVar("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", "text", "",
           "Sparse-MLA wgmma split tile's gather ring: 3 / 4 (4: the partial-S exchange in the ring; unset: 3)."),
    EnvVar("GLM5_FASTPATH_MRTP_GEMM_STAGES", "text", "", "MegaRTP megakernel GEMM weight stages 4..8 (unset: 6)."),
    EnvVar("GLM5_FASTPATH_MRTP_E1_EVICT_FIRST", "flag", "0",
           "MegaRTP megakernel: E1's index-K cache pages with an L2 evict-first hint."),
    EnvVar("GLM5_FASTPATH_ROUTER_TOPK_ROUNDS", "flag", "0",
           "MoE router kernels: the top-k round loop instead of the bitonic merge (A/B; same outputs)."),
    EnvVar("GLM5_FASTPATH_MOE_PLAN_ACTIVE", "flag", "0",
           "MegaMoE plan: the task phase over a compact active-expert list (opt-in; same outputs)."),
    EnvVar("GLM5_FASTPATH_W_EVICT_FIRST", "text", "auto",
           "Standalone FP8 GEMMs and D2: evict-first weight loads (auto: M <= 16; 1 always; 0 never)."),
    EnvVar("GLM5_FASTPATH_MRTP_CLAIM_LEAD_US", "text", "1.5",
           "MegaRTP dynamic dispatch: claim lead in us before the estimated end, or ready / done."),
    EnvVar("GLM5_FASTPATH_MRTP_CLAIM_TERMS", "text", "run",
           "MegaRTP dynamic dispatch: the claim delay's estimate: run / cold / finish."),
    EnvVar("GLM5_FASTPATH_MRTP_W_EVICT_FIRST", "flag", "1",
           "MegaRTP megakernel: weight loads (GEMM families, D2) with an L2 evict-first hint (0: plain loads)."),
)
VARS: Mapping[str, EnvVar] = {v.name: v for v in _VARS}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _spec(name: str) -> EnvVar:
    try:
        return VARS[name]
    except KeyError:
        raise KeyError(f"{name} is not a documented glm5_fastpath variable; known: {sorted(VARS)}") from None


def flag(name: str) -> bool:
    """Value of a documented flag variable; an unparseable value raises ValueError."""
    spec = _spec(name)
    if spec.kind != "flag":
        raise TypeError(f"{name} is a {spec.kind} variable, not a flag")
    raw = os.environ.get(name, spec.default).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name}={os.environ.get(name)!r}: expected one of 1/true/yes/on or 0/false/no/off")


def path(name: str) -> str | None:
    """Value of a documented path variable with ~ expanded; None when unset or empty."""
    spec = _spec(name)
    if spec.kind != "path":
        raise TypeError(f"{name} is a {spec.kind} variable, not a path")
    raw = os.environ.get(name, "").strip()
    return os.path.expanduser(raw) if raw else None


def text(name: str) -> str | None:
    """Value of a documented text variable, stripped; None when unset or empty (the caller validates it)."""
    spec = _spec(name)
    if spec.kind != "text":
        raise TypeError(f"{name} is a {spec.kind} variable, not a text variable")
    raw = os.environ.get(name, "").strip()
    return raw or None


def default_of(name: str) -> str:
    return _spec(name).default


# ---- configuration printing (GLM5_FASTPATH_PRINT_CONFIGS) -------------------------------------

_printed: set[tuple[str, Any]] = set()
_printed_lock = threading.Lock()


def print_config(op: str, descriptor: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Print `op`'s chosen config once per descriptor when GLM5_FASTPATH_PRINT_CONFIGS is on.

    descriptor: the problem (shapes, dtypes) that determined the choice; config: the choice.
    """
    if not flag("GLM5_FASTPATH_PRINT_CONFIGS"):
        return
    key = (op, tuple(sorted(descriptor.items())))
    with _printed_lock:
        if key in _printed:
            return
        _printed.add(key)
    d = ", ".join(f"{k}={v}" for k, v in descriptor.items())
    c = ", ".join(f"{k}={v}" for k, v in config.items())
    print(f"[glm5_fastpath.config] {op}({d}) -> {c}", file=sys.stderr, flush=True)


def verbose(msg: str) -> None:
    """One line to stderr when GLM5_FASTPATH_JIT_VERBOSE is on."""
    if flag("GLM5_FASTPATH_JIT_VERBOSE"):
        print(f"[glm5_fastpath.jit] {msg}", file=sys.stderr, flush=True)
