"""Two dependent skinny FP8 GEMMs in one persistent launch (csrc/attn_pre/fp8_gemm_chain.cu): the measurement
behind MegaRTP's weight loader (issue #5), not a production path.

`gemm_chain(a, b, tm=, stages=)` computes y_a = A and y_b = B with B's activation reads gated on A's completion
(a grid-wide counter), B's weights streaming into the one TMA ring while A finishes. Its outputs equal two
`fp8_gemm_skinny` launches of the same (tm, splits) bitwise (same tile code, same split-K order); `bench gemm-chain`
times it against those two launches chained with PDL.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from ..jit.compiler import KernelSpec
from . import fp8_gemm as F

SOURCE = "attn_pre/fp8_gemm_chain.cu"
FUNCTION = "glm5_fp8_gemm_chain"

_lock = threading.Lock()
_chains: dict[int, torch.Tensor] = {}


class GemmChainInputError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ChainGemm:
    """One GEMM of the chain: activations x8 [M, K] e4m3 + xs [M, K/128] fp32, weight `lin` (Fp8Linear,
    row-major or k-block-major), K splits."""

    x8: torch.Tensor
    xs: torch.Tensor
    lin: Any
    splits: int = 1


_diag = threading.local()


class phase_build:
    """Context manager (diagnostics): gemm_chain launches inside run the GLM5_CHAIN_PHASES build (per-CTA
    %globaltimer marks, fp8_gemm_chain.cu); read them with read_phases(tm, stages) after the launch."""

    def __enter__(self) -> "phase_build":
        self._prev = getattr(_diag, "phases", False)
        _diag.phases = True
        return self

    def __exit__(self, *exc: object) -> None:
        _diag.phases = self._prev


PHASE_NAMES = ("entry", "a_loop_done", "a_signalled", "b_wait_passed", "b_loop_done", "last_unit_done",
               "producer_b_wait_passed")


DEPS = ("grid", "tile")
MAX_A_TILES = 256  # chain counters per device: 2 + A's n tiles (tile dependencies)


def chain_spec(tm: int, stages: int, wkb: bool = False, phases: bool = False, tile: bool = False) -> KernelSpec:
    if tm not in F.token_blocks("wgmma") or not 2 <= stages <= F.WGMMA_MAX_STAGES:
        raise GemmChainInputError(f"gemm_chain: token block {tm} (one of {F.token_blocks('wgmma')}) / stages {stages} "
                                  f"(2..{F.WGMMA_MAX_STAGES})")
    d = (("GLM5_SKINNY_TM", str(tm)), ("GLM5_SKINNY_STAGES", str(stages)))
    d += (("GLM5_SKINNY_WKB", "1"),) if wkb else ()
    d += (("GLM5_CHAIN_PHASES", "1"),) if phases else ()
    d += (("GLM5_CHAIN_TILE", "1"),) if tile else ()
    return KernelSpec(FUNCTION, source=SOURCE, defines=d)


def read_phases(tm: int, stages: int, wkb: bool = False, device=None, tile: bool = False) -> torch.Tensor:
    """[2048, 8] int64 of the phase build's marks (its last launch on `device`): PHASE_NAMES in ns of %globaltimer,
    0 where a CTA did not reach a mark; column 7 the SM id. Zero them first with reset_phases."""
    out = torch.zeros(2048, 8, dtype=torch.int64, device=device or "cuda")
    _phase_module(tm, stages, wkb, tile, out.device).copy_global("chain_phase_ns", out)
    return out


def reset_phases(tm: int, stages: int, wkb: bool = False, device=None, tile: bool = False) -> None:
    _phase_module(tm, stages, wkb, tile, torch.device(device or "cuda")).copy_global("chain_phase_ns")


def _phase_module(tm: int, stages: int, wkb: bool, tile: bool, dev: torch.device):
    from ..jit.runtime import get_kernel
    return get_kernel(chain_spec(tm, stages, wkb, True, tile), device=dev).module


def _config(g: ChainGemm, tm: int, stages: int, what: str) -> F.SkinnyConfig:
    m, n, k = F._check_gemm(F.EPI_PLAIN, g.x8, g.xs, g.lin.weight, g.lin.scale_inv)
    if not 1 <= g.splits <= k // 128:
        raise GemmChainInputError(f"gemm_chain: {what} splits={g.splits} must be in 1..K/128 = {k // 128}")
    return F._with_layout(F.EPI_PLAIN, F.SkinnyConfig(F.EPI_PLAIN, m, n, k, tm, g.splits, stages, impl="wgmma"),
                          g.lin.weight)


def check_dep(dep: str, a: F.SkinnyConfig, b: F.SkinnyConfig) -> None:
    if dep not in DEPS:
        raise GemmChainInputError(f"gemm_chain: dep={dep!r}: expected one of {', '.join(DEPS)}")
    if dep == "tile" and (b.k // 128 > a.tiles_n or a.tiles_n > MAX_A_TILES):
        raise GemmChainInputError(f"gemm_chain: dep='tile' maps B's k block g to A's n tile g: B's K / 128 = {b.k // 128} "
                                  f"must be <= A's n tiles = {a.tiles_n} (<= {MAX_A_TILES})")


def chain_units(a: F.SkinnyConfig, b: F.SkinnyConfig) -> int:
    return a.units + b.units


def smem_bytes(a: F.SkinnyConfig, b: F.SkinnyConfig) -> int:
    return F.wgmma_smem_bytes(a.tm, a.stages, max(a.gmax, b.gmax))


def _chain_counter(dev: torch.device) -> torch.Tensor:
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    t = _chains.get(i)
    if t is None:
        with _lock:
            t = _chains.get(i)
            if t is None:
                t = _chains[i] = torch.zeros(2 + MAX_A_TILES, dtype=torch.int32, device=dev)
    return t


def gemm_chain(a: ChainGemm, b: ChainGemm, *, tm: int, stages: int, ctas: int | None = None, dep: str = "grid",
               pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(y_a [M_a, N_a], y_b [M_b, N_b]) bf16 in one persistent launch of `ctas` CTAs (default: min(units, SMs)).
    Both GEMMs use token block tm and `stages` ring stages; weights may be k-block-major (then both must be).
    dep: "grid" (B's activations wait for all of A) or "tile" (A runs tile-major; B's k block g waits for A's n tile
    g only: B's K / 128 <= A's n tiles). One chain in flight per device: every launch shares the device's
    self-resetting counters (launch chains on one stream, or serialise them)."""
    from ..jit.runtime import get_kernel

    ca, cb = _config(a, tm, stages, "A"), _config(b, tm, stages, "B")
    check_dep(dep, ca, cb)
    if ca.wkb != cb.wkb:
        raise GemmChainInputError("gemm_chain: A and B must use one weight layout (both row-major or both k-block-major)")
    dev = F._same_device(F.EPI_PLAIN, a.x8, a.xs, a.lin.weight, a.lin.scale_inv, b.x8, b.xs, b.lin.weight,
                         b.lin.scale_inv)
    F._check_capability(F.EPI_PLAIN, dev)
    sms = F._sms(dev)
    units = chain_units(ca, cb)
    p_ctas = min(units, sms) if ctas is None else int(ctas)
    if not 1 <= p_ctas <= min(units, sms):
        raise GemmChainInputError(f"gemm_chain: ctas={ctas} must be in 1..min(units {units}, SMs {sms}): every CTA must "
                                  "be resident, or a CTA waiting on A could block one that holds A's units")
    smem = smem_bytes(ca, cb)
    if smem > F.SMEM_LIMIT:
        raise GemmChainInputError(f"gemm_chain: {smem} B of shared memory > {F.SMEM_LIMIT}")
    if ca.m == 0 or cb.m == 0:
        raise GemmChainInputError("gemm_chain: both GEMMs need at least one token")
    kernel = get_kernel(chain_spec(tm, stages, bool(ca.wkb), getattr(_diag, "phases", False), dep == "tile"), device=dev)
    ya = torch.empty(ca.m, ca.n, dtype=torch.bfloat16, device=dev)
    yb = torch.empty(cb.m, cb.n, dtype=torch.bfloat16, device=dev)
    pa = F._base_params(F.EPI_PLAIN, ca, a.x8, a.xs, a.lin.weight, a.lin.scale_inv, dev)
    pa.out_a = F._ptr(ya)
    pb = F._base_params(F.EPI_PLAIN, cb, b.x8, b.xs, b.lin.weight, b.lin.scale_inv, dev)
    pb.out_a = F._ptr(yb)
    args = [pa, *F.tensor_maps(ca, a.x8, a.lin.weight), pb, *F.tensor_maps(cb, b.x8, b.lin.weight),
            _chain_counter(dev)]
    kernel.launch((p_ctas, 1, 1), (F.WGMMA_THREADS, 1, 1), args, smem=smem, pdl=pdl)
    return ya, yb


def compile_check_specs() -> list[KernelSpec]:
    return [chain_spec(16, 6), chain_spec(8, 8), chain_spec(16, 6, wkb=True), chain_spec(8, 6, phases=True),
            chain_spec(16, 6, tile=True), chain_spec(8, 6, phases=True, tile=True)]


__all__ = ["DEPS", "ChainGemm", "GemmChainInputError", "PHASE_NAMES", "check_dep", "chain_spec", "chain_units", "compile_check_specs",
           "gemm_chain", "phase_build", "read_phases", "reset_phases", "smem_bytes"]
