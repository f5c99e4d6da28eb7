"""MLA V up-projection + o_proj act quant (mla_v_up_quant): the custom op against float64 and the reference.

CPU: the reference against a float64 bmm, the quant against ref.fp8 (bitwise), argument validation, the fake
implementations (meta tensors, FakeTensorMode, opcheck), a Python mirror of the kernel's K permutation and fragment
indexing, the token-tile builds and shared-memory sizes.
GPU (marked gpu, sm_90): every token count 1..64 that changes the build or pads a tile, GLM-5's 64 heads x 256 and
odd head counts, SGLang's w_vc layout and a strided o, poisoned outputs; y within one bf16 step of the fp32
reference (the fp32 sum order differs) and y8 / ys bitwise act_quant of the kernel's own y; out= buffers; a late
producer under PDL; CUDA-graph replay with fresh inputs.
"""
from __future__ import annotations

import pytest
import torch

from glm5_fastpath.ops import mla_v_up as M
from glm5_fastpath.ops.mla_v_up import MlaVUpInputError, mla_v_up_quant
from glm5_fastpath.ref.fp8 import quant_act_per_token
from glm5_fastpath.testing.numerics import assert_no_poison, poison_

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def make_inputs(t: int, h: int, v: int = 256, seed: int = 0, device="cpu", o_stride_pad: int = 0):
    """o [T, H, 512] (optionally a view into wider rows), w_vc [H, 512, V] in SGLang's layout (transpose of a
    contiguous [H, V, 512])."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(h, v, 512, generator=g) * 512 ** -0.5).to(BF16).to(device).transpose(1, 2)
    base = torch.randn(t, h * 512 + o_stride_pad, generator=g).to(BF16).to(device)
    o = base[:, : h * 512].view(t, h, 512) if o_stride_pad else base.view(t, h, 512)  # a view: keeps the row stride
    return o, w


def ref64(o: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.einsum("thl,hlv->thv", o.double(), w.double()).reshape(o.shape[0], -1)


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """One bf16 step at |x| (8 significant bits)."""
    return torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)


def check_y(y: torch.Tensor, r64: torch.Tensor, ctx: str) -> None:
    """y within one bf16 step of the exact product sum (rounding of an fp32 sum in any order)."""
    d = (y.double().cpu() - r64.cpu()).abs()
    bad = d > bf16_step(r64.cpu()) * 1.0001 + 1e-6
    assert not bool(bad.any()), f"{ctx}: {int(bad.sum())} of {y.numel()} elements off by more than one bf16 step"


def check_quant(y: torch.Tensor, y8: torch.Tensor, ys: torch.Tensor, ctx: str) -> None:
    q, s = quant_act_per_token(y)
    assert torch.equal(q.view(torch.uint8), y8.view(torch.uint8)), f"{ctx}: y8 is not act_quant(y)"
    assert torch.equal(s, ys), f"{ctx}: ys is not act_quant(y)'s scales"


# ---- CPU ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, h, v", [(1, 4, 256), (3, 2, 128), (17, 3, 384), (64, 1, 256)])
def test_reference_matches_float64_and_quant(t, h, v):
    o, w = make_inputs(t, h, v, seed=t * 7 + h)
    r = mla_v_up_quant(o, w)
    assert r.y.shape == (t, h * v) and r.y8.shape == (t, h * v) and r.ys.shape == (t, h * v // 128)
    assert r.y.dtype == BF16 and r.y8.dtype == FP8 and r.ys.dtype == torch.float32
    check_y(r.y, ref64(o, w), f"cpu {t=} {h=} {v=}")
    check_quant(r.y, r.y8, r.ys, f"cpu {t=} {h=} {v=}")


def test_out_variant_on_cpu_writes_every_output():
    o, w = make_inputs(5, 2, 256, seed=3)
    out = (torch.empty(5, 512, dtype=BF16), torch.empty(5, 512, dtype=FP8), torch.empty(5, 4))
    for t_ in out:
        poison_(t_)
    r = mla_v_up_quant(o, w, out=out)
    assert r.y is out[0] and r.y8 is out[1] and r.ys is out[2]
    assert_no_poison("mla_v_up_quant", *out, names=("y", "y8", "ys"))
    ref = mla_v_up_quant(o, w)
    assert torch.equal(ref.y, out[0]) and torch.equal(ref.ys, out[2])


@pytest.mark.parametrize("make, msg", [
    (lambda: (torch.randn(2, 2, 512), make_inputs(2, 2)[1]), "o must be torch.bfloat16"),
    (lambda: (make_inputs(2, 2)[0][:, :, :256], make_inputs(2, 2)[1]), "kv_lora_rank 512"),
    (lambda: (make_inputs(2, 2)[0], make_inputs(2, 3)[1]), "H = 2"),
    (lambda: (make_inputs(2, 2)[0], make_inputs(2, 2, v=192)[1]), "multiple of 128"),
    (lambda: (torch.empty(0, 2, 512, dtype=BF16), make_inputs(2, 2)[1]), "1..64"),
    (lambda: (torch.empty(65, 2, 512, dtype=BF16), make_inputs(2, 2)[1]), "1..64"),
    (lambda: (make_inputs(2, 2)[0], torch.randn(2, 512, 256).to(BF16)), "contiguous"),  # row-major [H, L, V]
    (lambda: (make_inputs(2, 2)[0].transpose(0, 1).contiguous().transpose(0, 1), make_inputs(2, 2)[1]),
     None),  # head-major o (strides (512, 1024, 1)): fine, the strides are multiples of 8
    (lambda: ("x", make_inputs(2, 2)[1]), "must be a torch.Tensor"),
    (lambda: (torch.randn(2, 1024).to(BF16), make_inputs(2, 2)[1]), "3-D"),
])
def test_bad_inputs_raise_naming_the_op(make, msg):
    o, w = make()
    if msg is None:
        mla_v_up_quant(o, w)
        return
    with pytest.raises(MlaVUpInputError, match=msg) as e:
        mla_v_up_quant(o, w)
    assert "glm5_fastpath.mla_v_up_quant" in str(e.value)


def test_bad_outputs_and_overlap_raise():
    o, w = make_inputs(2, 2)
    good = (torch.empty(2, 512, dtype=BF16), torch.empty(2, 512, dtype=FP8), torch.empty(2, 4))
    with pytest.raises(MlaVUpInputError, match="out ys must have shape"):
        mla_v_up_quant(o, w, out=(good[0], good[1], torch.empty(2, 2)))
    with pytest.raises(MlaVUpInputError, match="out y8 must be"):
        mla_v_up_quant(o, w, out=(good[0], torch.empty(2, 512, dtype=BF16), good[2]))
    with pytest.raises(MlaVUpInputError, match="triple"):
        mla_v_up_quant(o, w, out=good[:2])
    big = torch.empty(2 * 512 * 2, dtype=BF16)
    with pytest.raises(MlaVUpInputError, match="overlap"):
        torch.ops.glm5_fastpath.mla_v_up_quant_out(o, w, big[:1024].view(2, 512), good[1],
                                                   big[:16].view(torch.float32).view(2, 4), True)
    with pytest.raises(MlaVUpInputError, match="pdl must be a bool"):
        mla_v_up_quant(o, w, pdl=1)


def test_fake_implementations_meta_and_opcheck():
    o, w = make_inputs(3, 2)
    y, y8, ys = torch.ops.glm5_fastpath.mla_v_up_quant(o.to("meta"), w.to("meta"), True)
    assert (y.shape, y8.shape, ys.shape) == ((3, 512), (3, 512), (3, 4)) and y.device.type == "meta"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fo, fw = mode.from_tensor(o), mode.from_tensor(w)
        fy, _, fys = torch.ops.glm5_fastpath.mla_v_up_quant(fo, fw, True)
        assert fy.shape == (3, 512) and fys.shape == (3, 4)
    torch.library.opcheck(torch.ops.glm5_fastpath.mla_v_up_quant.default, (o, w, True))
    # torch's schema checker compares mutated fp8 tensors arithmetically (unsupported for fp8): the out variant's
    # schema is checked directly (exactly y, y8, ys are written)
    out = (torch.zeros(3, 512, dtype=BF16), torch.zeros(3, 512, dtype=torch.uint8).view(FP8), torch.zeros(3, 4))
    torch.library.opcheck(torch.ops.glm5_fastpath.mla_v_up_quant_out.default, (o, w, *out, True),
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    schema = torch.ops.glm5_fastpath.mla_v_up_quant_out.default._schema
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == ["y", "y8", "ys"]


def test_token_tiles_and_smem():
    assert [M.token_tiles(t) for t in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    with pytest.raises(MlaVUpInputError):
        M.token_tiles(65)
    # csrc/attn_core/mla_v_up.cu static_asserts the same numbers against VUpTile<kNT>::kSmemBytes
    assert M.smem_bytes(1) == 128 * 1088 + 8 * (1088 + 272) + 16
    assert M.smem_bytes(8) == 128 * 1088 + 64 * (1088 + 272) + 16
    assert M.smem_bytes(8) <= 227 * 1024


def test_python_mirror_of_the_fragment_indexing():
    """The kernel's K permutation (csrc/attn_core/mla_v_up.cuh header): emulate mma.sync m16n8k16 on the registers
    each lane loads and check the 16 x 8 result against the plain product, for one warp's m-tile."""
    g = torch.Generator().manual_seed(5)
    wt = torch.randn(16, 512, generator=g, dtype=torch.float64)  # the warp's 16 rows of W^T (V rows, L contiguous)
    x = torch.randn(8, 512, generator=g, dtype=torch.float64)   # one n-tile: 8 tokens
    acc = torch.zeros(16, 8, dtype=torch.float64)
    for j in range(512 // 32):
        for step in range(2):
            # logical A[m][k] / B[k][n] of this k-step, assembled from what each lane (gq, tq) loads
            a = torch.zeros(16, 16, dtype=torch.float64)
            b = torch.zeros(16, 8, dtype=torch.float64)
            for lane in range(32):
                gq, tq = lane >> 2, lane & 3
                e = [32 * j + 8 * tq + i for i in range(8)]  # the lane's 16-byte load: 8 consecutive K
                lo, hi = (e[0:2], e[2:4]) if step == 0 else (e[4:6], e[6:8])
                for r, base in ((gq, wt[gq]), (gq + 8, wt[gq + 8])):
                    a[r, 2 * tq: 2 * tq + 2] = base[lo]      # a0 / a1: logical k 2t, 2t+1
                    a[r, 2 * tq + 8: 2 * tq + 10] = base[hi]  # a2 / a3: logical k 2t+8, 2t+9
                b[2 * tq: 2 * tq + 2, gq] = x[gq][lo]
                b[2 * tq + 8: 2 * tq + 10, gq] = x[gq][hi]
            acc += a @ b
    assert torch.allclose(acc, wt @ x.T, rtol=1e-12, atol=1e-12)


# ---- GPU ----------------------------------------------------------------------------------------------------

def _poisoned_outputs(t: int, h: int, v: int):
    out = (torch.empty(t, h * v, dtype=BF16, device="cuda"), torch.empty(t, h * v, dtype=FP8, device="cuda"),
           torch.empty(t, h * v // 128, device="cuda"))
    for x in out:
        poison_(x)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 48, 64])
@pytest.mark.parametrize("h, v", [(64, 256), (3, 128), (5, 384)])
def test_kernel_matches_reference(t, h, v):
    o, w = make_inputs(t, h, v, seed=t * 31 + h, device="cuda")
    out = _poisoned_outputs(t, h, v)
    r = mla_v_up_quant(o, w, out=out)
    torch.cuda.synchronize()
    assert_no_poison("mla_v_up_quant", *out, names=("y", "y8", "ys"))
    ctx = f"gpu {t=} {h=} {v=}"
    check_y(r.y, ref64(o, w), ctx)
    check_quant(r.y, r.y8, r.ys, ctx)
    # against what SGLang runs (cuBLAS bf16 bmm): both within a step of the exact sum, so within two of each other
    y_bmm = torch.empty(t, h * v, dtype=BF16, device="cuda")
    torch.bmm(o.transpose(0, 1), w, out=y_bmm.view(t, h, v).transpose(0, 1))
    assert (r.y.double() - y_bmm.double()).abs().le(2 * bf16_step(y_bmm.double()) * 1.0001 + 1e-6).all(), ctx


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 40])
def test_kernel_strided_o_and_functional_form(t):
    o, w = make_inputs(t, 64, 256, seed=9 + t, device="cuda", o_stride_pad=64)  # rows wider than H * 512
    assert t == 1 or o.stride(0) == 64 * 512 + 64  # (one row: torch reports the contiguous stride)
    r = mla_v_up_quant(o, w)
    torch.cuda.synchronize()
    check_y(r.y, ref64(o, w), f"strided {t=}")
    check_quant(r.y, r.y8, r.ys, f"strided {t=}")
    r2 = mla_v_up_quant(o.contiguous(), w.transpose(1, 2).contiguous().transpose(1, 2))
    assert torch.equal(r.y, r2.y) and torch.equal(r.ys, r2.ys), "strided o gave other bits than a contiguous copy"


@pytest.mark.gpu
def test_kernel_is_deterministic_over_many_launches():
    o, w = make_inputs(12, 64, 256, seed=77, device="cuda")
    first = mla_v_up_quant(o, w)
    for _ in range(50):
        r = mla_v_up_quant(o, w)
        assert torch.equal(r.y, first.y) and torch.equal(r.y8.view(torch.uint8), first.y8.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_pdl_late_producer(t, no_pdl_override):
    from glm5_fastpath.testing.pdl import late_producer, produce

    producer = late_producer()
    o_true, w = make_inputs(t, 64, 256, seed=123 + t, device="cuda")
    o = torch.full_like(o_true, 7.0)  # stale until the producer overwrites it
    mla_v_up_quant(o, w)  # compile + load outside the checked sequence
    ref = mla_v_up_quant(o_true, w, pdl=False)
    for _ in range(3):
        o.fill_(7.0)
        out = _poisoned_outputs(t, 64, 256)
        torch.cuda.synchronize()
        produce(producer, o_true, o)
        mla_v_up_quant(o, w, out=out, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(out[0], ref.y) and torch.equal(out[2], ref.ys), "read o before the producer wrote it"


@pytest.mark.gpu
def test_cuda_graph_replay_with_fresh_inputs(no_pdl_override):
    t = 5
    o_src, w = make_inputs(t, 64, 256, seed=1, device="cuda")
    static_o = o_src.clone()
    out = _poisoned_outputs(t, 64, 256)
    mla_v_up_quant(static_o, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_v_up_quant(static_o, w, out=out, pdl=True)
    for step in range(5):
        new, _ = make_inputs(t, 64, 256, seed=100 + step, device="cuda")
        static_o.copy_(new)
        for x in out:
            poison_(x)
        graph.replay()
        torch.cuda.synchronize()
        check_y(out[0], ref64(static_o, w), f"graph replay {step}")
        check_quant(*out, f"graph replay {step}")


# ---- the W8 form (SGLang's kv_b_proj rows + block scales) -------------------------------------------------------

def make_kv_b(h: int, nope: int = 192, v: int = 256, seed: int = 0, device="cpu"):
    """A kv_b_proj-like FP8 weight [H * (nope + v), 512] and fp32 128x128 block scales (rows not a multiple of 128
    per head: GLM-5's 448)."""
    g = torch.Generator().manual_seed(seed)
    rows = h * (nope + v)
    w8 = (torch.randn(rows, 512, generator=g) * 3).clamp(-448, 448).to(FP8)
    sc = torch.rand(-(-rows // 128), 4, generator=g) * 0.02 + 0.002
    return w8.to(device), sc.to(device)


def test_dequant_w_vc_is_sglangs_formula():
    """Element by element: w_vc[h, l, v] = bf16(f32(w8[h * (N + V) + N + v, l]) * scale[row // 128, l // 128])."""
    h, nope, v = 3, 192, 256
    w8, sc = make_kv_b(h, nope, v, seed=1)
    w = M.dequant_w_vc(w8, sc, h, nope)
    assert w.shape == (h, 512, v) and w.dtype == BF16 and w.stride(1) == 1  # SGLang's layout
    for hh, l, vv in [(0, 0, 0), (1, 511, 255), (2, 130, 64), (1, 300, 200)]:
        r = hh * (nope + v) + nope + vv
        want = (w8[r, l].float() * sc[r // 128, l // 128]).to(BF16)
        assert w[hh, l, vv] == want, (hh, l, vv)


@pytest.mark.parametrize("t, h, nope, v", [(1, 4, 192, 256), (5, 2, 128, 128), (33, 3, 64, 384)])
def test_w8_form_on_cpu_equals_the_bf16_form_on_sglangs_w_vc(t, h, nope, v):
    w8, sc = make_kv_b(h, nope, v, seed=t)
    o, _ = make_inputs(t, h, v, seed=t + 1)
    r = M.mla_v_up_quant_w8(o, w8, sc, nope)
    ref = mla_v_up_quant(o, M.dequant_w_vc(w8, sc, h, nope))
    assert torch.equal(r.y, ref.y) and torch.equal(r.y8.view(torch.uint8), ref.y8.view(torch.uint8))
    assert torch.equal(r.ys, ref.ys)


@pytest.mark.parametrize("mutate, msg", [
    (lambda o, w, s: (o, w.to(BF16), s), "float8_e4m3fn"),
    (lambda o, w, s: (o, w[:-1], s), "not \\[H \\* head_rows"),
    (lambda o, w, s: (o, w, s[:-1]), "block scales"),
    (lambda o, w, s: (o, w, s.double()), "block scales"),
    (lambda o, w, s: (o.float(), w, s), "bf16"),
    (lambda o, w, s: (torch.empty(0, 4, 512, dtype=BF16), w, s), "1..64"),
])
def test_w8_bad_inputs_raise(mutate, msg):
    w8, sc = make_kv_b(4)
    o, _ = make_inputs(2, 4)
    with pytest.raises(MlaVUpInputError, match=msg):
        M.mla_v_up_quant_w8(*mutate(o, w8, sc), 192)
    with pytest.raises(MlaVUpInputError, match="multiple of 128"):
        M.mla_v_up_quant_w8(o, w8, sc, 100)  # v = 448 - 100 = 348


def test_w8_fake_and_smem():
    w8, sc = make_kv_b(2)
    o, _ = make_inputs(3, 2)
    y, y8, ys = torch.ops.glm5_fastpath.mla_v_up_quant_w8(o.to("meta"), w8.to("meta"), sc.to("meta"), 192, True)
    assert (y.shape, y8.shape, ys.shape) == ((3, 512), (3, 512), (3, 4))
    torch.library.opcheck(torch.ops.glm5_fastpath.mla_v_up_quant_w8.default, (o, w8, sc, 192, True),
                          test_utils=("test_faketensor", "test_autograd_registration"))
    # csrc/attn_core/mla_v_up.cu static_asserts the same numbers against VUpTile<kNT, true>::kSmemBytes
    assert M.smem_bytes(1, w8=True) == 128 * 544 + 8 * (1088 + 272) + 16
    assert M.smem_bytes(8, w8=True) == 128 * 544 + 64 * (1088 + 272) + 16


def test_w8_scale_rows_of_a_16_row_tile():
    """The kernel reads a scale per row (rows g and g + 8 of a warp's tile, csrc mla_v_up.cuh load_weights): with
    GLM-5's 448-row heads a CTA's 128 rows straddle a 128-row scale block, and per-row indexing covers it."""
    hr, nope = 448, 192
    blocks = set()
    for h in range(64):
        for vb in range(2):
            r0 = h * hr + nope + vb * 128
            blocks.add(len({(r0 + i) // 128 for i in range(128)}))
    assert blocks == {1, 2}  # both cases occur, so a per-CTA scale would be wrong


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 7, 8, 9, 16, 31, 33, 64])
def test_w8_kernel_is_bitwise_the_bf16_kernel_on_sglangs_w_vc(t):
    w8, sc = make_kv_b(64, seed=40 + t, device="cuda")
    o, _ = make_inputs(t, 64, 256, seed=t, device="cuda")
    w_vc = M.dequant_w_vc(w8, sc, 64, 192)
    ref = mla_v_up_quant(o, w_vc)
    r = M.mla_v_up_quant_w8(o, w8, sc, 192)
    torch.cuda.synchronize()
    assert torch.equal(r.y, ref.y), f"W8 y differs from the bf16 kernel on SGLang's w_vc at {t=}"
    assert torch.equal(r.y8.view(torch.uint8), ref.y8.view(torch.uint8)) and torch.equal(r.ys, ref.ys)
    check_y(r.y, ref64(o, w_vc), f"w8 {t=}")


@pytest.mark.gpu
def test_w8_pdl_late_producer(no_pdl_override):
    from glm5_fastpath.testing.pdl import late_producer, produce

    producer = late_producer()
    w8, sc = make_kv_b(64, seed=3, device="cuda")
    o_true, _ = make_inputs(4, 64, 256, seed=5, device="cuda")
    o = torch.full_like(o_true, 7.0)
    ref = M.mla_v_up_quant_w8(o_true, w8, sc, 192, pdl=False)
    for _ in range(3):
        o.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, o_true, o)
        r = M.mla_v_up_quant_w8(o, w8, sc, 192, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(r.y, ref.y), "W8 build read o before the producer wrote it"
