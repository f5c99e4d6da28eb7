"""MLA's V up-projection fused with o_proj's activation quant (the W_UV bmm), as torch.library custom ops.

After the sparse-MLA core, SGLang's absorbed MLA multiplies each head's latent output by W_UV (a cuBLAS bf16 bmm,
[T, H, 512] x [H, 512, V] -> [T, H * V], GLM-5: V = v_head_dim = 256) and o_proj then quantises that row per 1x128
group (SGLang's per-token-group quant, or our act_quant_fp8 on the FP8-linear route). With V a multiple of 128, every
quant group is 128 output columns of one head, so one kernel does both:

    y[t, h, :]  = bf16( sum_l o[t, h, l] * w_vc[h, l, :] )          fp32 accumulation of exact bf16 products
    y8, ys      = act_quant_fp8(y.view(T, H * V))                    bitwise ref.fp8.quant_act_per_token of y

Why: at batch 1 on the H200 the bmm was ~6.6 us per layer against a 3.9 us bytes floor (16.8 MB of bf16 W_UV for
64 heads; docs/decode_budget.md) and the act quant another launch. Each CTA copies its 128 x 512 slice of W_UV into
shared memory (bulk copies) before griddepcontrol.wait, i.e. while the sparse-MLA combine runs, so after the wait
only the latent rows (T KB per head) are read.

Inputs:
- o [T, H, L] bf16 (L = 512 = kv_lora_rank): the attention core's output; the last dim contiguous, 16-byte aligned
  rows (row / head strides multiples of 8 elements); T in 1..MAX_TOKENS.
- w_vc [H, L, V] bf16 (V = v_head_dim, a multiple of 128) laid out as SGLang keeps it: each head's [V, L] rows
  contiguous (strides (V * L, 1, L), i.e. `w.transpose(1, 2)` of a contiguous [H, V, L]), or any layout with stride(1) == 1
  and stride(2) a multiple of 8; stride(0) a multiple of 8.
Outputs (contiguous, new or given through out=): y [T, H * V] bf16, y8 [T, H * V] float8_e4m3fn, ys [T, H * V / 128]
fp32 (row-major: act_quant_fp8's "scales" layout, what fp8_gemm_skinny takes).

Ops (namespace glm5_fastpath; fake implementations for torch.compile / graphs):
- torch.ops.glm5_fastpath.mla_v_up_quant(o, w_vc, pdl=True) -> (y, y8, ys)
- torch.ops.glm5_fastpath.mla_v_up_quant_out(o, w_vc, y, y8, ys, pdl=True) -> None
CPU tensors run the reference (`reference`); `pdl` is ignored there.

Kernel (csrc/attn_core/mla_v_up.{cuh,cu}): one CTA of 8 warps per (head, 128 output columns), H * V / 128 CTAs.
The CTA's 128 KB of W_UV comes in as 128 one-row bulk copies (L2 evict-first) issued before the PDL wait; after
the wait the latent rows are staged with cp.async; warp w runs mma.sync m16n8k16 for the CTA's output rows
[16w, 16w + 16) (weights on M, tokens on N, the K order permuted identically in A and B so each fragment is one
16-byte shared load). The fp32 accumulators are rounded to bf16 into shared memory, then one half-warp per token
quantises the CTA's 128 values (ActQuantGroupTile::quantize, the act_quant_fp8 math) and stores y, y8 and the
scale. Builds for 1, 2, 4, 8 token tiles (T <= 8, 16, 32, 64). The sum order differs from cuBLAS's, so y may
differ from SGLang's bmm in the last bf16 bit; y8 / ys are then bitwise act_quant_fp8(y).

W8 form (`mla_v_up_quant_w8`, op glm5_fastpath.mla_v_up_quant_w8; written in session 34, GPU-run in session 35):
W_UV read from SGLang's kv_b_proj itself, e4m3 [H * (N + V), 512] (N = qk_nope_head_dim; head h's V rows follow
its N W_UK rows) with fp32 128x128 block scales, dequantised in the kernel as bf16(f32(e) * s), which is exactly the
bf16 w_vc SGLang derives from the same tensors (block_quant_dequant), so the result must be bitwise the bf16 form's
on SGLang's w_vc (`dequant_w_vc`). Half the weight bytes (8.4 MB per GLM-5 layer) and half the shared memory.
Measured (H200, 2026-12-03, bench v-up): bitwise the bf16 form at 1-64 tokens, and no faster alone (6.57 / 6.70 / 6.28
us at 1 / 8 / 16 tokens against 6.63 / 6.81 / 6.54): the op is bound by launch and per-CTA latency, not by its bytes.
In the chain sparse MLA -> W_UV -> o_proj it gains at 4-16 tokens (57.6 / 58.3 / 63.8 us against 61.5 / 65.1 / 65.9 for
the bf16 form and 58.6 / 63.6 / 67.5 for SGLang's), where the bf16 form's shared memory keeps o_proj's CTAs off the SMs.

Errors: wrong type / dtype / shape / stride / device / alignment, T outside 1..MAX_TOKENS, L != 512, V not a
multiple of 128 -> MlaVUpInputError (a ValueError) naming the op; a pre-sm_90 GPU -> RuntimeError.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from ..config import ACT_QUANT_EPS
from ..jit import KernelSpec, env
from ._device import device_index as _device_index, overlaps as _overlaps, require_aligned, require_hopper

OP = "glm5_fastpath.mla_v_up_quant"
SOURCE = "attn_core/mla_v_up.cu"
L_DIM = 512  # kv_lora_rank (VUpTile::kL)
V_BLOCK = 128  # output columns per CTA = the FP8 group (VUpTile::kV); v_head_dim must be a multiple
TOKEN_TILES = (1, 2, 4, 8)  # builds: n-tiles of 8 tokens
MAX_TOKENS = 8 * TOKEN_TILES[-1]
THREADS = 256
FUNCTIONS = tuple(f"glm5_mla_v_up_nt{n}" for n in TOKEN_TILES)
FUNCTIONS_W8 = tuple(f"glm5_mla_v_up_w8_nt{n}" for n in TOKEN_TILES)
SPEC = KernelSpec("glm5_mla_v_up", source=SOURCE, functions=FUNCTIONS + FUNCTIONS_W8)
SCALE_BLOCK = 128  # kv_b_proj's 128x128 weight blocks
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


class MlaVUpInputError(ValueError):
    """mla_v_up_quant got an input or output of the wrong type / dtype / shape / stride / device."""


class VUpResult(NamedTuple):
    y: torch.Tensor  # [T, H * V] bf16
    y8: torch.Tensor  # [T, H * V] float8_e4m3fn
    ys: torch.Tensor  # [T, H * V / 128] fp32, row-major


def _fail(msg: str) -> MlaVUpInputError:
    return MlaVUpInputError(f"{OP}: {msg}")


def token_tiles(t: int) -> int:
    """The build for T tokens: the fewest 8-token tiles among TOKEN_TILES that hold T."""
    for n in TOKEN_TILES:
        if t <= 8 * n:
            return n
    raise _fail(f"T={t} tokens is more than the kernel takes ({MAX_TOKENS})")


# ---- validation (shared by the real and the fake implementations) --------------------------------

def _check_o(o: object) -> tuple[int, int]:
    """-> (T, H) of a valid latent input o [T, H, 512] (both forms take it)."""
    if not isinstance(o, torch.Tensor):
        raise _fail(f"o must be a torch.Tensor, got {type(o).__name__}")
    if o.dtype != BF16:
        raise _fail(f"o must be torch.bfloat16 (bf16), got {o.dtype}")
    if o.dim() != 3 or o.shape[2] != L_DIM:
        raise _fail(f"o must be 3-D [T, H, {L_DIM}] (kv_lora_rank {L_DIM}), got shape {tuple(o.shape)}")
    t_, h, _ = o.shape
    if isinstance(t_, int) and not 1 <= t_ <= MAX_TOKENS:
        raise _fail(f"T={t_} tokens: the kernel takes 1..{MAX_TOKENS}")
    if h < 1:
        raise _fail("H must be at least 1")
    if o.stride(2) != 1 or (t_ > 1 and o.stride(0) % 8) or (h > 1 and o.stride(1) % 8):
        raise _fail(f"o needs a contiguous last dim and row / head strides that are multiples of 8 elements "
                    f"(16-byte loads), got strides {o.stride()}")
    return t_, h


def _check_inputs(o: object, w_vc: object) -> tuple[int, int, int]:
    """-> (T, H, V) of valid inputs."""
    t_, h = _check_o(o)
    if not isinstance(w_vc, torch.Tensor):
        raise _fail(f"w_vc must be a torch.Tensor, got {type(w_vc).__name__}")
    if w_vc.dtype != BF16:
        raise _fail(f"w_vc must be torch.bfloat16, got {w_vc.dtype}")
    if w_vc.dim() != 3:
        raise _fail(f"w_vc must be 3-D, got shape {tuple(w_vc.shape)}")
    v = w_vc.shape[2]
    if tuple(w_vc.shape[:2]) != (h, L_DIM) or (isinstance(v, int) and (v <= 0 or v % V_BLOCK)):
        raise _fail(f"w_vc must be [H, {L_DIM}, V] with H = {h} (o's heads) and V a positive multiple of {V_BLOCK}, "
                    f"got {tuple(w_vc.shape)}")
    if w_vc.stride(1) != 1 or w_vc.stride(2) % 8 or (h > 1 and w_vc.stride(0) % 8):
        raise _fail(f"w_vc must hold each head's [V, {L_DIM}] rows with the {L_DIM} contiguous (SGLang's "
                    f"layout: strides (V * {L_DIM}, 1, {L_DIM})); stride(2) and stride(0) multiples of 8, got "
                    f"strides {w_vc.stride()}")
    if o.device != w_vc.device:
        raise _fail(f"o and w_vc must be on one device, got {o.device} and {w_vc.device}")
    return t_, h, v


def _check_outputs(o: torch.Tensor, w_vc: torch.Tensor, y: object, y8: object, ys: object) -> None:
    t_, h, v = o.shape[0], o.shape[1], w_vc.shape[2]
    for name, t, dt, shape in (("y", y, BF16, (t_, h * v)), ("y8", y8, FP8, (t_, h * v)),
                               ("ys", ys, torch.float32, (t_, h * v // V_BLOCK))):
        if not isinstance(t, torch.Tensor):
            raise _fail(f"out {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dt:
            raise _fail(f"out {name} must be {dt}, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise _fail(f"out {name} must have shape {shape} for o of shape {tuple(o.shape)}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise _fail(f"out {name} must be contiguous, got strides {t.stride()}")
        if t.device != o.device:
            raise _fail(f"out {name} must be on {o.device}, got {t.device}")


def _check_no_overlap(o: torch.Tensor, w_vc: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
    names = list(outs)
    for i, a in enumerate(names):
        for src_name, src in (("o", o), ("w_vc", w_vc)):
            if _overlaps(outs[a], src):
                raise _fail(f"output {a} overlaps input {src_name} in memory")
        for b in names[i + 1:]:
            if _overlaps(outs[a], outs[b]):
                raise _fail(f"outputs {a} and {b} overlap in memory")


def _check_pdl(pdl: object) -> None:
    if not isinstance(pdl, bool):
        raise _fail(f"pdl must be a bool, got {pdl!r}")


# ---- reference ------------------------------------------------------------------------------------------------

def reference(o: torch.Tensor, w_vc: torch.Tensor) -> VUpResult:
    """The op's math on any device: fp32 bmm of the bf16 inputs rounded to bf16, then the 1x128 quant."""
    from ..ref.fp8 import quant_act_per_token

    t_, h, _ = o.shape
    y = torch.einsum("thl,hlv->thv", o.float(), w_vc.float()).to(BF16).reshape(t_, h * w_vc.shape[2]).contiguous()
    q, s = quant_act_per_token(y)
    return VUpResult(y, q.contiguous(), s.contiguous())


# ---- launch ------------------------------------------------------------------------------------------------

_kernels: dict[tuple[int, str], object] = {}


def _kernel(idx: int, function: str):
    k = _kernels.get((idx, function))
    if k is None:
        from ..jit.runtime import get_kernel
        k = _kernels[(idx, function)] = get_kernel(SPEC, function, device=torch.device("cuda", idx))
    return k


def smem_bytes(nt: int, w8: bool = False) -> int:
    """Dynamic shared memory of the nt-tile build (VUpTile::kSmemBytes): 128 W_UV rows (bf16: 1024 + 64 B; e4m3:
    512 + 32 B), 8 nt latent rows of 1024 + 64 B, 8 nt bf16 output rows of 136 elements, one mbarrier."""
    row = L_DIM * 2 + 64
    w_row = L_DIM + 32 if w8 else row
    return V_BLOCK * w_row + 8 * nt * (row + (V_BLOCK + 8) * 2) + 16


def _kernel_args(o, w_vc, y, y8, ys) -> tuple:
    """The kernel's parameter list, in csrc/attn_core/mla_v_up.cu order (checked at load)."""
    t_, h, _ = o.shape
    return (o, w_vc, y, y8, ys, ctypes.c_int64(o.stride(0) if t_ > 1 else h * L_DIM),
            ctypes.c_int64(o.stride(1) if h > 1 else L_DIM),
            ctypes.c_int64(w_vc.stride(0) if h > 1 else w_vc.shape[2] * L_DIM),
            ctypes.c_int64(w_vc.stride(2)), ctypes.c_int32(t_), ctypes.c_int32(h),
            ctypes.c_int32(w_vc.shape[2] // V_BLOCK), ctypes.c_float(ACT_QUANT_EPS))


def _launch(o, w_vc, y, y8, ys, pdl: bool) -> None:
    idx = require_hopper(OP, o.device, _fail)
    require_aligned(_fail, {"o": o, "w_vc": w_vc, "y": y, "y8": y8, "ys": ys})
    t_, h, _ = o.shape
    nt = token_tiles(t_)
    grid = h * (w_vc.shape[2] // V_BLOCK)
    env.print_config("mla_v_up_quant", {"T": t_, "H": h, "V": w_vc.shape[2]},
                     {"token_tiles": nt, "grid": grid, "threads": THREADS})
    _kernel(idx, f"glm5_mla_v_up_nt{nt}").launch((grid, 1, 1), (THREADS, 1, 1), _kernel_args(o, w_vc, y, y8, ys),
                                                 smem=smem_bytes(nt), pdl=pdl)


def _new_outputs(o: torch.Tensor, v: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t_, h, _ = o.shape
    return (torch.empty((t_, h * v), dtype=BF16, device=o.device),
            torch.empty((t_, h * v), dtype=FP8, device=o.device),
            torch.empty((t_, h * v // V_BLOCK), dtype=torch.float32, device=o.device))


# ---- the W8 form: SGLang's kv_b_proj rows + block scales ---------------------------------------------------

def dequant_w_vc(kv_b_w8: torch.Tensor, kv_b_scale: torch.Tensor, num_heads: int, nope: int) -> torch.Tensor:
    """SGLang's bf16 w_vc from kv_b_proj (its weight loader: block_quant_dequant, then the V rows of each head,
    transposed): [H, L, V] bf16 with each head's [V, L] rows contiguous. What the W8 kernel multiplies by."""
    from ..ref.fp8 import dequant_w_kc, w_vc_fp8_from_kv_b

    return dequant_w_kc(*w_vc_fp8_from_kv_b(kv_b_w8, kv_b_scale, num_heads, nope)).transpose(1, 2)


def _check_w8(o: object, kv_b_w8: object, kv_b_scale: object, nope: object) -> tuple[int, int, int]:
    """-> (T, H, V) of valid W8 inputs."""
    t_, h = _check_o(o)
    if not isinstance(kv_b_w8, torch.Tensor) or kv_b_w8.dtype != FP8 or kv_b_w8.dim() != 2 or not kv_b_w8.is_contiguous():
        raise _fail("kv_b_w8 must be a contiguous float8_e4m3fn [H * (qk_nope_head_dim + v_head_dim), 512] tensor "
                    "(SGLang's kv_b_proj.weight)")
    rows, l_dim = kv_b_w8.shape
    if not isinstance(nope, int) or isinstance(nope, bool) or nope < 0:
        raise _fail(f"nope (qk_nope_head_dim) must be an int >= 0, got {nope!r}")
    if l_dim != L_DIM or h < 1 or rows % h:
        raise _fail(f"kv_b_w8 of shape {tuple(kv_b_w8.shape)} is not [H * head_rows, {L_DIM}] for H = {h}")
    v = rows // h - nope
    if v <= 0 or v % V_BLOCK:
        raise _fail(f"v_head_dim = rows / H - nope = {v} must be a positive multiple of {V_BLOCK}")
    want = (-(-rows // SCALE_BLOCK), L_DIM // SCALE_BLOCK)
    if (not isinstance(kv_b_scale, torch.Tensor) or kv_b_scale.dtype != torch.float32
            or tuple(kv_b_scale.shape) != want or not kv_b_scale.is_contiguous()):
        raise _fail(f"kv_b_scale must be a contiguous fp32 {want} tensor (128x128 block scales)")
    if len({o.device, kv_b_w8.device, kv_b_scale.device}) != 1:
        raise _fail("o, kv_b_w8 and kv_b_scale must be on one device")
    return t_, h, v


def _launch_w8(o, w8, sc, nope, y, y8, ys, pdl: bool) -> None:
    idx = require_hopper(OP, o.device, _fail)
    require_aligned(_fail, {"o": o, "kv_b_w8": w8, "kv_b_scale": sc, "y": y, "y8": y8, "ys": ys})
    t_, h, _ = o.shape
    hr = w8.shape[0] // h
    v = hr - nope
    nt = token_tiles(t_)
    grid = h * (v // V_BLOCK)
    env.print_config("mla_v_up_quant_w8", {"T": t_, "H": h, "V": v}, {"token_tiles": nt, "grid": grid})
    args = (o, w8, sc, y, y8, ys, ctypes.c_int64(o.stride(0) if t_ > 1 else h * L_DIM),
            ctypes.c_int64(o.stride(1) if h > 1 else L_DIM), ctypes.c_int64(L_DIM), ctypes.c_int32(sc.shape[1]),
            ctypes.c_int32(hr), ctypes.c_int32(nope), ctypes.c_int32(t_), ctypes.c_int32(h),
            ctypes.c_int32(v // V_BLOCK), ctypes.c_float(ACT_QUANT_EPS))
    _kernel(idx, f"glm5_mla_v_up_w8_nt{nt}").launch((grid, 1, 1), (THREADS, 1, 1), args, smem=smem_bytes(nt, True),
                                                    pdl=pdl)


@torch.library.custom_op("glm5_fastpath::mla_v_up_quant_w8", mutates_args=())
def _mla_v_up_quant_w8(o: torch.Tensor, kv_b_w8: torch.Tensor, kv_b_scale: torch.Tensor, nope: int,
                       pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, h, v = _check_w8(o, kv_b_w8, kv_b_scale, nope)
    if o.device.type == "cpu":
        return tuple(reference(o, dequant_w_vc(kv_b_w8, kv_b_scale, h, nope)))
    y, y8, ys = _new_outputs(o, v)
    _launch_w8(o, kv_b_w8, kv_b_scale, nope, y, y8, ys, pdl)
    return y, y8, ys


@_mla_v_up_quant_w8.register_fake
def _mla_v_up_quant_w8_fake(o, kv_b_w8, kv_b_scale, nope, pdl=True):
    t_, h, v = _check_w8(o, kv_b_w8, kv_b_scale, nope)
    return (o.new_empty((t_, h * v), dtype=BF16), o.new_empty((t_, h * v), dtype=FP8),
            o.new_empty((t_, h * v // V_BLOCK), dtype=torch.float32))


def mla_v_up_quant_w8(o: torch.Tensor, kv_b_w8: torch.Tensor, kv_b_scale: torch.Tensor, nope: int, *,
                      pdl: bool = True) -> VUpResult:
    """mla_v_up_quant with W_UV taken from SGLang's FP8 kv_b_proj (module docstring, "W8 form"): bitwise
    mla_v_up_quant(o, dequant_w_vc(kv_b_w8, kv_b_scale, H, nope)) (GPU-tested on the H200, 2026-12-03)."""
    _check_w8(o, kv_b_w8, kv_b_scale, nope)
    _check_pdl(pdl)
    return VUpResult(*torch.ops.glm5_fastpath.mla_v_up_quant_w8(o, kv_b_w8, kv_b_scale, nope, pdl))


# ---- custom ops ----------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::mla_v_up_quant", mutates_args=())
def _mla_v_up_quant(o: torch.Tensor, w_vc: torch.Tensor, pdl: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_inputs(o, w_vc)
    if o.device.type == "cpu":
        return tuple(reference(o, w_vc))
    y, y8, ys = _new_outputs(o, w_vc.shape[2])
    _launch(o, w_vc, y, y8, ys, pdl)
    return y, y8, ys


@_mla_v_up_quant.register_fake
def _mla_v_up_quant_fake(o, w_vc, pdl=True):
    t_, h, v = _check_inputs(o, w_vc)
    return (o.new_empty((t_, h * v), dtype=BF16), o.new_empty((t_, h * v), dtype=FP8),
            o.new_empty((t_, h * v // V_BLOCK), dtype=torch.float32))


@torch.library.custom_op("glm5_fastpath::mla_v_up_quant_out", mutates_args=("y", "y8", "ys"))
def _mla_v_up_quant_out(o: torch.Tensor, w_vc: torch.Tensor, y: torch.Tensor, y8: torch.Tensor, ys: torch.Tensor,
                        pdl: bool = True) -> None:
    _check_inputs(o, w_vc)
    _check_outputs(o, w_vc, y, y8, ys)
    _check_no_overlap(o, w_vc, {"y": y, "y8": y8, "ys": ys})
    if o.device.type == "cpu":
        r = reference(o, w_vc)
        y.copy_(r.y), y8.copy_(r.y8), ys.copy_(r.ys)
        return
    _launch(o, w_vc, y, y8, ys, pdl)


@_mla_v_up_quant_out.register_fake
def _mla_v_up_quant_out_fake(o, w_vc, y, y8, ys, pdl=True):
    _check_inputs(o, w_vc)
    _check_outputs(o, w_vc, y, y8, ys)


def mla_v_up_quant(o: torch.Tensor, w_vc: torch.Tensor, *,
                   out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, pdl: bool = True) -> VUpResult:
    """y = bf16(o . W_UV) per head and its 1x128 FP8 quant (module docstring). out: None allocates; (y, y8, ys)
    writes into them (contiguous, e.g. CUDA-graph static buffers). pdl: launch with PDL (GPU only)."""
    _check_inputs(o, w_vc)  # before the dispatcher, so errors name this op
    _check_pdl(pdl)
    if out is None:
        return VUpResult(*torch.ops.glm5_fastpath.mla_v_up_quant(o, w_vc, pdl))
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise _fail(f"out must be None or a triple (y, y8, ys), got {type(out).__name__}")
    y, y8, ys = out
    _check_outputs(o, w_vc, y, y8, ys)
    torch.ops.glm5_fastpath.mla_v_up_quant_out(o, w_vc, y, y8, ys, pdl)
    return VUpResult(y, y8, ys)


def precompile(device: object = None) -> None:
    """Compile (or fetch from cache) and load the kernels on `device` (default: current), ahead of first use."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    for fn in FUNCTIONS + FUNCTIONS_W8:
        _kernel(_device_index(dev), fn)


def compile_check_specs() -> list[KernelSpec]:
    """The one spec scripts/compile_check.py builds (eight functions in one cubin: bf16 and W8, four token tiles)."""
    return [SPEC]
