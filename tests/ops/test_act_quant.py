"""Per-token 1x128 FP8 activation quant (act_quant_fp8): the custom op against glm5_fastpath.ref.fp8.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings. CPU tests: the CPU fallback (the
reference itself, through both ops), argument validation, the fake implementations (meta tensors,
FakeTensorMode, torch.compile, opcheck), the launch-shape rule and a Python mirror of the kernel's
indexing, and a compile of the kernel spec (needs nvcc, not a GPU).

What is compared, and why the bar is bitwise: the kernel and glm5_fastpath.ref.fp8.quant_act_per_token
compute the same fp32 operations with the same roundings (amax exact; s = max(amax, eps) / 448 as one
correctly rounded IEEE fp32 divide, which the reference gets from a float64 divide rounded once; x / s
as an IEEE fp32 divide; e4m3 round-to-nearest-even with saturation at 448), so x8 and the scales must
equal the reference's bytes exactly. The one documented exception is a NaN's sign: NaN inputs and
inf / inf give NaN in both, compared as "NaN in the same places".
"""
from __future__ import annotations

import importlib

import pytest
import torch

from glm5_fastpath import ops
from glm5_fastpath.config import ACT_QUANT_EPS
from glm5_fastpath.ops import ActQuantResult, act_quant_fp8
from glm5_fastpath.ops import act_quant as AQ
from glm5_fastpath.ref.fp8 import FP8, quant_act_per_token
from glm5_fastpath.testing.numerics import assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "act_quant_fp8"
BF16 = torch.bfloat16
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256, 1000]
H_VALUES = [128, 6144, 7168]
BF16_MAX = 3.3895313892515355e38


# ---- inputs ----------------------------------------------------------------------------------------------

def _saturating_bf16() -> torch.Tensor:
    """Positive bf16 values v whose own quant overshoots: v / fp32(v / 448) > 448 in fp32, so the e4m3
    conversion must saturate (the reference's clamp, the kernel's satfinite) to give 448."""
    b = torch.arange(0x0080, 0x7F80, dtype=torch.int32).to(torch.int16).view(BF16)  # positive normals
    f = b.float()
    s = (f.clamp_min(ACT_QUANT_EPS).double() / 448.0).float()
    return b[f / s > 448.0]


def make_x(m: int, h: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """Random rows with outlier channels, plus special rows: all zeros, -0.0, tiny values (amax < eps,
    bf16 subnormals), huge values near the bf16 maximum, saturating group maxima."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g) * (1 + 7 * torch.rand(1, h, generator=g) ** 8)
    x[:, ::97] *= 64.0
    if m >= 2:
        x[1].zero_()
    if m >= 3:
        x[2] = -0.0
    if m >= 4:
        x[3] = torch.randn(h, generator=g) * 1e-11  # every group below eps
        x[3, ::3] = torch.randn(h // 3 + (h % 3 > 0), generator=g) * 1e-39  # bf16 subnormals
    if m >= 5:
        x[4] = torch.randn(h, generator=g).sign() * BF16_MAX * torch.rand(h, generator=g)  # huge
    sat = _saturating_bf16().float()
    if m >= 6:
        row = torch.randn(h, generator=g)
        idx = torch.randint(0, sat.numel(), (h // 128,), generator=g)
        grp = row.view(-1, 128)
        grp.mul_(sat[idx, None] / grp.abs().amax(-1, keepdim=True) * 0.99)
        grp[:, 5] = sat[idx] * torch.where(torch.rand(h // 128, generator=g) < 0.5, -1.0, 1.0)  # the group max
        x[5] = row
    if m >= 7:
        x[6] = torch.randn(h, generator=g) * 1e-10  # around eps
    return x.to(BF16).to(device)


def _strided(x: torch.Tensor, pad: int, col0: int = 0) -> torch.Tensor:
    """The same values as a view with row stride H + pad, starting col0 columns into the buffer."""
    m, h = x.shape
    buf = torch.full((m, h + pad), float("nan"), dtype=x.dtype, device=x.device)
    v = buf[:, col0:col0 + h]
    v.copy_(x)
    return v


def poisoned_outputs(m: int, h: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    return (poison_(torch.empty(m, h, dtype=FP8, device=device)),
            poison_(torch.empty(m, h // 128, dtype=torch.float32, device=device)))


def check_bitwise(x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor, ctx: str) -> None:
    m, h = x.shape
    assert x8.dtype == FP8 and tuple(x8.shape) == (m, h) and x8.is_contiguous(), (x8.dtype, x8.shape, x8.stride())
    assert scales.dtype == torch.float32 and tuple(scales.shape) == (m, h // 128) and scales.is_contiguous()
    assert_no_poison(OP, x8, scales, names=["x8", "scales"])
    q_ref, s_ref = quant_act_per_token(x.cpu())
    assert_equal(OP, scales, s_ref, context=ctx + " scales")
    assert_equal(OP, x8, q_ref, context=ctx + " x8")


def _nan_aware_equal(got: torch.Tensor, want: torch.Tensor, ctx: str) -> None:
    """Equal bytes, except that NaN must meet NaN (its sign may differ)."""
    g, w = got.detach().cpu(), want.detach().cpu()
    gn, wn = torch.isnan(g.float()), torch.isnan(w.float())
    assert torch.equal(gn, wn), f"{OP} [{ctx}]: NaN at {gn.nonzero()[:4].tolist()} vs reference {wn.nonzero()[:4].tolist()}"
    if g.element_size() == 1:
        g, w = g.view(torch.uint8), w.view(torch.uint8)
    else:
        g, w = g.view(torch.int32), w.view(torch.int32)
    bad = (g != w) & ~gn
    assert not bad.any(), f"{OP} [{ctx}]: {int(bad.sum())} elements differ, first at {bad.nonzero()[:4].tolist()}"


# ---- CPU: the fallback is the reference ------------------------------------------------------------------

@pytest.mark.parametrize("m, h", [(1, 128), (3, 512), (8, 6144), (7, 7168), (0, 256)])
def test_cpu_fallback_is_the_reference(m, h, seed):
    x = make_x(m, h, seed, device="cpu")
    res = act_quant_fp8(x)
    assert isinstance(res, ActQuantResult) and res.x8.device.type == "cpu"
    check_bitwise(x, res.x8, res.scales, f"cpu functional {m=} {h=}")
    out = poisoned_outputs(m, h, device="cpu")
    res2 = act_quant_fp8(x, out=out)
    assert res2.x8 is out[0] and res2.scales is out[1]
    check_bitwise(x, *out, f"cpu out {m=} {h=}")
    q, s = torch.ops.glm5_fastpath.act_quant_fp8(x, False)
    assert_equal(OP, q, res.x8, context="torch.ops on CPU")
    assert_equal(OP, s, res.scales, context="torch.ops on CPU")


def test_cpu_fallback_strided_rows(seed):
    x = make_x(9, 512, seed, device="cpu")
    for pad, col0 in ((64, 0), (3, 3), (256, 128)):
        v = _strided(x, pad, col0)
        assert v.stride() == (512 + pad, 1)
        res = act_quant_fp8(v)
        check_bitwise(x, res.x8, res.scales, f"cpu strided {pad=} {col0=}")


def test_cpu_fallback_nan_and_inf():
    x = torch.randn(4, 384).to(BF16)
    x[0, 5] = float("nan")
    x[1, 130] = float("inf")
    x[2, 300] = float("-inf")
    res = act_quant_fp8(x)
    q, s = quant_act_per_token(x)
    _nan_aware_equal(res.x8, q, "cpu nan/inf x8")
    _nan_aware_equal(res.scales, s, "cpu nan/inf scales")
    assert torch.isnan(res.scales[0, 0]) and torch.isnan(res.x8[0, :128].float()).all()
    assert torch.isinf(res.scales[1, 1]) and torch.isnan(res.x8[1, 130].float())


def test_saturating_values_exist():
    sat = _saturating_bf16()
    assert sat.numel() > 1000  # plenty of group maxima whose own quotient overshoots 448
    q, s = quant_act_per_token(sat.view(-1, 1).expand(-1, 128).contiguous())
    assert bool((q.float().abs() == 448.0).all())


# ---- CPU: validation -------------------------------------------------------------------------------------

def _x(m=4, h=512, **kw):
    return torch.zeros(m, h, dtype=BF16, **kw)


@pytest.mark.parametrize("x, match", [
    (_x().float(), "x must be torch.bfloat16"),
    (_x()[None], "x must be 2-D"),
    (_x(h=512)[:, :200], "multiple of 128"),
    (torch.zeros(4, 0, dtype=BF16), "positive multiple of 128"),
    (_x(m=512, h=4).t(), "contiguous last dim"),
    (_x(h=1024)[:, ::2], "contiguous last dim"),
    ([[0.0] * 128], "x must be a torch.Tensor"),
])
def test_bad_inputs_raise_naming_the_op(x, match):
    with pytest.raises(AQ.ActQuantInputError, match=match) as ei:
        act_quant_fp8(x)
    assert isinstance(ei.value, ValueError) and "glm5_fastpath.act_quant_fp8" in str(ei.value)


def test_bad_inputs_through_torch_ops():
    with pytest.raises(ValueError, match="act_quant_fp8: x must be torch.bfloat16"):
        torch.ops.glm5_fastpath.act_quant_fp8(_x().float(), True)
    with pytest.raises(ValueError, match="act_quant_fp8: .*multiple of 128"):
        torch.ops.glm5_fastpath.act_quant_fp8(torch.empty(3, 100, dtype=BF16, device="meta"), True)


@pytest.mark.parametrize("out, match", [
    ((torch.empty(4, 512, dtype=torch.uint8), torch.empty(4, 4)), "out x8 must be torch.float8_e4m3fn"),
    ((torch.empty(4, 512, dtype=FP8), torch.empty(4, 4, dtype=torch.float64)), "out scales must be torch.float32"),
    ((torch.empty(4, 256, dtype=FP8), torch.empty(4, 4)), r"out x8 must have shape \(4, 512\)"),
    ((torch.empty(4, 512, dtype=FP8), torch.empty(4, 2)), r"out scales must have shape \(4, 4\)"),
    ((torch.empty(4, 512, dtype=FP8), torch.empty(4, 4).t().contiguous().t()), "out scales must be contiguous"),
    ((torch.empty(4, 1024, dtype=FP8)[:, :512], torch.empty(4, 4)), "out x8 must be contiguous"),
    ((torch.empty(4, 512, dtype=FP8),), "out must be None or a pair"),
    (torch.empty(4, 512, dtype=FP8), "out must be None or a pair"),
    ((torch.empty(4, 512, dtype=FP8, device="meta"), torch.empty(4, 4)), "one device"),
])
def test_bad_outputs_raise_naming_the_op(out, match):
    with pytest.raises(AQ.ActQuantInputError, match=match) as ei:
        act_quant_fp8(_x(), out=out)
    assert "glm5_fastpath.act_quant_fp8" in str(ei.value)


def test_overlapping_outputs_refused():
    x = _x()
    buf = torch.empty(4 * 512 + 32, dtype=torch.uint8)
    x8 = buf[: 4 * 512].view(FP8).view(4, 512)
    s_alias = buf[4 * 512 - 32:].view(torch.float32).view(4, 4)  # shares 32 bytes with x8
    with pytest.raises(AQ.ActQuantInputError, match="outputs x8 and scales overlap"):
        act_quant_fp8(x, out=(x8, s_alias))
    xb = torch.zeros(4 * 512 + 512, dtype=BF16)
    xv = xb[: 4 * 512].view(4, 512)
    with pytest.raises(AQ.ActQuantInputError, match="output x8 overlaps input x"):
        act_quant_fp8(xv, out=(xb.view(torch.uint8)[:2048].view(FP8).view(4, 512), torch.empty(4, 4)))


@pytest.mark.parametrize("pdl", [1, None, "yes"])
def test_pdl_must_be_bool(pdl):
    with pytest.raises(AQ.ActQuantInputError, match="pdl must be a bool"):
        act_quant_fp8(_x(), pdl=pdl)


def test_launch_refuses_non_cuda_tensors():
    # the ops route CPU tensors to the reference and meta / fake ones to the fake; the launcher itself
    # refuses anything that is not CUDA with the op's error
    with pytest.raises(ValueError, match="act_quant_fp8: tensors must be on a CUDA device"):
        AQ._launch(_x(), *poisoned_outputs(4, 512, device="cpu"), True)


def test_group_limit():
    x = torch.empty(2**31 // 48 + 1, 6144, dtype=BF16, device="meta")
    with pytest.raises(AQ.ActQuantInputError, match="2\\^31-1 groups"):
        torch.ops.glm5_fastpath.act_quant_fp8(x, True)


# ---- CPU: fake implementation ------------------------------------------------------------------------------

@pytest.mark.parametrize("m, h", [(0, 128), (5, 6144), (300, 7168)])
def test_fake_shapes_meta(m, h):
    x = torch.empty(m, h, dtype=BF16, device="meta")
    q, s = torch.ops.glm5_fastpath.act_quant_fp8(x, True)
    assert (tuple(q.shape), q.dtype, q.device.type) == ((m, h), FP8, "meta")
    assert (tuple(s.shape), s.dtype) == ((m, h // 128), torch.float32) and s.is_contiguous() and q.is_contiguous()
    # strided input: outputs are still contiguous
    xs = torch.empty(m, h + 64, dtype=BF16, device="meta")[:, :h]
    q2, s2 = torch.ops.glm5_fastpath.act_quant_fp8(xs, True)
    assert q2.is_contiguous() and s2.is_contiguous()
    torch.ops.glm5_fastpath.act_quant_fp8_out(x, torch.empty_like(q), torch.empty_like(s), True)


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(7, 6144, dtype=BF16)
        res = act_quant_fp8(x)
        assert tuple(res.x8.shape) == (7, 6144) and res.x8.dtype == FP8
        assert tuple(res.scales.shape) == (7, 48) and res.scales.stride() == (48, 1)
        out = (torch.empty(7, 6144, dtype=FP8), torch.empty(7, 48))
        assert act_quant_fp8(x, out=out).x8 is out[0]
        with pytest.raises(AQ.ActQuantInputError, match="out scales must have shape"):
            act_quant_fp8(x, out=(out[0], torch.empty(7, 47)))


def test_fake_under_torch_compile_meta():
    def f(x, q, s):
        a = act_quant_fp8(x)
        act_quant_fp8(x, out=(q, s))
        return a.x8, a.scales
    x = torch.empty(3, 512, dtype=BF16, device="meta")
    q, s = torch.empty(3, 512, dtype=FP8, device="meta"), torch.empty(3, 4, device="meta")
    outs = torch.compile(f, backend="aot_eager", fullgraph=True)(x, q, s)
    assert [tuple(o.shape) for o in outs] == [(3, 512), (3, 4)]


def test_opcheck_cpu():
    x = make_x(6, 384, 1, device="cpu")
    torch.library.opcheck(torch.ops.glm5_fastpath.act_quant_fp8.default, (x, True))
    torch.library.opcheck(torch.ops.glm5_fastpath.act_quant_fp8.default, (_strided(x, 128), True))
    # torch's schema checker compares mutated fp8 tensors arithmetically (unsupported for fp8), so the out
    # variant's schema is checked directly: exactly x8 and scales are written.
    out = (torch.zeros(6, 384, dtype=torch.uint8).view(FP8), torch.zeros(6, 3))
    torch.library.opcheck(torch.ops.glm5_fastpath.act_quant_fp8_out.default, (x, *out, True),
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    schema = torch.ops.glm5_fastpath.act_quant_fp8_out.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["x8", "scales"], written


def test_outputs_have_the_megamoe_layout():
    """mega_moe takes x_fp8 [M, H] e4m3 and x_scale [M, H/128] fp32, both contiguous (row layout)."""
    x = torch.empty(5, 6144, dtype=BF16, device="meta")
    q, s = torch.ops.glm5_fastpath.act_quant_fp8(x, True)
    assert q.dtype == torch.float8_e4m3fn and q.is_contiguous() and tuple(q.shape) == (5, 6144)
    assert s.dtype == torch.float32 and s.stride() == (48, 1) and tuple(s.shape) == (5, 48)


# ---- CPU: launch shape, kernel indexing, compile -------------------------------------------------------------

def test_launch_shape():
    assert AQ.launch_shape(48, 132) == (32, 24)  # M=1, H=6144
    assert AQ.launch_shape(16 * 48, 132) == (64, 192)
    assert AQ.launch_shape(64 * 48, 132) == (256, 192)
    assert AQ.launch_shape(256 * 56, 132) == (256, 896)  # M=256, H=7168
    assert AQ.launch_shape(1, 132) == (32, 1)
    assert AQ.launch_shape(0, 132) == (32, 0)
    for groups in range(1, 3000, 37):
        t, ctas = AQ.launch_shape(groups, 132)
        assert t in AQ.CTA_THREADS and ctas * (t // 16) >= groups > (ctas - 1) * (t // 16)


@pytest.mark.parametrize("m, h", [(1, 128), (3, 128), (5, 384), (16, 6144), (7, 7168)])
def test_kernel_indexing_mirror_covers_every_group_once(m, h):
    """Mirror of glm5_act_quant_fp8's indexing: half-warp (block b, thread t // 16) owns flat group
    gi = b * T/16 + t // 16 = row * G + g; every group of every row exactly once; warps that leave early
    (both halves past the end) own no group; a warp that stays always pairs groups (2k, 2k+1)."""
    G = h // 128
    total = m * G
    for t_cta in AQ.CTA_THREADS:
        ctas = -(-total // (t_cta // 16))
        seen = torch.zeros(m, G, dtype=torch.int32)
        for b in range(ctas):
            for warp in range(t_cta // 32):
                gis = [b * (t_cta // 16) + 2 * warp + half for half in (0, 1)]
                assert gis[0] % 2 == 0
                if gis[0] >= total:  # (gi & ~1) >= total: the whole warp returns
                    continue
                for gi in gis:
                    if gi < total:
                        seen[gi // G, gi % G] += 1
        assert bool((seen == 1).all()), (t_cta, seen)


def test_spec_is_in_the_compile_check():
    specs = ops.compile_check_specs()
    assert AQ.SPEC in specs
    assert AQ.compile_check_specs() == [AQ.SPEC] and AQ.SPEC.source == "moe/act_quant.cu"
    assert AQ.SPEC.functions == (AQ.FUNCTION,) and AQ.SPEC.defines == ()


def test_compile_spec_without_spills_or_warnings(nvcc_jit):
    ck = nvcc_jit(AQ.SPEC)
    res = ck.resources()[AQ.FUNCTION]
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert res.smem_bytes == 0 and 0 < res.registers <= 32, res  # full occupancy (2048 threads x 32 regs)
    assert "warning" not in ck.log.lower(), ck.log


# ---- GPU -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_bitwise(m, h, seed, no_pdl_override):
    x = make_x(m, h, seed + 7 * m + h)
    out = poisoned_outputs(m, h)
    res = act_quant_fp8(x, out=out)
    func = act_quant_fp8(x)
    torch.cuda.synchronize()
    assert res.x8 is out[0] and res.scales is out[1]
    check_bitwise(x, *out, f"out= {m=} {h=} {seed=}")
    check_bitwise(x, func.x8, func.scales, f"functional {m=} {h=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
@pytest.mark.parametrize("m", [1, 3, 31, 256, 1000])
def test_strided_rows(m, h, seed):
    x = make_x(m, h, seed + m)
    for pad, col0 in ((8, 0), (64, 64), (128, 8), (h, h)):
        v = _strided(x, pad, col0)
        assert v.stride() == (h + pad, 1)
        out = poisoned_outputs(m, h)
        act_quant_fp8(v, out=out)
        torch.cuda.synchronize()
        check_bitwise(x, *out, f"strided {m=} {h=} {pad=} {col0=}")


@pytest.mark.gpu
def test_single_row_any_stride():
    """With M = 1 the row stride is never used: a stride that is not a multiple of 8 is fine."""
    buf = torch.randn(2, 6147, device="cuda").to(BF16)
    x = buf[:1, :6144]
    assert x.stride(0) == 6147
    out = poisoned_outputs(1, 6144)
    act_quant_fp8(x, out=out)
    torch.cuda.synchronize()
    check_bitwise(x, *out, "M=1 odd stride")


@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
def test_zeros_and_huge_values(h):
    m = 6
    x = torch.zeros(m, h, device="cuda", dtype=BF16)
    x[1] = -0.0
    x[2] = BF16_MAX
    x[3] = -BF16_MAX
    x[3, ::2] = BF16_MAX
    x[4] = (torch.linspace(-1.0, 1.0, h, device="cuda") * BF16_MAX).to(BF16)
    sat = _saturating_bf16().to("cuda")
    x[5] = sat[torch.randint(0, sat.numel(), (h,), device="cuda")]
    out = poisoned_outputs(m, h)
    act_quant_fp8(x, out=out)
    torch.cuda.synchronize()
    check_bitwise(x, *out, f"zeros / huge / saturating {h=}")
    s, q = out[1].cpu(), out[0].cpu()
    eps_scale = (torch.tensor(ACT_QUANT_EPS, dtype=torch.float32).double() / 448.0).float()
    assert bool((s[0] == eps_scale).all()) and bool((s[1] == eps_scale).all())
    assert bool((q[0].view(torch.uint8) == 0).all()) and bool((q[1].view(torch.uint8) == 0x80).all())
    assert bool((q[2].float() == 448.0).all()) and bool((q[3].float().abs() == 448.0).all())


@pytest.mark.gpu
def test_nan_and_inf_propagate_like_the_reference():
    x = torch.randn(5, 512, device="cuda").to(BF16)
    x[0, 5] = float("nan")
    x[1, 130] = float("inf")
    x[2, 300] = float("-inf")
    x[3, 511] = float("nan")
    x[3, 0] = float("inf")
    out = poisoned_outputs(5, 512)
    act_quant_fp8(x, out=out)
    torch.cuda.synchronize()
    q, s = quant_act_per_token(x.cpu())
    _nan_aware_equal(out[0], q, "nan/inf x8")
    _nan_aware_equal(out[1], s, "nan/inf scales")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 31, 256])
def test_pdl_off_and_torch_ops_agree(m, seed):
    x = make_x(m, 6144, seed)
    a = act_quant_fp8(x, pdl=True)
    b = act_quant_fp8(x, pdl=False)
    c = torch.ops.glm5_fastpath.act_quant_fp8(x, True)
    torch.cuda.synchronize()
    for other in (b, c):
        assert_equal(OP, other[0], a.x8, context="pdl on/off, torch.ops: x8")
        assert_equal(OP, other[1], a.scales, context="pdl on/off, torch.ops: scales")


@pytest.mark.gpu
def test_empty_batch():
    x = torch.empty(0, 6144, dtype=BF16, device="cuda")
    res = act_quant_fp8(x)
    assert tuple(res.x8.shape) == (0, 6144) and tuple(res.scales.shape) == (0, 48)
    act_quant_fp8(x, out=(torch.empty(0, 6144, dtype=FP8, device="cuda"), torch.empty(0, 48, device="cuda")))


@pytest.mark.gpu
def test_gpu_error_cases(monkeypatch):
    x = make_x(4, 512, 0)
    buf = torch.empty(4 * 512 + 8, dtype=BF16, device="cuda")
    with pytest.raises(AQ.ActQuantInputError, match="x data must be 16-byte aligned"):
        act_quant_fp8(buf[1:4 * 512 + 1].view(4, 512))
    wide = torch.zeros(4, 516, dtype=BF16, device="cuda")
    with pytest.raises(AQ.ActQuantInputError, match="row stride \\(516 elements\\) must be a multiple of 8"):
        act_quant_fp8(wide[:, :512])
    with pytest.raises(AQ.ActQuantInputError, match="one device"):
        act_quant_fp8(x, out=poisoned_outputs(4, 512, device="cpu"))
    xb = torch.zeros(4 * 512 * 2, dtype=torch.uint8, device="cuda")
    with pytest.raises(AQ.ActQuantInputError, match="output x8 overlaps input x"):
        act_quant_fp8(xb.view(BF16).view(4, 512), out=(xb[:2048].view(FP8).view(4, 512),
                                                       torch.empty(4, 4, device="cuda")))
    # a pre-Hopper GPU is refused before any compile or launch
    monkeypatch.setattr(importlib.import_module("glm5_fastpath.ops._device"), "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(RuntimeError, match="act_quant_fp8: needs a Hopper"):
        act_quant_fp8(x)


@pytest.mark.gpu
@pytest.mark.parametrize("m, h", [(1, 6144), (16, 6144), (64, 7168), (256, 7168), (1000, 128)])
def test_waits_for_the_previous_kernel_under_pdl(m, h, seed, no_pdl_override):
    producer = late_producer()
    x_true = make_x(m, h, seed)
    x = torch.full_like(x_true, 7.0)  # stale until the producer overwrites it
    act_quant_fp8(x)  # compile + load outside the checked sequence
    for _ in range(3):
        x.fill_(7.0)
        out = poisoned_outputs(m, h)
        torch.cuda.synchronize()
        produce(producer, x_true, x)
        act_quant_fp8(x, out=out, pdl=True)
        torch.cuda.synchronize()
        check_bitwise(x_true, *out, f"PDL after a late producer {m=} {h=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m, h", [(16, 6144), (3, 128)])
def test_cuda_graph_capture_and_replay(m, h, seed, no_pdl_override):
    producer = late_producer()
    src = make_x(m, h, seed)
    static_x = torch.empty_like(src)
    out = poisoned_outputs(m, h)
    act_quant_fp8(src)  # warm up (compile/load) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, src, static_x)  # producer -> act_quant with a PDL edge
        act_quant_fp8(static_x, out=out, pdl=True)
        func = act_quant_fp8(static_x)
    for step in range(3):
        new = make_x(m, h, seed + 100 + step)
        src.copy_(new)
        static_x.fill_(7.0)
        for t in (*out, *func):
            poison_(t)
        g.replay()
        torch.cuda.synchronize()
        check_bitwise(new, *out, f"graph replay {step} {m=} {h=}")
        check_bitwise(new, func.x8, func.scales, f"graph replay functional {step}")


@pytest.mark.gpu
def test_torch_compile_fullgraph(seed):
    x = make_x(8, 6144, seed)

    def f(t):
        r = act_quant_fp8(t)
        return r.x8, r.scales * 2.0  # elementwise: exact in both modes

    want = f(x)
    got = torch.compile(f, fullgraph=True)(x)
    torch.cuda.synchronize()
    assert_equal(OP, got[0], want[0], context="torch.compile x8")
    assert_equal(OP, got[1], want[1], context="torch.compile scales")


@pytest.mark.gpu
def test_opcheck_gpu(seed):
    x = make_x(4, 512, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.act_quant_fp8.default, (x, True),
                          test_utils=("test_schema", "test_faketensor"))
    out = (torch.zeros(4, 512, dtype=torch.uint8, device="cuda").view(FP8), torch.zeros(4, 4, device="cuda"))
    torch.library.opcheck(torch.ops.glm5_fastpath.act_quant_fp8_out.default, (x, *out, True),
                          test_utils=("test_faketensor",))


@pytest.mark.gpu
def test_kernel_resources_report():
    """The loaded cubin has no local memory (spills) and the param layout check is active."""
    from glm5_fastpath.jit import get_kernel
    k = get_kernel(AQ.SPEC)
    assert k.local_bytes == 0, k
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 8, 4, 4, 4), k.param_sizes
    assert 0 < k.num_regs <= 32 and k.max_threads >= max(AQ.CTA_THREADS), k
