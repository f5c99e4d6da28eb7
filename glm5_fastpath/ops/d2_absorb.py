"""D2: W_UK absorption + MLA k_pe RoPE + latent KV-cache store, as a torch.library custom op.

Math (the reference is glm5_fastpath.ref.prefix.d2_absorb_and_kv_store):

    q_lat[m, h, :]           = bf16_rn( q_nope[m, h, :] . w_kc[h] )             bf16 x bf16, fp32 accumulation
    kv_cache[out_cache_loc[m]] = [ c_kv[m] | bf16_rn(rope(k_pe[m], positions[m])) ]

RoPE is GPT-J interleaved with cos/sin = fp32(cos/sin(float64(pos) * inv_freq)), inv_freq the
float64 table of ref/rope.py (computed once per (dim, theta) on the host with the same expression),
and fp32 products/sums without FMA contraction, so the stored rows are bitwise the reference's.

Inputs: q_nope [M, heads, nope] bf16, c_kv [M, kv_lora] bf16, k_pe [M, rope] bf16, w.w_kc
[heads, nope, kv_lora] bf16 (all contiguous), positions and out_cache_loc [M] (both int64, or both
int32), kv_cache [num_slots, kv_lora + rope] bf16 contiguous, written in place at the M target rows
only. 0 <= M <= 256. Dims: GLM-5 (nope 192, kv_lora 512, rope 64, 64 heads) and the small preset
(64, 128, 32, 4 heads); in general nope a multiple of 32 up to 256, kv_lora a multiple of 128, rope
even up to 64.

Not validated on the host (that would need a device-to-host sync, which CUDA graphs forbid): the
slots' range and uniqueness. A slot outside [0, num_slots) is skipped by the kernel (nothing is
written for that token); duplicate slots race (one of the rows wins), as in SGLang's store.

Kernel (csrc/attn_pre/d2_absorb_kv_store.{cuh,cu}): one CTA per (head, 128-column latent tile),
64 x 4 = 256 CTAs for GLM-5. Eight warps stream the 192 x 128 bf16 weight tile (48 KB) into shared
memory with cp.async before griddepcontrol.wait (PDL) and multiply it, as the MMA's A operand via
ldmatrix.trans (swapAB: latent on M, tokens on N), with the tokens' q_nope rows read straight from
global/L2 into B fragments; fp32 accumulation, bf16 output. A ninth warp per CTA stores the KV row
of token blockIdx.x (if < M). Two variants by M: 1 m16 tile per warp (M <= 32) or 2 (M > 32).

Why bf16 W_UK, and what an FP8 W_UK would take (the design article allows "FP8 re-quantized per
head if it is faster at equal accuracy"). SGLang's H200 path holds w_kc in bf16 (kv_b_proj is
dequantized at load: w_kc[h][k, n] = bf16_rn(e4m3[448h + k, n] * s[(448h + k) // 128, n // 128]),
spec section 2), and this op matches that reference. FP8 storage would move 12.6 MB -> 6.3 MB of
weights (14.0 -> 7.7 MB at M=16 with activations, ~1.5 us less at 4.27 TB/s). Two ways, not equal:
- W8A8 (FP8 MMA): q_nope must be quantized to e4m3 as well (1x128 groups: ~2-3 % rms error per
  element, straight into every attention logit), and a naive per-head re-quantization of the bf16
  w_kc on a new 128x128 grid adds a second e4m3 rounding (another ~2-3 %). Not equal accuracy.
- W8A16, lossless: keep kv_b's checkpoint e4m3 bytes and scales and rebuild bf16_rn(e4m3 * s) in
  the kernel, bit-identical to SGLang's load-time dequant, keeping the bf16 MMA: same q_lat bit for
  bit, half the weight bytes, a few ALU ops per weight. This form now exists (below).

W8A16 form: torch.ops.glm5_fastpath.d2_absorb_kv_store_w8 (kernel glm5_d2_absorb_kv_store_w8, the
GLM5_D2_W8=1 build of the same source, D2AbsorbTile<..., kW8 = true>). Weights: w_kc8 [heads, nope,
kv_lora] e4m3 and w_kc_scale [heads, nope, kv_lora/128] fp32, one scale per weight row and 128-column
block (ref.fp8.w_kc_fp8_from_kv_b builds them from the checkpoint's kv_b_proj: the rows of a head start
at 448h, so its 128-row scale blocks fall at different rows per head; one scale per row keeps the lookup
the same for every head; weights.AttnWeights carries them as w_kc_fp8 / w_kc_scale). The bf16 weight of
the bf16 op is exactly ref.fp8.dequant_w_kc(w_kc8, w_kc_scale) = bf16_rn(fp32(e4m3) * s). Kernel: the
192 x 128 e4m3 tile (24 KB, 128 B per row) and each GEMM thread's six row scales (4-byte cp.async into
per-thread smem slots, 6 KB) stream in with cp.async before griddepcontrol.wait, in the same per-K-block
commit groups as the bf16 tile; in the first pass, after its cp.async wait for K block kb, each GEMM
thread converts the 16 weights it copied itself (e4m3 -> f16 by cvt.rn.f16x2.e4m3x2, exact; -> fp32,
exact; __fmul_rn by the row scale; cvt.rn.bf16x2.f32, round to nearest even) into the swizzled bf16
tile, and the K block's existing named barrier publishes them before the first ldmatrix. From there the
MMA / epilogue code is the bf16 build's, on the same bf16 bits, so q_lat (and the KV rows, untouched by
the change) are bitwise the bf16 op's on dequant_w_kc(w_kc8, w_kc_scale) (tests/ops/test_d2_absorb_w8.py
checks this on a GPU). Shared memory +30 KB per CTA (GLM-5, M > 32: 98 KB; two CTAs per SM still fit).
The scales sit in smem rather than registers: the M > 32 build is at ptxas's 96-register limit for two
288-thread CTAs per SM, and with six scale registers it spilled (the smem slots cost no dependent global
load either; 0 spills in every build).
Measured (H200, 2026-12-01, benchmarks/results/2026-12-01_h200_session24/ c6 / c7): the GPU tests pass (37,
bitwise equal to the bf16 op at every M); D2 alone takes 5.29-5.55 / 5.90-6.34 / 8.74-9.15 us at M = 1 / 16 / 64
against the bf16 build's 5.50-5.60 / 6.45-6.56 / 9.46-9.75 in the same calls (3 rounds): 4 / 9 / 7 % less, far less
than the halved weight bytes suggest (D2 is mostly latency at these sizes); the whole CMP prefix did not change
beyond run-to-run noise. So it is opt-in: GLM5_FASTPATH_D2_WEIGHTS=fp8 / auto (CMP executor, bench, SGLang seam;
the seam copies W_UK's rows out of kv_b_proj, ~6.5 MB per layer, which a head-strided kernel argument would avoid).

Op: torch.ops.glm5_fastpath.d2_absorb_kv_store(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc,
kv_cache, rope_theta, pdl=True, pdl_wait_at=2) -> q_lat (mutates kv_cache); the W8A16 op
torch.ops.glm5_fastpath.d2_absorb_kv_store_w8(q_nope, c_kv, k_pe, w_kc8, w_kc_scale, positions,
out_cache_loc, kv_cache, rope_theta, pdl=True, pdl_wait_at=2) -> q_lat, the same otherwise. Python entry
point with the reference's signature: d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, positions,
out_cache_loc, kv_cache, cfg, *, pdl=True, pdl_wait=None): the bf16 op on w.w_kc, or the W8A16 op on
w.w_kc_fp8 / w.w_kc_scale when w.w_kc is None and w.w_kc_fp8 is not (uses_w8). pdl_wait ("entry" |
"after_prologue" | "after_prefetch"; None = native = after the W_UK tile copies are issued) moves the
kernel's first griddepcontrol.wait (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a separate cubin) for the
CMP benchmark's PDL decomposition.
"""
from __future__ import annotations

import ctypes
import functools
import math
import threading
from dataclasses import dataclass, replace

import torch

from ._device import (PDL_WAIT_NATIVE, WEIGHTS_HINT_DEFINES, check_wait_at, pdl_wait_code, wait_defines,
                      weights_evict_first)
from ._device import overlaps as _overlaps, device_index as _device_index, require_aligned, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.d2_absorb_and_kv_store"
OP_W8 = "glm5_fastpath.d2_absorb_kv_store_w8"  # the W8A16 path's errors name its op
OP_QCAT = "glm5_fastpath.d2_absorb_kv_store_qcat"  # the q_cat form (bf16 or W8A16 weights)
SOURCE = "attn_pre/d2_absorb_kv_store.cu"
FUNCTION = "glm5_d2_absorb_kv_store"
FUNCTION_W8 = "glm5_d2_absorb_kv_store_w8"  # the GLM5_D2_W8=1 build of the same source
W8_BLOCK = 128  # columns per w_kc_scale block (= N_TILE: one scale per weight row within a CTA's tile)
FP8 = torch.float8_e4m3fn
MAX_TOKENS = 256
N_TILE = 128  # latent columns per CTA (D2AbsorbTile::kNTile)
GEMM_THREADS = 256
THREADS = GEMM_THREADS + 32  # + the KV warp
SMALL_M_MAX = 32  # M <= 32: one m16 tile per warp, else two
_INDEX_DTYPES = (torch.int64, torch.int32)


@dataclass(frozen=True)
class D2Config:
    nope: int
    kv_lora: int
    rope: int
    mt: int  # m16 latent tiles per warp
    nt: int = 4  # n8 token tiles per warp pass
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define
    evict_first: bool = False  # W_UK loads with an L2 evict-first hint (_device.weights_evict_first at config_for's m)
    w8: bool = False  # W8A16 build (GLM5_D2_W8=1, kernel FUNCTION_W8): W_UK as e4m3 + per-row fp32 scales
    qcat: bool = False  # QCAT build (GLM5_D2_QCAT=1, kernel name + "_qcat"): q_cat output, q_pe copy, pool store

    @property
    def n_tiles(self) -> int:
        return self.kv_lora // N_TILE

    @property
    def smem_bytes(self) -> int:
        """D2AbsorbTile::kSmemBytes: the weight tile + 8 per-warp staging tiles (pitch kMT*32 + 16 B)
        (+ W8: the e4m3 staging tile, 128 B per weight row, and the per-thread scale slots, nope/32 x 256 fp32)."""
        return (self.nope * N_TILE * 2 + 8 * (self.nt * 8) * (self.mt * 32 + 16)
                + (self.nope * N_TILE + (self.nope // 32) * GEMM_THREADS * 4 if self.w8 else 0))

    @property
    def function(self) -> str:
        return (FUNCTION_W8 if self.w8 else FUNCTION) + ("_qcat" if self.qcat else "")

    @functools.cached_property
    def spec(self) -> KernelSpec:
        # the bf16 build's defines (and so its cache key's flags) are those of before the W8 variant existed
        return KernelSpec(self.function, source=SOURCE, defines=(
            ("GLM5_D2_NOPE", str(self.nope)), ("GLM5_D2_KV_LORA", str(self.kv_lora)), ("GLM5_D2_ROPE", str(self.rope)),
            ("GLM5_D2_MT", str(self.mt)), ("GLM5_D2_NT", str(self.nt))) + wait_defines(self.wait_at)
            + (WEIGHTS_HINT_DEFINES if self.evict_first else ()) + ((("GLM5_D2_W8", "1"),) if self.w8 else ())
            + ((("GLM5_D2_QCAT", "1"),) if self.qcat else ()))


def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def _fail_w8(msg: str) -> ValueError:
    return ValueError(f"{OP_W8}: {msg}")


def _fail_qcat(msg: str) -> ValueError:
    return ValueError(f"{OP_QCAT}: {msg}")


def config_for(nope: int, kv_lora: int, rope: int, m: int, w8: bool = False, qcat: bool = False) -> D2Config:
    fail = _fail_qcat if qcat else (_fail_w8 if w8 else _fail)
    if nope <= 0 or nope % 32 or nope > 256:
        raise fail(f"qk_nope_head_dim={nope} is not supported: a multiple of 32, at most 256 (GLM-5: 192)")
    if kv_lora <= 0 or kv_lora % N_TILE:
        raise fail(f"kv_lora_rank={kv_lora} is not supported: a multiple of {N_TILE} (GLM-5: 512)")
    if rope <= 0 or rope % 2 or rope > 64:
        raise fail(f"qk_rope_head_dim={rope} is not supported: even, at most 64 (GLM-5: 64)")
    if qcat and rope % 8:
        raise fail(f"qk_rope_head_dim={rope} is not supported by the q_cat form: a multiple of 8 (GLM-5: 64)")
    return D2Config(int(nope), int(kv_lora), int(rope), 1 if m <= SMALL_M_MAX else 2,
                    evict_first=weights_evict_first(int(m)), w8=bool(w8), qcat=bool(qcat))


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], dim: int, fail=_fail) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise fail(f"{name} must be {want}, got {t.dtype}")
    if t.dim() != dim:
        raise fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise fail(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
    return t


def _check_inputs(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta,
                  w_kc_scale: object = None, *, w8: bool = False) -> D2Config:
    """The bf16 op's checks (w8=False: w_kc bf16), or the W8 op's (w8=True: w_kc is w_kc8, e4m3 [heads, nope,
    kv_lora], plus w_kc_scale fp32 [heads, nope, kv_lora / 128]; errors name d2_absorb_kv_store_w8)."""
    fail = _fail_w8 if w8 else _fail
    bf = (torch.bfloat16,)
    wname = "w_kc8" if w8 else "w_kc"
    _check_tensor("q_nope", q_nope, bf, 3, fail)
    _check_tensor("c_kv", c_kv, bf, 2, fail)
    _check_tensor("k_pe", k_pe, bf, 2, fail)
    _check_tensor(wname, w_kc, (FP8,) if w8 else bf, 3, fail)
    if w8:
        _check_tensor("w_kc_scale", w_kc_scale, (torch.float32,), 3, fail)
    _check_tensor("positions", positions, _INDEX_DTYPES, 1, fail)
    _check_tensor("out_cache_loc", out_cache_loc, _INDEX_DTYPES, 1, fail)
    _check_tensor("kv_cache", kv_cache, bf, 2, fail)
    m, heads, nope = q_nope.shape
    if tuple(w_kc.shape[:2]) != (heads, nope):
        raise fail(f"{wname} must be [heads={heads}, nope={nope}, kv_lora], got {tuple(w_kc.shape)}")
    kv_lora = w_kc.shape[2]
    if tuple(c_kv.shape) != (m, kv_lora):
        raise fail(f"c_kv must be [M={m}, kv_lora={kv_lora}], got {tuple(c_kv.shape)}")
    if k_pe.shape[0] != m:
        raise fail(f"k_pe must be [M={m}, rope], got {tuple(k_pe.shape)}")
    rope = k_pe.shape[1]
    for name, t in (("positions", positions), ("out_cache_loc", out_cache_loc)):
        if t.shape[0] != m:
            raise fail(f"{name} must be [M={m}], got {tuple(t.shape)}")
    if positions.dtype != out_cache_loc.dtype:
        raise fail(f"positions ({positions.dtype}) and out_cache_loc ({out_cache_loc.dtype}) must have the same dtype")
    if kv_cache.shape[1] != kv_lora + rope:
        raise fail(f"kv_cache must be [num_slots, kv_lora + rope = {kv_lora + rope}], got {tuple(kv_cache.shape)}")
    if m > MAX_TOKENS:
        raise fail(f"M={m} tokens exceeds the supported maximum of {MAX_TOKENS} (decode batch)")
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or not math.isfinite(rope_theta) \
            or rope_theta <= 0:
        raise fail(f"rope_theta must be a finite float > 0, got {rope_theta!r}")
    ts = (q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache) + ((w_kc_scale,) if w8 else ())
    devices = {t.device for t in ts}
    if len(devices) != 1:
        raise fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    cfg = config_for(int(nope), int(kv_lora), int(rope), int(m), w8=w8)
    if w8 and tuple(w_kc_scale.shape) != (heads, nope, kv_lora // W8_BLOCK):
        raise fail(f"w_kc_scale must be [heads={heads}, nope={nope}, kv_lora/{W8_BLOCK}={kv_lora // W8_BLOCK}] "
                   f"(one fp32 scale per weight row and {W8_BLOCK}-column block), got {tuple(w_kc_scale.shape)}")
    return cfg






def _check_device(ins: dict[str, torch.Tensor], kv_cache: torch.Tensor, w8: bool = False, qcat: bool = False) -> None:
    """qcat: the q_cat op's launch (its errors name that op, whatever the weight form)."""
    op, fail = (OP_QCAT, _fail_qcat) if qcat else ((OP_W8, _fail_w8) if w8 else (OP, _fail))
    dev = kv_cache.device
    require_hopper(op, dev, fail)
    if w8:  # the scales are read as single floats (4-byte alignment is all they need); the rest as 16-byte vectors
        require_aligned(fail, {k: v for k, v in ins.items() if k != "w_kc_scale"} | {"kv_cache": kv_cache})
        require_aligned(fail, {"w_kc_scale": ins["w_kc_scale"]}, align=4)
    else:
        require_aligned(fail, {**ins, "kv_cache": kv_cache})
    for name, t in ins.items():
        if _overlaps(kv_cache, t):
            raise fail(f"kv_cache overlaps input {name} in memory")


# ---- RoPE table, kernels (cached per device) ------------------------------------------------------

_lock = threading.Lock()
_inv_freq: dict[tuple[int, int, float], torch.Tensor] = {}
_kernels: dict[tuple[D2Config, int], object] = {}




def inv_freq_table(dim: int, theta: float) -> torch.Tensor:
    """float64 [dim/2] on the CPU, the exact expression of glm5_fastpath.ref.rope.rope_cos_sin."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _inv_freq_on(device: torch.device, dim: int, theta: float) -> torch.Tensor:
    key = (_device_index(device), dim, float(theta))
    t = _inv_freq.get(key)
    if t is None:
        with _lock:
            t = _inv_freq.get(key)
            if t is None:
                t = _inv_freq[key] = inv_freq_table(dim, float(theta)).to(torch.device("cuda", key[0]))
    return t


def _kernel(cfg: D2Config, device: torch.device):
    idx = _device_index(device)
    k = _kernels.get((cfg, idx))
    if k is None:
        env.print_config("d2_absorb_kv_store_w8" if cfg.w8 else "d2_absorb_kv_store",
                         {"nope": cfg.nope, "kv_lora": cfg.kv_lora, "rope": cfg.rope,
                          "M": f"<={SMALL_M_MAX}" if cfg.mt == 1 else f">{SMALL_M_MAX}"},
                         {"threads": THREADS, "m16_tiles_per_warp": cfg.mt, "n8_tiles_per_pass": cfg.nt,
                          "smem": cfg.smem_bytes, "grid": f"heads*{cfg.n_tiles}"})
        from ..jit.runtime import get_kernel
        k = _kernels[(cfg, idx)] = get_kernel(cfg.spec, device=torch.device("cuda", idx))
    return k


def _kernel_args(q_nope, w_kc, c_kv, k_pe, positions, out_cache_loc, inv_freq, kv_cache, q_lat,
                 w_kc_scale: torch.Tensor | None = None) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/d2_absorb_kv_store.cu order (checked at load). W8 (w_kc_scale
    given): w_kc is w_kc8 and w_kc_scale follows it (glm5_d2_absorb_kv_store_w8)."""
    m, heads, _ = q_nope.shape
    weights = (w_kc,) if w_kc_scale is None else (w_kc, w_kc_scale)
    return (q_nope, *weights, c_kv, k_pe, positions, out_cache_loc, inv_freq, kv_cache, q_lat,
            ctypes.c_int64(kv_cache.shape[0]), ctypes.c_int32(m), ctypes.c_int32(heads),
            ctypes.c_int32(1 if positions.dtype == torch.int64 else 0))


def _launch(cfg: D2Config, q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta, q_lat,
            pdl: bool, wait_at: int = PDL_WAIT_NATIVE, w_kc_scale: torch.Tensor | None = None,
            qcat: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """w_kc_scale given (cfg.w8): w_kc is w_kc8 (e4m3) and the W8 kernel runs. qcat = (q_pe, pool_loc, kv_pool)
    (cfg.qcat): q_lat is q_cat, and the q_cat build's four extra parameters follow (errors name the q_cat op)."""
    assert cfg.w8 == (w_kc_scale is not None) and cfg.qcat == (qcat is not None)
    weights = {"w_kc": w_kc} if w_kc_scale is None else {"w_kc8": w_kc, "w_kc_scale": w_kc_scale}
    ins = {"q_nope": q_nope, "c_kv": c_kv, "k_pe": k_pe, **weights, "positions": positions,
           "out_cache_loc": out_cache_loc, ("q_cat" if qcat is not None else "q_lat"): q_lat}
    extra: tuple = ()
    if qcat is not None:
        q_pe, pool_loc, kv_pool = qcat
        ins["q_pe"] = q_pe
    _check_device(ins, kv_cache, w8=cfg.w8, qcat=cfg.qcat)
    if qcat is not None:
        require_aligned(_fail_qcat, {"kv_pool": kv_pool})
        require_aligned(_fail_qcat, {"pool_loc": pool_loc}, align=8)  # read as single int64 (SGLang's out_cache_loc)
        if _overlaps(kv_pool, kv_cache):
            raise _fail_qcat("kv_pool overlaps kv_cache in memory (the scratch and the pool must be distinct)")
        for name, t in {**ins, "pool_loc": pool_loc}.items():
            if _overlaps(kv_pool, t):
                raise _fail_qcat(f"kv_pool overlaps input {name} in memory")
        extra = (q_pe, kv_pool, pool_loc, ctypes.c_int64(kv_pool.shape[0]))
    m, heads, _ = q_nope.shape
    if m == 0:
        return
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    kernel = _kernel(cfg, q_nope.device)
    inv_freq = _inv_freq_on(q_nope.device, cfg.rope, rope_theta)
    kernel.launch((heads * cfg.n_tiles, 1, 1), (THREADS, 1, 1),
                  _kernel_args(q_nope, w_kc, c_kv, k_pe, positions, out_cache_loc, inv_freq, kv_cache, q_lat,
                               w_kc_scale) + extra,
                  smem=cfg.smem_bytes, pdl=pdl)


# ---- custom op --------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::d2_absorb_kv_store", mutates_args=("kv_cache",))
def _d2_absorb_kv_store(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w_kc: torch.Tensor,
                        positions: torch.Tensor, out_cache_loc: torch.Tensor, kv_cache: torch.Tensor,
                        rope_theta: float, pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg = _check_inputs(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta)
    check_wait_at(OP, pdl_wait_at)
    m, heads, _ = q_nope.shape
    q_lat = torch.empty((m, heads, cfg.kv_lora), dtype=torch.bfloat16, device=q_nope.device)
    _launch(cfg, q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta, q_lat, pdl, pdl_wait_at)
    return q_lat


@_d2_absorb_kv_store.register_fake
def _d2_absorb_kv_store_fake(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta, pdl=True,
                             pdl_wait_at=PDL_WAIT_NATIVE):
    cfg = _check_inputs(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta)
    check_wait_at(OP, pdl_wait_at)
    m, heads, _ = q_nope.shape
    return q_nope.new_empty((m, heads, cfg.kv_lora))


@torch.library.custom_op("glm5_fastpath::d2_absorb_kv_store_w8", mutates_args=("kv_cache",))
def _d2_absorb_kv_store_w8(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w_kc8: torch.Tensor,
                           w_kc_scale: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                           kv_cache: torch.Tensor, rope_theta: float, pdl: bool = True,
                           pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg = _check_inputs(q_nope, c_kv, k_pe, w_kc8, positions, out_cache_loc, kv_cache, rope_theta, w_kc_scale, w8=True)
    check_wait_at(OP_W8, pdl_wait_at)
    m, heads, _ = q_nope.shape
    q_lat = torch.empty((m, heads, cfg.kv_lora), dtype=torch.bfloat16, device=q_nope.device)
    _launch(cfg, q_nope, c_kv, k_pe, w_kc8, positions, out_cache_loc, kv_cache, rope_theta, q_lat, pdl, pdl_wait_at,
            w_kc_scale=w_kc_scale)
    return q_lat


@_d2_absorb_kv_store_w8.register_fake
def _d2_absorb_kv_store_w8_fake(q_nope, c_kv, k_pe, w_kc8, w_kc_scale, positions, out_cache_loc, kv_cache, rope_theta,
                                pdl=True, pdl_wait_at=PDL_WAIT_NATIVE):
    cfg = _check_inputs(q_nope, c_kv, k_pe, w_kc8, positions, out_cache_loc, kv_cache, rope_theta, w_kc_scale, w8=True)
    check_wait_at(OP_W8, pdl_wait_at)
    m, heads, _ = q_nope.shape
    return q_nope.new_empty((m, heads, cfg.kv_lora))


# ---- the q_cat form: q_cat = [q_lat | q_pe] for the sparse MLA, and the latent-KV row into SGLang's pool too ----------

def _check_qcat(q_nope, c_kv, k_pe, w_kc, w_kc_scale, positions, out_cache_loc, kv_cache, q_pe, pool_loc, kv_pool,
                rope_theta) -> D2Config:
    """The q_cat op's checks: the base op's (bf16 w_kc, or W8A16 when w_kc_scale is given), then q_pe [M, heads,
    rope] bf16, pool_loc [M] int64 and kv_pool [pool_slots, kv_lora + rope] bf16, all contiguous on one device."""
    w8 = w_kc_scale is not None
    try:
        cfg = _check_inputs(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta, w_kc_scale,
                            w8=w8)
    except ValueError as e:  # the same check, reported under this op's name
        raise _fail_qcat(str(e).split(": ", 1)[-1]) from None
    m, heads, _ = q_nope.shape
    rope = k_pe.shape[1]
    _check_tensor("q_pe", q_pe, (torch.bfloat16,), 3, _fail_qcat)
    _check_tensor("pool_loc", pool_loc, (torch.int64,), 1, _fail_qcat)
    _check_tensor("kv_pool", kv_pool, (torch.bfloat16,), 2, _fail_qcat)
    if tuple(q_pe.shape) != (m, heads, rope):
        raise _fail_qcat(f"q_pe must be [M={m}, heads={heads}, rope={rope}], got {tuple(q_pe.shape)}")
    if pool_loc.shape[0] != m:
        raise _fail_qcat(f"pool_loc must be [M={m}], got {tuple(pool_loc.shape)}")
    if kv_pool.shape[1] != cfg.kv_lora + rope:
        raise _fail_qcat(f"kv_pool must be [pool_slots, kv_lora + rope = {cfg.kv_lora + rope}], got "
                         f"{tuple(kv_pool.shape)}")
    devices = {t.device for t in (q_nope, q_pe, pool_loc, kv_pool)}
    if len(devices) != 1:
        raise _fail_qcat(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return config_for(cfg.nope, cfg.kv_lora, cfg.rope, m, w8=w8, qcat=True)  # (+ the q_cat form's rope % 8 rule)


@torch.library.custom_op("glm5_fastpath::d2_absorb_kv_store_qcat", mutates_args=("kv_cache", "kv_pool"))
def _d2_absorb_kv_store_qcat(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w_kc: torch.Tensor,
                             w_kc_scale: torch.Tensor | None, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                             kv_cache: torch.Tensor, q_pe: torch.Tensor, pool_loc: torch.Tensor,
                             kv_pool: torch.Tensor, rope_theta: float, pdl: bool = True,
                             pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg = _check_qcat(q_nope, c_kv, k_pe, w_kc, w_kc_scale, positions, out_cache_loc, kv_cache, q_pe, pool_loc,
                      kv_pool, rope_theta)
    check_wait_at(OP_QCAT, pdl_wait_at)
    m, heads, _ = q_nope.shape
    q_cat = torch.empty((m, heads, cfg.kv_lora + cfg.rope), dtype=torch.bfloat16, device=q_nope.device)
    _launch(cfg, q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, rope_theta, q_cat, pdl, pdl_wait_at,
            w_kc_scale=w_kc_scale, qcat=(q_pe, pool_loc, kv_pool))
    return q_cat


@_d2_absorb_kv_store_qcat.register_fake
def _d2_absorb_kv_store_qcat_fake(q_nope, c_kv, k_pe, w_kc, w_kc_scale, positions, out_cache_loc, kv_cache, q_pe,
                                  pool_loc, kv_pool, rope_theta, pdl=True, pdl_wait_at=PDL_WAIT_NATIVE):
    cfg = _check_qcat(q_nope, c_kv, k_pe, w_kc, w_kc_scale, positions, out_cache_loc, kv_cache, q_pe, pool_loc,
                      kv_pool, rope_theta)
    check_wait_at(OP_QCAT, pdl_wait_at)
    m, heads, _ = q_nope.shape
    return q_nope.new_empty((m, heads, cfg.kv_lora + cfg.rope))


def d2_absorb_qcat(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w, positions: torch.Tensor,
                   out_cache_loc: torch.Tensor, kv_cache: torch.Tensor, q_pe: torch.Tensor, pool_loc: torch.Tensor,
                   kv_pool: torch.Tensor, cfg, *, pdl: bool = True, pdl_wait: str | None = None) -> torch.Tensor:
    """q_cat [M, heads, kv_lora + rope] bf16 = [q_lat | q_pe] (q_lat as d2_absorb_and_kv_store's, bitwise), writing
    the latent-KV rows IN PLACE into kv_cache[out_cache_loc] AND kv_pool[pool_loc] (ref.prefix.d2_absorb_qcat).

    Why: SGLang's DSA decode concatenates q_nope and q_pe for the sparse MLA (one kernel per layer) and stores the
    latent-KV row (another) unless it is handed one [T, H, 576] q and no k (what its own fused tilelang path does);
    this form lets the SGLang seam do that (integrations/sglang/qcat_route.py). Weights as d2_absorb_and_kv_store
    (w.w_kc bf16, or the W8A16 form when uses_w8(w)). pool_loc is int64 (SGLang's out_cache_loc).
    """
    w8 = uses_w8(w)
    wait_at = pdl_wait_code(OP_QCAT, pdl_wait, _fail_qcat)
    weight, scale = (w.w_kc_fp8, getattr(w, "w_kc_scale", None)) if w8 else (getattr(w, "w_kc", None), None)
    if w8 and scale is None:
        raise _fail_qcat("w.w_kc_fp8 is set but w.w_kc_scale is None")
    _check_qcat(q_nope, c_kv, k_pe, weight, scale, positions, out_cache_loc, kv_cache, q_pe, pool_loc, kv_pool,
                getattr(cfg, "rope_theta", None))
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    got = (q_nope.shape[1], q_nope.shape[2], k_pe.shape[1], weight.shape[2])
    if got != (h, nope, r, kvl):
        raise _fail_qcat(f"tensor dims (heads, nope, rope, kv_lora) = {got} do not match the config's {(h, nope, r, kvl)}")
    return torch.ops.glm5_fastpath.d2_absorb_kv_store_qcat(q_nope, c_kv, k_pe, weight, scale, positions, out_cache_loc,
                                                           kv_cache, q_pe, pool_loc, kv_pool, float(cfg.rope_theta),
                                                           pdl, wait_at)


def uses_w8(w) -> bool:
    """Whether d2_absorb_and_kv_store takes the W8A16 path for weights `w`: no bf16 w_kc, an FP8 w_kc_fp8."""
    return getattr(w, "w_kc", None) is None and getattr(w, "w_kc_fp8", None) is not None


def d2_absorb_and_kv_store(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w, positions: torch.Tensor,
                           out_cache_loc: torch.Tensor, kv_cache: torch.Tensor, cfg, *, pdl: bool = True,
                           pdl_wait: str | None = None) -> torch.Tensor:
    """q_lat [M, heads, kv_lora] bf16; writes kv_cache rows out_cache_loc IN PLACE (ref.prefix.d2_absorb_and_kv_store).

    w: glm5_fastpath.weights.AttnWeights; cfg: Glm5Config (dims and rope_theta). The bf16 op reads w.w_kc; when
    w.w_kc is None and w.w_kc_fp8 is set (uses_w8), the W8A16 op d2_absorb_kv_store_w8 reads w.w_kc_fp8 and
    w.w_kc_scale instead (the same q_lat bit for bit as the bf16 op on ref.fp8.dequant_w_kc of them).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native.
    """
    if uses_w8(w):
        wait_at = pdl_wait_code(OP_W8, pdl_wait, _fail_w8)
        w8, scale = w.w_kc_fp8, getattr(w, "w_kc_scale", None)
        _check_inputs(q_nope, c_kv, k_pe, w8, positions, out_cache_loc, kv_cache, getattr(cfg, "rope_theta", None),
                      scale, w8=True)
        h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        got = (q_nope.shape[1], q_nope.shape[2], k_pe.shape[1], w8.shape[2])
        if got != (h, nope, r, kvl):
            raise _fail_w8(f"tensor dims (heads, nope, rope, kv_lora) = {got} do not match the config's "
                           f"{(h, nope, r, kvl)}")
        return torch.ops.glm5_fastpath.d2_absorb_kv_store_w8(q_nope, c_kv, k_pe, w8, scale, positions, out_cache_loc,
                                                             kv_cache, float(cfg.rope_theta), pdl, wait_at)
    wait_at = pdl_wait_code(OP, pdl_wait, _fail)
    w_kc = getattr(w, "w_kc", None)
    _check_inputs(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache, getattr(cfg, "rope_theta", None))
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    got = (q_nope.shape[1], q_nope.shape[2], k_pe.shape[1], w_kc.shape[2])
    if got != (h, nope, r, kvl):
        raise _fail(f"tensor dims (heads, nope, rope, kv_lora) = {got} do not match the config's {(h, nope, r, kvl)}")
    return torch.ops.glm5_fastpath.d2_absorb_kv_store(q_nope, c_kv, k_pe, w_kc, positions, out_cache_loc, kv_cache,
                                                      float(cfg.rope_theta), pdl, wait_at)


def precompile(device: object = None, dims: tuple[tuple[int, int, int, float], ...] = ((192, 512, 64, 1e6),),
               wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,), w8: tuple[bool, ...] | None = None,
               qcat: tuple[bool, ...] = (False,)) -> None:
    """Compile (or fetch from cache) and load both M variants for these (nope, kv_lora, rope, rope_theta) on
    `device`, for each PDL wait point in `wait_ats` and each weight form in `w8` (False: bf16 w_kc, True: the
    W8A16 build of d2_absorb_kv_store_w8; None: the W8A16 build too only when GLM5_FASTPATH_D2_WEIGHTS asks for
    fp8 / auto, since it is opt-in), and upload the RoPE table, ahead of first use (and outside any CUDA-graph
    capture). qcat: the forms to load (True: d2_absorb_kv_store_qcat's build, which the SGLang seam's q_cat route
    uses)."""
    if w8 is None:
        from ..graph.prefix_graph import d2_weights_request

        w8 = (False, True) if d2_weights_request() != "bf16" else (False,)
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for nope, kvl, r, theta in dims:
        for m in (1, MAX_TOKENS):
            for w in wait_ats:
                for q8 in dict.fromkeys(bool(x) for x in w8):
                    for qc in dict.fromkeys(bool(x) for x in qcat):
                        _kernel(replace(config_for(nope, kvl, r, m, w8=q8, qcat=qc), wait_at=w), dev)
        _inv_freq_on(dev, r, theta)


def compile_check_specs() -> list[KernelSpec]:
    """GLM-5 (192, 512, 64) and the small preset (64, 128, 32), each in both M variants, bf16 then W8A16; then the
    q_cat form of GLM-5 (bf16, W8A16) at both M variants."""
    return ([config_for(n, k, r, m, w8=q8).spec for q8 in (False, True) for n, k, r in ((192, 512, 64), (64, 128, 32))
             for m in (1, MAX_TOKENS)]
            + [config_for(192, 512, 64, m, w8=q8, qcat=True).spec for q8 in (False, True) for m in (1, MAX_TOKENS)])
