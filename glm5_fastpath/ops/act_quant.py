"""Per-token 1x128 FP8 activation quantization (bf16 -> e4m3 + fp32 scales), as torch.library custom ops.

For MegaMoE when the MoE input arrives as bf16 (SGLang's MoE seam hands over bf16 hidden states
[M, H]): `x8, scales = act_quant_fp8(hidden)` gives exactly the (x_fp8, x_scale) pair
`glm5_fastpath.moe.megamoe.mega_moe` takes.

Math (bit for bit glm5_fastpath.ref.fp8.quant_act_per_token; eps = config.ACT_QUANT_EPS):

    per 128-column group g of row m:
        scales[m, g] = fp32(max(amax_g |x|, eps) / 448)    correctly rounded (IEEE fp32 divide)
        x8[m, g*128 : (g+1)*128] = e4m3(x / scales[m, g])   IEEE divide, round-to-nearest-even,
                                                            saturating at +-448

A group containing a NaN gets a NaN scale and NaN bytes, as in the reference (torch.amax propagates
NaN); the kernel writes the canonical e4m3 NaN 0x7f where the CPU reference may write 0xff (the sign of
the NaN it converts). Every other input, infinities included, gives the reference's bytes.

Inputs: x [M, H] bf16, H a positive multiple of 128, last dim contiguous; the row stride may be
anything (> H: a view into a wider buffer) but, on the GPU with M > 1, a multiple of 8 elements
(16-byte aligned rows for the 16-byte loads); M may be 0; M * H/128 < 2^31.
Outputs: x8 [M, H] float8_e4m3fn contiguous, scales [M, H/128] fp32 contiguous (row-major: the
"row" layout of add_rmsnorm_quant and what mega_moe's _check_inputs requires).

Ops (namespace glm5_fastpath; each with a fake implementation for torch.compile / graphs):

- torch.ops.glm5_fastpath.act_quant_fp8(x, pdl=True) -> (x8, scales), functional.
- torch.ops.glm5_fastpath.act_quant_fp8_out(x, x8, scales, pdl=True) -> None, writes the given
  outputs (CUDA-graph static buffers); they must not overlap x or each other.

Python entry point: `act_quant_fp8(x, *, out=None, pdl=True) -> ActQuantResult(x8, scales)`;
out=(x8, scales) selects the out op.

CPU tensors: both ops run the reference (glm5_fastpath.ref.fp8.quant_act_per_token) instead of the
kernel, so a CPU model and the tests share one entry point; `pdl` is ignored there. Any other device
type raises ActQuantInputError.

Kernel (csrc/moe/act_quant.{cuh,cu}): memory bound. One aligned half-warp per 128-column group, one
16-byte load of 8 bf16 per lane (every load of a group in flight at once), a 4-step NaN-propagating
butterfly for the group amax, one 8-byte e4m3 store per lane, lane 0 of the half writes the scale. The
groups are numbered flat over (row, group), so any H/128 packs the warps densely; the CTA size T (32 to
256 threads, launch_shape) is the largest that still gives at least one CTA per SM, so at M=1..256 the
grid spreads over the SMs and at large M CTAs stay big. One cubin serves every shape (M, H and the row
stride are arguments). PDL: launch_dependents at entry, griddepcontrol.wait right before the first read
of x (nothing to prefetch); GLM5_FASTPATH_DISABLE_PDL=1 turns the attribute off globally. No workspace,
deterministic, capture-safe.

Errors: wrong type / dtype / shape / stride / device / alignment / overlapping outputs ->
ActQuantInputError (a ValueError) naming the op; a pre-sm_90 GPU -> RuntimeError.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from ..config import ACT_QUANT_EPS, FP8_BLOCK, FP8_MAX
from ..jit import KernelSpec, env
from ._device import device_index as _device_index, overlaps as _overlaps, require_aligned, require_hopper

OP = "glm5_fastpath.act_quant_fp8"
SOURCE = "moe/act_quant.cu"
FUNCTION = "glm5_act_quant_fp8"
SPEC = KernelSpec(FUNCTION, source=SOURCE)
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
GROUP = 128  # ActQuantGroupTile::kGroup
VEC = 8  # bf16 per 16-byte vector
LANES_PER_GROUP = GROUP // VEC  # 16: one aligned half-warp per group
CTA_THREADS = (256, 128, 64, 32)  # candidates, largest first (GLM5_ACT_QUANT_MAX_THREADS = 256)
MAX_GROUPS = 2**31 - 1  # the kernel's flat uint32 group index

# The kernel hard-codes the group size and the e4m3 maximum; fail at import if they ever drift apart.
if (FP8_BLOCK, FP8_MAX) != (GROUP, 448.0):
    raise ImportError(f"{OP}: csrc/moe/act_quant.cuh hard-codes group 128 and max 448; "
                      f"glm5_fastpath.config now says {FP8_BLOCK}, {FP8_MAX}")


class ActQuantInputError(ValueError):
    """act_quant_fp8 got an input or output of the wrong type / dtype / shape / stride / device."""


class ActQuantResult(NamedTuple):
    x8: torch.Tensor  # [M, H] float8_e4m3fn
    scales: torch.Tensor  # [M, H/128] fp32, row-major


def _fail(msg: str) -> ActQuantInputError:
    return ActQuantInputError(f"{OP}: {msg}")


# ---- validation (shared by the real and the fake implementations) --------------------------------

def _check_x(x: object) -> tuple[int, int]:
    """-> (M, H) of a valid input."""
    if not isinstance(x, torch.Tensor):
        raise _fail(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != BF16:
        raise _fail(f"x must be torch.bfloat16, got {x.dtype}")
    if x.dim() != 2:
        raise _fail(f"x must be 2-D [M, H], got shape {tuple(x.shape)}")
    m, h = x.shape
    if h <= 0 or h % GROUP:
        raise _fail(f"hidden size H={h} is not supported: H must be a positive multiple of {GROUP}")
    if x.stride(1) != 1:
        raise _fail(f"x must have a contiguous last dim (stride 1), got strides {x.stride()} for shape {tuple(x.shape)}")
    if isinstance(m, int) and m * (h // GROUP) > MAX_GROUPS:
        raise _fail(f"M={m} rows x {h // GROUP} groups exceeds the kernel's limit of 2^31-1 groups")
    return m, h


def _check_outputs(x: torch.Tensor, x8: object, scales: object) -> None:
    m, h = x.shape
    g = h // GROUP
    for name, t, dt, shape in (("x8", x8, FP8, (m, h)), ("scales", scales, torch.float32, (m, g))):
        if not isinstance(t, torch.Tensor):
            raise _fail(f"out {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dt:
            raise _fail(f"out {name} must be {dt}, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise _fail(f"out {name} must have shape {shape} for x of shape {(m, h)}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise _fail(f"out {name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
    devices = {t.device for t in (x, x8, scales)}
    if len(devices) != 1:
        raise _fail(f"x and the outputs must be on one device, got {sorted(map(str, devices))}")


def _check_no_overlap(x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor) -> None:
    for name, t in (("x8", x8), ("scales", scales)):
        if _overlaps(t, x):
            raise _fail(f"output {name} overlaps input x in memory")
    if _overlaps(x8, scales):
        raise _fail("outputs x8 and scales overlap in memory")


def _check_pdl(pdl: object) -> None:
    if not isinstance(pdl, bool):
        raise _fail(f"pdl must be a bool, got {pdl!r}")


# ---- launch ------------------------------------------------------------------------------------------

def launch_shape(total_groups: int, num_sms: int) -> tuple[int, int]:
    """(threads per CTA, CTAs) for `total_groups` = M * H/128 groups: the largest CTA (256..32 threads)
    that still gives at least one CTA per SM, else 32. E.g. on 132 SMs, H=6144: M=1 -> 32 x 24,
    M=16 -> 64 x 192, M=64 -> 256 x 192; H=7168, M=256 -> 256 x 896."""
    if total_groups <= 0:
        return CTA_THREADS[-1], 0
    for t in CTA_THREADS:
        ctas = -(-total_groups // (t // LANES_PER_GROUP))
        if ctas >= num_sms:
            return t, ctas
    t = CTA_THREADS[-1]
    return t, -(-total_groups // (t // LANES_PER_GROUP))


_sms_cache: dict[int, int] = {}
_kernels: dict[int, object] = {}


def _num_sms(idx: int) -> int:
    n = _sms_cache.get(idx)
    if n is None:
        n = _sms_cache[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


def _kernel(idx: int):
    k = _kernels.get(idx)
    if k is None:
        from ..jit.runtime import get_kernel
        k = _kernels[idx] = get_kernel(SPEC, device=torch.device("cuda", idx))
    return k


def _kernel_args(x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor) -> tuple:
    """The kernel's parameter list, in csrc/moe/act_quant.cu order (checked at load)."""
    m, h = x.shape
    return (x, x8, scales, ctypes.c_int64(x.stride(0) if m > 1 else h), ctypes.c_int32(m),
            ctypes.c_int32(h // GROUP), ctypes.c_float(ACT_QUANT_EPS))


def _launch(x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor, pdl: bool) -> None:
    """Real-launch checks (CUDA sm_90+, alignment), then the kernel; M = 0 launches nothing."""
    idx = require_hopper(OP, x.device, _fail)
    require_aligned(_fail, {"x": x, "x8": x8, "scales": scales})
    m, h = x.shape
    if m > 1 and x.stride(0) % VEC:
        raise _fail(f"x rows must be 16-byte aligned: the row stride ({x.stride(0)} elements) must be a multiple "
                    f"of {VEC} for the 16-byte loads")
    if m == 0:
        return
    groups = m * (h // GROUP)
    threads, ctas = launch_shape(groups, _num_sms(idx))
    env.print_config("act_quant_fp8", {"M": m, "H": h}, {"threads": threads, "grid": ctas})
    _kernel(idx).launch((ctas, 1, 1), (threads, 1, 1), _kernel_args(x, x8, scales), pdl=pdl)


def _reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from ..ref.fp8 import quant_act_per_token
    q, s = quant_act_per_token(x)
    return q.contiguous(), s.contiguous()


def _new_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, h = x.shape
    return (torch.empty((m, h), dtype=FP8, device=x.device),
            torch.empty((m, h // GROUP), dtype=torch.float32, device=x.device))


# ---- custom ops ----------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::act_quant_fp8", mutates_args=())
def _act_quant_fp8(x: torch.Tensor, pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    _check_x(x)
    if x.device.type == "cpu":
        return _reference(x)
    x8, scales = _new_outputs(x)
    _launch(x, x8, scales, pdl)
    return x8, scales


@_act_quant_fp8.register_fake
def _act_quant_fp8_fake(x, pdl=True):
    m, h = _check_x(x)
    return x.new_empty((m, h), dtype=FP8), x.new_empty((m, h // GROUP), dtype=torch.float32)


@torch.library.custom_op("glm5_fastpath::act_quant_fp8_out", mutates_args=("x8", "scales"))
def _act_quant_fp8_out(x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor, pdl: bool = True) -> None:
    _check_x(x)
    _check_outputs(x, x8, scales)
    _check_no_overlap(x, x8, scales)
    if x.device.type == "cpu":
        q, s = _reference(x)
        x8.copy_(q)
        scales.copy_(s)
        return
    _launch(x, x8, scales, pdl)


@_act_quant_fp8_out.register_fake
def _act_quant_fp8_out_fake(x, x8, scales, pdl=True):
    _check_x(x)
    _check_outputs(x, x8, scales)


def act_quant_fp8(x: torch.Tensor, *, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  pdl: bool = True) -> ActQuantResult:
    """Per-token 1x128 FP8 quantization of bf16 x [M, H] -> ActQuantResult(x8 [M, H] e4m3, scales [M, H/128]
    fp32 row-major), bitwise ref.fp8.quant_act_per_token (module docstring).

    out: None allocates both outputs; (x8, scales) writes into them (contiguous, e.g. CUDA-graph static
    buffers) and returns them. pdl: launch with Programmatic Dependent Launch (GPU only).
    """
    _check_x(x)  # before the dispatcher, so errors name this op even for odd arguments
    _check_pdl(pdl)
    if out is None:
        return ActQuantResult(*torch.ops.glm5_fastpath.act_quant_fp8(x, pdl))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise _fail(f"out must be None or a pair (x8, scales), got {type(out).__name__}"
                    + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    x8, scales = out
    _check_outputs(x, x8, scales)
    torch.ops.glm5_fastpath.act_quant_fp8_out(x, x8, scales, pdl)
    return ActQuantResult(x8, scales)


def precompile(device: object = None) -> None:
    """Compile (or fetch from cache) and load the kernel on `device` (default: current), ahead of first use."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    idx = _device_index(dev)
    _kernel(idx)
    _num_sms(idx)


def compile_check_specs() -> list[KernelSpec]:
    """The one variant scripts/compile_check.py builds (H, M and the row stride are kernel arguments)."""
    return [SPEC]
