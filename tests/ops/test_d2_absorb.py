"""D2 W_UK absorption + k_pe RoPE + MLA KV store: the custom op against the reference.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings; the CPU tests check argument
validation, the fake implementation, the RoPE table, and (without a GPU) the kernel's fragment
layout: a Python emulation of its shared-memory swizzle, ldmatrix.trans row addresses, K
permutation, mma.sync fragments and epilogue reproduces q_nope . w_kc exactly.

What is compared, and why each bar is where it is:
- q_lat vs ref.prefix.d2_absorb_and_kv_store (fp32 accumulation, bf16 out): kind "bf16", and
  tighter: every element within one bf16 ulp of the reference (both round an fp32 sum of the same
  products, in different orders, so they differ only where the sum sits at a rounding boundary),
  except elements whose magnitude is below 1e-3 of the output's rms (cancellation: the fp32 order
  error can exceed one ulp of a near-zero result); and at most 2 % of the elements differ at all.
- The KV cache: target rows must equal the reference bit for bit (c_kv is copied; k_pe is roped
  with the same fp32 cos/sin and the same unfused fp32 products and sums); every other row must be
  untouched (compared bytewise against its value before the call); target rows start poisoned.
"""
from __future__ import annotations

import types

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops.d2_absorb import (D2Config, config_for, d2_absorb_and_kv_store, inv_freq_table)
from glm5_fastpath.ref.prefix import d2_absorb_and_kv_store as ref_d2
from glm5_fastpath.ref.rope import rope_cos_sin
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "d2_absorb_and_kv_store"
BF16 = torch.bfloat16
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]


# ---- helpers ------------------------------------------------------------------------------------------

def make_inputs(cfg: Glm5Config, m: int, seed: int, device: str = "cuda", num_slots: int | None = None,
                idx_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    q_nope = (torch.randn(m, h, nope, generator=g) * 2.0).to(BF16)
    q_nope[:, :, ::37] *= 8.0  # a few large channels
    c_kv = torch.randn(m, kvl, generator=g).to(BF16)
    k_pe = (torch.randn(m, r, generator=g) * 3.0).to(BF16)
    num_slots = num_slots or max(4 * m, 64)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,), generator=g)
    if m >= 2:
        positions[0] = 0  # angle 0: cos 1, sin 0
        positions[1] = cfg.max_position_embeddings - 1
    out_cache_loc = torch.randperm(num_slots, generator=g)[:m]
    kv_cache = torch.randn(num_slots, kvl + r, generator=g).to(BF16)
    ts = [q_nope, c_kv, k_pe, positions.to(idx_dtype), out_cache_loc.to(idx_dtype), kv_cache]
    return [t.to(device) for t in ts]


def poison_rows_(kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    kv_cache[slots.long()] = float("nan")


def _ordered_bf16(t: torch.Tensor) -> torch.Tensor:
    b = t.detach().cpu().contiguous().view(torch.int16).to(torch.int32)
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def assert_within_one_ulp(out: torch.Tensor, ref: torch.Tensor, ctx: str, max_frac: float = 0.02) -> None:
    o, r = out.detach().cpu(), ref.detach().cpu()
    ulps = (_ordered_bf16(o) - _ordered_bf16(r)).abs()
    rms = r.double().pow(2).mean().sqrt().item()
    tiny = r.double().abs() < 1e-3 * rms
    bad = (ulps > 1) & ~tiny
    assert not bad.any(), (f"{OP} [{ctx}]: {int(bad.sum())} elements differ from the reference by more than one bf16 "
                           f"ulp, first at {bad.nonzero()[:4].tolist()} (max {int(ulps[~tiny].max())} ulp)")
    frac = (ulps > 0).double().mean().item()
    assert frac <= max_frac, f"{OP} [{ctx}]: {frac:.4f} of the elements differ from the reference (> {max_frac})"


def check_call(cfg, w_kc, q_nope, c_kv, k_pe, positions, out_cache_loc, kv_before, kv_after, q_lat, ctx):
    """q_lat and the updated cache against the reference run on the CPU from the same inputs."""
    assert_no_poison(OP, q_lat, names=["q_lat"])
    ref_cache = kv_before.cpu().clone()
    ref_q = ref_d2(q_nope.cpu(), c_kv.cpu(), k_pe.cpu(), types.SimpleNamespace(w_kc=w_kc.cpu()), positions.cpu(),
                   out_cache_loc.cpu(), ref_cache, cfg)
    assert_close(OP, q_lat, ref_q, kind="bf16", context=ctx + " q_lat")
    assert_within_one_ulp(q_lat, ref_q, ctx + " q_lat")
    # the cache: every row bitwise (target rows = reference; the rest = untouched, poison included)
    got = kv_after.cpu().view(torch.int16)
    want = ref_cache.view(torch.int16)
    slots = out_cache_loc.cpu().long()
    assert_equal(OP, got[slots], want[slots], context=ctx + " kv_cache target rows")
    neq = (got != want).any(dim=1)
    assert not neq.any(), f"{OP} [{ctx}]: kv_cache rows {neq.nonzero().flatten()[:8].tolist()} differ from the reference"


# ---- CPU: the kernel's fragment layout, emulated -------------------------------------------------------

def _swz(k: int) -> int:
    return (((k >> 3) & 3) << 1) | (k & 1)


def _mma(a, b, c):
    """mma.m16n8k16 on per-lane fragments: a [32][4][2], b [32][2][2], c [32][4] (float64 lists) -> new c."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for e in range(2):
            A[g, 2 * t + e], A[g + 8, 2 * t + e] = a[lane][0][e], a[lane][1][e]
            A[g, 2 * t + 8 + e], A[g + 8, 2 * t + 8 + e] = a[lane][2][e], a[lane][3][e]
            B[2 * t + e, g], B[2 * t + 8 + e, g] = b[lane][0][e], b[lane][1][e]
    C = A @ B
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append([c[lane][0] + C[g, 2 * t].item(), c[lane][1] + C[g, 2 * t + 1].item(),
                    c[lane][2] + C[g + 8, 2 * t].item(), c[lane][3] + C[g + 8, 2 * t + 1].item()])
    return out


def _ldmatrix_x4_trans(smem: torch.Tensor, byte_addr: list[int]):
    """smem: flat float64 (one entry per bf16); byte_addr[lane]: row address -> regs [32][4][2]."""
    regs = [[None] * 4 for _ in range(32)]
    for i in range(4):
        rows = [smem[byte_addr[8 * i + r] // 2: byte_addr[8 * i + r] // 2 + 8] for r in range(8)]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            regs[lane][i] = (rows[2 * t][g].item(), rows[2 * t + 1][g].item())
    return regs


@pytest.mark.parametrize("nope, mt_per_warp", [(64, 1), (64, 2), (192, 1)])
def test_fragment_layout_emulation(nope, mt_per_warp):
    """Mirror of D2AbsorbTile: copy + swizzle, a_offset, B loads, MMA steps, epilogue -> exact W^T q."""
    torch.manual_seed(0)
    n_tile, tokens = 128, 8 * 2
    w = torch.randn(nope, n_tile, dtype=torch.float64)  # w_kc[h][:, ntile cols]
    q = torch.randn(tokens, nope, dtype=torch.float64)  # q_nope[:, h, :]
    # issue_weight_copies: chunk ch of row k lands at byte row*256 + ((ch ^ swz(row)) << 4)
    smem = torch.full((nope * n_tile,), float("nan"), dtype=torch.float64)
    for row in range(nope):
        for ch in range(16):
            dst = (row * 256 + ((ch ^ _swz(row)) << 4)) // 2
            smem[dst:dst + 8] = w[row, ch * 8:ch * 8 + 8]
    assert not torch.isnan(smem).any()
    out = torch.full((tokens, n_tile), float("nan"), dtype=torch.float64)
    mgroups = 8 // mt_per_warp
    for mg in range(mgroups):
        acc = {(mt, nt): [[0.0] * 4 for _ in range(32)] for mt in range(mt_per_warp) for nt in range(tokens // 8)}
        for kb in range(nope // 32):
            # B: lane (g, t) holds q[tok g][kb*32 + 8t .. +8] as 4 words of 2
            bv = {nt: [[(q[nt * 8 + (l >> 2), kb * 32 + 8 * (l & 3) + 2 * wd].item(),
                         q[nt * 8 + (l >> 2), kb * 32 + 8 * (l & 3) + 2 * wd + 1].item()) for wd in range(4)]
                       for l in range(32)] for nt in range(tokens // 8)}
            for s in range(2):
                for mt in range(mt_per_warp):
                    addr = []
                    for lane in range(32):  # D2AbsorbTile::a_offset
                        i, r = lane >> 3, lane & 7
                        kl = 8 * (r >> 1) + 4 * s + 2 * (i >> 1) + (r & 1)
                        ch = 2 * (mg * mt_per_warp + mt) + (i & 1)
                        addr.append((kb * 32 + kl) * 256 + ((ch ^ _swz(kl)) << 4))
                    # conflict-free: each matrix's 8 rows hit 8 distinct 16-byte bank groups
                    for i in range(4):
                        assert len({(addr[8 * i + r] // 16) % 8 for r in range(8)}) == 8
                    a = _ldmatrix_x4_trans(smem, addr)
                    for nt in range(tokens // 8):
                        b = [[bv[nt][l][2 * s], bv[nt][l][2 * s + 1]] for l in range(32)]
                        acc[(mt, nt)] = _mma(a, b, acc[(mt, nt)])
        for (mt, nt), c in acc.items():  # epilogue: (n, tk), (n, tk+1), (n+8, tk), (n+8, tk+1)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                n = (mg * mt_per_warp + mt) * 16 + g
                tk = nt * 8 + 2 * t
                out[tk, n], out[tk + 1, n], out[tk, n + 8], out[tk + 1, n + 8] = c[lane]
    want = q @ w
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12), (out - want).abs().max()


def test_smem_and_configs():
    assert config_for(192, 512, 64, 32) == D2Config(192, 512, 64, 1)
    assert config_for(192, 512, 64, 33) == D2Config(192, 512, 64, 2)
    assert D2Config(192, 512, 64, 1).smem_bytes == 192 * 256 + 8 * 32 * 48
    assert D2Config(192, 512, 64, 2).smem_bytes == 192 * 256 + 8 * 32 * 80
    assert D2Config(192, 512, 64, 2).smem_bytes <= 113 * 1024  # two CTAs per SM fit in 228 KB
    for bad in ((100, 512, 64), (192, 500, 64), (192, 512, 66), (288, 512, 64)):
        with pytest.raises(ValueError, match="not supported"):
            config_for(*bad, 1)


def test_inv_freq_table_matches_reference_rope():
    """cos/sin from the table the kernel gets are bitwise the reference's (same float64 expression)."""
    for cfg in (Glm5Config.preset("glm5"), Glm5Config.preset("small")):
        pos = torch.tensor([0, 1, 7, 4095, 123456, cfg.max_position_embeddings - 1])
        r = cfg.qk_rope_head_dim
        inv = inv_freq_table(r, cfg.rope_theta)
        ang = pos.to(torch.float64)[:, None] * inv[None, :]
        cos, sin = rope_cos_sin(pos, r, cfg.rope_theta)
        assert torch.equal(ang.cos().float(), cos) and torch.equal(ang.sin().float(), sin)


# ---- CPU: validation and fake implementation ---------------------------------------------------------

SMALL = Glm5Config.preset("small")


def _cpu_args(m=3, cfg=SMALL):
    q, c, k, pos, loc, cache = make_inputs(cfg, m, 0, device="cpu")
    w = types.SimpleNamespace(w_kc=torch.zeros(cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank,
                                               dtype=BF16))
    return [q, c, k, w, pos, loc, cache, cfg]


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a.__setitem__(0, a[0].float()), "q_nope must be torch.bfloat16"),
    (lambda a: a.__setitem__(0, a[0][:, :, :32].contiguous()), "w_kc must be"),
    (lambda a: a.__setitem__(0, a[0].transpose(0, 1).contiguous().transpose(0, 1)), "q_nope must be contiguous"),
    (lambda a: a.__setitem__(1, a[1][:2].contiguous()), "c_kv must be"),
    (lambda a: a.__setitem__(2, a[2][:, :16].contiguous()), "kv_cache must be"),
    (lambda a: a.__setitem__(4, a[4].float()), "positions must be"),
    (lambda a: a.__setitem__(5, a[5].int()), "same dtype"),
    (lambda a: a.__setitem__(5, a[5][:2]), "out_cache_loc must be"),
    (lambda a: a.__setitem__(6, a[6].float()), "kv_cache must be torch.bfloat16"),
    (lambda a: a.__setitem__(6, a[6][:, None]), "kv_cache must be 2-D"),
    (lambda a: a.__setitem__(3, types.SimpleNamespace(w_kc=None)), "w_kc must be a torch.Tensor"),
    (lambda a: a.__setitem__(7, Glm5Config.preset("glm5")), "do not match the config"),
    (lambda a: None, "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(mutate, match):
    a = _cpu_args()
    mutate(a)
    with pytest.raises(ValueError, match=match) as ei:
        d2_absorb_and_kv_store(*a)
    assert "glm5_fastpath.d2_absorb_and_kv_store" in str(ei.value)


def test_too_many_tokens_and_bad_dims():
    a = _cpu_args(m=257)
    with pytest.raises(ValueError, match="exceeds the supported maximum of 256"):
        d2_absorb_and_kv_store(*a)
    cfg = Glm5Config.preset("small")
    q = torch.zeros(2, 4, 48, dtype=BF16)  # nope 48: not a multiple of 32
    args = [q, torch.zeros(2, 128, dtype=BF16), torch.zeros(2, 32, dtype=BF16), torch.zeros(4, 48, 128, dtype=BF16),
            torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.zeros(8, 160, dtype=BF16), 1e4]
    with pytest.raises(ValueError, match="qk_nope_head_dim=48 is not supported"):
        torch.ops.glm5_fastpath.d2_absorb_kv_store(*args, True)
    args[-1] = float("nan")
    with pytest.raises(ValueError, match="rope_theta"):
        torch.ops.glm5_fastpath.d2_absorb_kv_store(*args, True)


def test_fake_shapes():
    cfg = Glm5Config.preset("glm5")
    meta = dict(device="meta")
    q = torch.empty(5, 64, 192, dtype=BF16, **meta)
    out = torch.ops.glm5_fastpath.d2_absorb_kv_store(
        q, torch.empty(5, 512, dtype=BF16, **meta), torch.empty(5, 64, dtype=BF16, **meta),
        torch.empty(64, 192, 512, dtype=BF16, **meta), torch.empty(5, dtype=torch.long, **meta),
        torch.empty(5, dtype=torch.long, **meta), torch.empty(99, 576, dtype=BF16, **meta), cfg.rope_theta, True)
    assert tuple(out.shape) == (5, 64, 512) and out.dtype == BF16
    schema = torch.ops.glm5_fastpath.d2_absorb_kv_store.default._schema
    written = [x.name for x in schema.arguments if x.alias_info is not None and x.alias_info.is_write]
    assert written == ["kv_cache"], written


# ---- GPU -------------------------------------------------------------------------------------------------

GLM5 = Glm5Config.preset("glm5")


@pytest.fixture(scope="module")
def glm5_w_kc():
    from glm5_fastpath.weights import random_layer
    return random_layer(GLM5, 3, 1234, device="cuda").attn.w_kc


@pytest.fixture(scope="module")
def small_w_kc():
    from glm5_fastpath.weights import random_layer
    return random_layer(SMALL, 1, 99, device="cuda").attn.w_kc


def run_checked(cfg, w_kc, m, seed, ctx, idx_dtype=torch.int64, pdl=True):
    q, c, k, pos, loc, cache = make_inputs(cfg, m, seed, idx_dtype=idx_dtype)
    poison_rows_(cache, loc)
    before = cache.clone()
    q_lat = d2_absorb_and_kv_store(q, c, k, types.SimpleNamespace(w_kc=w_kc), pos, loc, cache, cfg, pdl=pdl)
    torch.cuda.synchronize()
    check_call(cfg, w_kc, q, c, k, pos, loc, before, cache, q_lat, ctx)
    return q_lat, cache


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_glm5(m, seed, glm5_w_kc, no_pdl_override):
    run_checked(GLM5, glm5_w_kc, m, seed + m, f"glm5 {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 33, 256])
def test_matches_reference_small_preset_and_int32_indices(m, seed, small_w_kc):
    run_checked(SMALL, small_w_kc, m, seed + m, f"small {m=} {seed=}")
    run_checked(SMALL, small_w_kc, m, seed + m, f"small int32 {m=} {seed=}", idx_dtype=torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_int32_indices_and_pdl_off_glm5(m, seed, glm5_w_kc):
    run_checked(GLM5, glm5_w_kc, m, seed, f"glm5 int32 {m=}", idx_dtype=torch.int32, pdl=False)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 16, 200])
def test_deterministic(m, seed, glm5_w_kc):
    q, c, k, pos, loc, cache = make_inputs(GLM5, m, seed)
    w = types.SimpleNamespace(w_kc=glm5_w_kc)
    cache2 = cache.clone()
    a = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, GLM5)
    b = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache2, GLM5, pdl=False)
    torch.cuda.synchronize()
    assert_equal(OP, a, b, context="run to run")
    assert_equal(OP, cache, cache2, context="run to run kv_cache")


@pytest.mark.gpu
def test_out_of_range_slot_is_skipped_and_empty_batch(seed, glm5_w_kc):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 4, seed, num_slots=64)
    w = types.SimpleNamespace(w_kc=glm5_w_kc)
    loc[2] = 64  # one past the end
    loc[3] = -1
    before = cache.clone()
    q_lat = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, GLM5)
    torch.cuda.synchronize()
    assert_no_poison(OP, q_lat, names=["q_lat"])
    ok = loc[:2].long()
    ref_cache = before.cpu().clone()
    ref_d2(q[:2].cpu(), c[:2].cpu(), k[:2].cpu(), types.SimpleNamespace(w_kc=glm5_w_kc.cpu()), pos[:2].cpu(),
           ok.cpu(), ref_cache, GLM5)
    assert_equal(OP, cache, ref_cache.cuda(), context="only the two in-range slots written")
    empty = make_inputs(GLM5, 0, seed)
    out = d2_absorb_and_kv_store(*empty[:3], w, *empty[3:], GLM5)
    assert tuple(out.shape) == (0, 64, 512)


@pytest.mark.gpu
def test_gpu_error_cases(glm5_w_kc):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 4, 0)
    w = types.SimpleNamespace(w_kc=glm5_w_kc)
    with pytest.raises(ValueError, match="one device"):
        d2_absorb_and_kv_store(q, c, k, w, pos.cpu(), loc, cache, GLM5)
    buf = torch.empty(4 * 512 + 8, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        d2_absorb_and_kv_store(q, buf[1:1 + 4 * 512].view(4, 512), k, w, pos, loc, cache, GLM5)
    with pytest.raises(ValueError, match="kv_cache overlaps input c_kv"):
        d2_absorb_and_kv_store(q, cache.view(-1)[: 4 * 512].view(4, 512), k, w, pos, loc, cache, GLM5)


# ---- PDL ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_waits_for_the_late_producer_under_pdl(m, seed, glm5_w_kc, no_pdl_override):
    """The producer (q_nope's writer, D0's stand-in) spins ~50 us, then writes q_nope; D2 launched with
    PDL right behind it loads its weights early but must read only the fresh q_nope."""
    producer = late_producer()
    q_true, c, k, pos, loc, cache = make_inputs(GLM5, m, seed)
    w = types.SimpleNamespace(w_kc=glm5_w_kc)
    q = torch.full_like(q_true, 7.0)
    d2_absorb_and_kv_store(q_true, c, k, w, pos, loc, cache.clone(), GLM5)  # compile + load first
    for _ in range(3):
        q.fill_(7.0)
        poison_rows_(cache, loc)
        before = cache.clone()
        torch.cuda.synchronize()
        produce(producer, q_true, q)
        q_lat = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, GLM5, pdl=True)
        torch.cuda.synchronize()
        check_call(GLM5, glm5_w_kc, q_true, c, k, pos, loc, before, cache, q_lat, f"PDL after producer {m=}")


# ---- CUDA graphs / torch.compile ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 100])
def test_cuda_graph_capture_and_replay(m, seed, glm5_w_kc, no_pdl_override):
    producer = late_producer()
    w = types.SimpleNamespace(w_kc=glm5_w_kc)
    q_src, c, k, pos, loc, cache = make_inputs(GLM5, m, seed, num_slots=4 * 256)
    static_q = torch.empty_like(q_src)
    d2_absorb_and_kv_store(q_src, c, k, w, pos, loc, cache.clone(), GLM5)  # warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, q_src, static_q)  # producer -> D2 with a PDL edge
        q_lat = d2_absorb_and_kv_store(static_q, c, k, w, pos, loc, cache, GLM5, pdl=True)
    for step in range(3):
        nq, nc, nk, npos, nloc, _ = make_inputs(GLM5, m, seed + 100 + step, num_slots=4 * 256)
        for dst, src in ((q_src, nq), (c, nc), (k, nk), (pos, npos), (loc, nloc)):
            dst.copy_(src)
        poison_rows_(cache, loc)
        before = cache.clone()
        poison_(q_lat)
        static_q.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        check_call(GLM5, glm5_w_kc, nq, nc, nk, npos, nloc, before, cache, q_lat, f"graph replay {step} {m=}")


@pytest.mark.gpu
def test_torch_compile_fullgraph(seed, glm5_w_kc):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 8, seed)
    theta = float(GLM5.rope_theta)

    def f(q, c, k, pos, loc, cache):  # the registered op itself (the Python wrapper only unpacks w / cfg)
        return torch.ops.glm5_fastpath.d2_absorb_kv_store(q, c, k, glm5_w_kc, pos, loc, cache, theta, True).float() * 2.0

    cache2 = cache.clone()
    want = f(q, c, k, pos, loc, cache)
    got = torch.compile(f, fullgraph=True)(q, c, k, pos, loc, cache2)
    torch.cuda.synchronize()
    assert_equal(OP, got, want, context="torch.compile q_lat")
    assert_equal(OP, cache2, cache, context="torch.compile kv_cache (mutation kept)")


@pytest.mark.gpu
def test_opcheck_fake(seed, glm5_w_kc):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 4, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.d2_absorb_kv_store.default,
                          (q, c, k, glm5_w_kc, pos, loc, cache, GLM5.rope_theta, True),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
def test_kernel_resources_report():
    """No spills; the only local memory is the 40-byte frame of CUDA's double-precision trig slow path
    (Payne-Hanek reduction for |angle| > 2^31 or so, never taken at decode positions)."""
    from glm5_fastpath.jit import get_kernel
    for m in (1, 256):
        k = get_kernel(config_for(192, 512, 64, m).spec)
        assert k.local_bytes <= 64, k
        assert k.param_sizes is None or k.param_sizes == (8,) * 10 + (4, 4, 4), k.param_sizes
        assert 0 < k.num_regs <= 112 and k.max_threads >= 288, k  # two 288-thread CTAs per SM
