"""E1 paged FP8 indexer logits: the custom op against glm5_fastpath.ref.prefix.e1_indexer_logits.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings; the CPU tests check argument
validation, the grid planner, the fake (meta) implementation, two Python emulations of the kernel
(its fragment / K-permutation / swizzle index math, and its in-kernel work split) and, when nvcc is
present, that every variant compiles without spills or serialized wgmma.

What is compared, and why the bar is where it is:
- Both sides start from the SAME fp8 q / k bytes and fp32 scales / head weights. Every fp8 x fp8
  product is exact in fp32 (4-bit significands); the kernel sums the 128 products with fp32
  tensor-core accumulation (f16 wgmma; e4m3 -> f16 is exact), the reference with an fp32 einsum,
  and the 32 ReLU'd heads in another order. Only summation order and the tensor core's accumulation rounding
  separate them: ~1e-7 relative, so the live logits are judged with tol=1e-5 (the project's fp32
  bar, 200x tighter than kind "fp8_same_quant" = 2e-2, which would also pass a kernel with a
  wrong scale on a few heads).
- Columns at or past seq_len must be exactly -inf; outputs start poisoned (NaN), so an unwritten
  column fails; slots of the last page past seq_len hold NaN bytes, so a leak of them fails.
- The kernel is deterministic and its per-token arithmetic does not depend on the work split: outputs
  must be bitwise equal across runs, grids (pages_per_split), PDL on/off and the metadata flag.
- Out-of-bounds writes: outputs may sit inside a larger poisoned buffer whose guard bytes must
  come back untouched.
The reference runs on the GPU (fp32 matmul precision "highest", i.e. no TF32).
"""
from __future__ import annotations

import ctypes
import importlib
import random

import numpy as np
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops.e1_indexer_logits import (CTAS_PER_SM, MAX_PAGES_PER_SPLIT, PREFETCH_PAGES, STAGES, THREADS,
                                                 config_for, e1_indexer_logits, floor_us, grid_for, page_bytes,
                                                 plan_ctas)
from glm5_fastpath.ref.fp8 import FP8, quant_per_row
from glm5_fastpath.ref.prefix import e1_indexer_logits as ref_e1
from glm5_fastpath.testing.numerics import assert_close, assert_equal, poison_

OP = "e1_indexer_logits"
TOL = 1e-5
PAGE = 64
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 127, 128, 256, 263, 300]
# lengths around page boundaries, long rows not a multiple of 64, and tiny ones
LEN_POOL = [1, 63, 64, 65, 2047, 8191, 129, 4000, 200, 1000, 6001, 7, 128, 3333, 127, 8190]

GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")


# ---- inputs ------------------------------------------------------------------------------------------

class Case:
    """Paged E1 inputs on the GPU, laid out like testing.decode_step.make_decode_step: physical
    pages shuffled over the batch, unused block-table entries = `garbage`, spare pages in the pool."""

    def __init__(self, cfg: Glm5Config, lens: list[int], seed: int, *, garbage: str = "neg", extra_cols: int = 2,
                 spare_pages: int = 3, device: str = "cuda"):
        h, d = cfg.index_n_heads, cfg.index_head_dim
        gen = torch.Generator(device="cpu").manual_seed(seed)
        m = len(lens)
        pages_per = [-(-L // PAGE) for L in lens]
        num_pages = sum(pages_per) + spare_pages
        perm = torch.randperm(num_pages, generator=gen)
        width = max(pages_per + [1]) + extra_cols
        bt = torch.empty(m, width, dtype=torch.int32)
        if garbage == "neg":
            bt.fill_(-1)
        elif garbage == "big":
            bt.fill_(2**30)  # far outside the pool: a read faults
        elif garbage == "spare":
            bt.fill_(int(perm[-1]))  # a real page, filled with NaN bytes below
        else:
            raise ValueError(garbage)
        at = 0
        for i, n in enumerate(pages_per):
            bt[i, :n] = perm[at:at + n].int()
            at += n
        dg = torch.Generator(device=device).manual_seed(seed)
        cache = torch.empty(num_pages, page_bytes(d), dtype=torch.uint8, device=device)
        k8, ks = quant_per_row(torch.randn(num_pages, PAGE, d, generator=dg, device=device))
        cache[:, : PAGE * d] = k8.view(torch.uint8).reshape(num_pages, PAGE * d)
        cache[:, PAGE * d:] = ks.reshape(num_pages, PAGE).contiguous().view(torch.uint8)
        if garbage == "spare":
            cache[int(perm[-1])] = 0xFF
        # slots of each last page past seq_len: NaN k bytes and a NaN scale, so any leak shows
        for i, L in enumerate(lens):
            if L % PAGE:
                p = int(bt[i, L // PAGE])
                r = L % PAGE
                cache[p, r * d: PAGE * d] = 0xFF
                cache[p, PAGE * d + 4 * r:] = 0xFF
        q8, _ = quant_per_row(torch.randn(m, h, d, generator=dg, device=device) * 3.0)
        self.q = q8.contiguous()
        self.head_w = (torch.randn(m, h, generator=dg, device=device) * 0.02).contiguous()
        self.cache = cache
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.block_table = bt.to(device)
        self.lens = list(lens)
        self.cfg = cfg

    def args(self):
        return self.q, self.head_w, self.cache, self.seq_lens, self.block_table


def lens_for(m: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [LEN_POOL[i] if i < len(LEN_POOL) else rnd.choice(LEN_POOL + [rnd.randint(1, 8192)]) for i in range(m)]


def reference(case: Case, width: int | None = None, lens: list[int] | None = None) -> torch.Tensor:
    """ref.prefix.e1_indexer_logits on the GPU, padded with -inf to `width` columns."""
    seq_lens = case.seq_lens if lens is None else torch.tensor(lens, dtype=torch.int32, device=case.q.device)
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        ref = ref_e1(case.q, case.head_w, case.cache, seq_lens, case.block_table, case.cfg)
    finally:
        torch.set_float32_matmul_precision(prev)
    if width is not None and width > ref.shape[1]:
        ref = torch.cat([ref, ref.new_full((ref.shape[0], width - ref.shape[1]), float("-inf"))], dim=1)
    return ref[:, :width] if width is not None else ref


def check(out: torch.Tensor, ref: torch.Tensor, lens: list[int], ctx: str) -> None:
    m, w = out.shape
    assert tuple(ref.shape) == (m, w), f"{OP} [{ctx}]: shape {tuple(out.shape)} vs ref {tuple(ref.shape)}"
    live = torch.arange(w, device=out.device)[None, :] < torch.tensor(lens, device=out.device)[:, None]
    tail = out[~live]
    bad = ~torch.isneginf(tail)
    assert not bool(bad.any()), (f"{OP} [{ctx}]: {int(bad.sum())} columns past seq_len are not -inf, "
                                 f"e.g. {tail[bad][:4].tolist()}")
    if bool(live.any()):
        assert_close(OP, out[live], ref[live], tol=TOL, context=ctx)


# ---- CPU: validation, planning, fake implementation --------------------------------------------

def _cpu_args(m=3, h=32, d=128, pages=5, width=4):
    return (torch.zeros(m, h, d, dtype=torch.uint8).view(FP8), torch.zeros(m, h), torch.zeros(pages, page_bytes(d),
            dtype=torch.uint8), torch.full((m,), 70, dtype=torch.int32), torch.zeros(m, width, dtype=torch.int32))


@pytest.mark.parametrize("mutate, match", [
    (lambda q, w, c, s, b: (q.view(torch.uint8), w, c, s, b), "q_fp8 must be torch.float8_e4m3fn"),
    (lambda q, w, c, s, b: (q[:, :, :64].contiguous(), w, c, s, b), "rows must be one 64-token page"),
    (lambda q, w, c, s, b: (q.transpose(0, 1).contiguous().transpose(0, 1), w, c, s, b), "q_fp8 must be contiguous"),
    (lambda q, w, c, s, b: (q, w.double(), c, s, b), "head_w must be torch.float32"),
    (lambda q, w, c, s, b: (q, w[:, :16].contiguous(), c, s, b), "head_w must have shape"),
    (lambda q, w, c, s, b: (q, w, c[:, :8192].contiguous(), s, b), "8448 bytes"),
    (lambda q, w, c, s, b: (q, w, c.view(torch.int8), s, b), "index_k_cache must be torch.uint8"),
    (lambda q, w, c, s, b: (q, w, c, s.long(), b), "seq_lens must be torch.int32"),
    (lambda q, w, c, s, b: (q, w, c, s[:2], b), "seq_lens must have shape"),
    (lambda q, w, c, s, b: (q, w, c, s, b.long()), "block_table must be torch.int32"),
    (lambda q, w, c, s, b: (q, w, c, s, b[:2]), "block_table must have 3 rows"),
    (lambda q, w, c, s, b: (q, w, c, s, b.t().contiguous().t()), "unit column stride"),
    (lambda q, w, c, s, b: (q, w, c, s, b), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(mutate, match):
    args = mutate(*_cpu_args())
    with pytest.raises(ValueError, match=match) as ei:
        e1_indexer_logits(*args, GLM5, max_ctx=128)
    assert "glm5_fastpath.e1_indexer_logits" in str(ei.value)


def test_config_and_width_errors():
    args = _cpu_args()
    with pytest.raises(ValueError, match=r"must be \[M, 4, 64\] for this config"):
        e1_indexer_logits(*args, SMALL, max_ctx=128)
    with pytest.raises(ValueError, match="cfg must be a Glm5Config"):
        e1_indexer_logits(*args, None, max_ctx=128)
    with pytest.raises(ValueError, match=r"max_ctx=257 must be in \[0, 256\]"):
        e1_indexer_logits(*args, GLM5, max_ctx=257)  # 4 pages x 64
    with pytest.raises(ValueError, match="max_ctx must be an int"):
        e1_indexer_logits(*args, GLM5, max_ctx=12.0)
    with pytest.raises(ValueError, match="max_ctx=100 but out has 128 columns"):
        e1_indexer_logits(*args, GLM5, max_ctx=100, out=torch.empty(3, 128))
    with pytest.raises(ValueError, match="out must have 3 rows"):
        e1_indexer_logits(*args, GLM5, out=torch.empty(2, 128))
    for bad in (0, MAX_PAGES_PER_SPLIT + 1, True, 2.0):
        with pytest.raises(ValueError, match="pages_per_split must be an int"):
            e1_indexer_logits(*args, GLM5, max_ctx=128, pages_per_split=bad)
    with pytest.raises(ValueError, match="not supported"):
        config_for(64, 128)
    with pytest.raises(ValueError, match="not supported"):
        config_for(32, 256)


def test_page_slot_bound():
    """M * ceil(max_ctx / 64) is the kernel's int32 work-split range: refused beyond it (meta tensors)."""
    m, width = 40000, 60000  # 40000 rows x 60000 page slots > 2^31
    meta = dict(device="meta")
    args = (torch.empty(m, 32, 128, dtype=FP8, **meta), torch.empty(m, 32, **meta),
            torch.empty(4, 8448, dtype=torch.uint8, **meta), torch.empty(m, dtype=torch.int32, **meta),
            torch.empty(m, width, dtype=torch.int32, **meta))
    with pytest.raises(ValueError, match="page slots exceed"):
        e1_indexer_logits(*args, GLM5, max_ctx=width * 64)
    out = e1_indexer_logits(*args, GLM5, max_ctx=64 * 1000)  # 40M slots: fine
    assert tuple(out.shape) == (m, 64000)


def test_host_max_ctx_checks_seq_lens():
    q, w, c, s, b = _cpu_args()
    with pytest.raises(ValueError, match="negative entry"):
        e1_indexer_logits(q, w, c, torch.tensor([1, -2, 3], dtype=torch.int32), b, GLM5)
    with pytest.raises(ValueError, match="exceeds the block table capacity"):
        e1_indexer_logits(q, w, c, torch.tensor([1, 257, 3], dtype=torch.int32), b, GLM5)
    with pytest.raises(ValueError, match="CUDA device"):  # valid: gets as far as the launch
        e1_indexer_logits(q, w, c, s, b, GLM5)


def test_plan_ctas():
    sms = 132
    assert plan_ctas(16, 8192, sms) == CTAS_PER_SM * sms   # 2048 pages over 264 CTAs: 7-8 each, one wave
    assert plan_ctas(256, 8192, sms) == CTAS_PER_SM * sms  # 124 pages each
    assert plan_ctas(1, 8192, sms) == 128                  # a CTA per page slot: 128 pages in parallel
    assert plan_ctas(1, 10, sms) == 1
    assert plan_ctas(0, 0, sms) == 1
    assert plan_ctas(600, 100, sms) == CTAS_PER_SM * sms
    assert plan_ctas(3, 8191, sms) == CTAS_PER_SM * sms
    assert plan_ctas(2, 4000, sms) == 2 * 63
    assert plan_ctas(16, 8192, sms, 7) == -(-16 * 128 // 7)  # explicit: ceil(slots / pages_per_split)
    assert plan_ctas(16, 8192, sms, 1) == 16 * 128
    assert plan_ctas(2, 100, sms, MAX_PAGES_PER_SPLIT) == 1
    for bad in (0, MAX_PAGES_PER_SPLIT + 1, True, 2.0):
        with pytest.raises(ValueError, match="pages_per_split"):
            plan_ctas(16, 8192, sms, bad)
    assert grid_for(264) == (264, 1, 1)


def test_smem_and_floor():
    # mirrors E1PagedLogits::kSmemBytes (and the .cu static_asserts it against GLM5_E1_SMEM_BYTES):
    # q f16 [32 x 128] + 7 stages x 8448 + 7 x 16 (stage records) + 14 x 8 (mbarriers) + 32 (plan)
    # + 2 x 5 x 2 x 4 (scan scratch) + 1024 (alignment slack)
    assert config_for(32, 128).smem_bytes == 8192 + 7 * 8448 + 112 + 112 + 32 + 80 + 1024 == 68688
    assert config_for(4, 64).smem_bytes == 8 * 64 * 2 + 7 * 4352 + 112 + 112 + 32 + 80 + 1024
    assert config_for(20, 128).smem_bytes == 24 * 256 + 7 * 8448 + 112 + 112 + 32 + 80 + 1024
    assert (THREADS, STAGES) == (160, 7) and PREFETCH_PAGES >= 1
    # 3 CTAs per SM (2 of ours + the next kernel's under PDL) fit the H200's 228 KB (1 KB reserved each)
    assert 3 * (config_for(32, 128).smem_bytes + 1024) <= 228 * 1024
    assert abs(floor_us(16, 8192) - 4.19) < 0.01  # 17.9 MB at 4.27 TB/s


def test_fake_shapes_and_compile_meta():
    m = 5
    meta = dict(device="meta")
    q = torch.empty(m, 32, 128, dtype=FP8, **meta)
    w = torch.empty(m, 32, **meta)
    c = torch.empty(9, 8448, dtype=torch.uint8, **meta)
    s = torch.empty(m, dtype=torch.int32, **meta)
    b = torch.empty(m, 3, dtype=torch.int32, **meta)
    out = torch.ops.glm5_fastpath.e1_indexer_logits(q, w, c, s, b, 150, 0, True, True)
    assert tuple(out.shape) == (m, 150) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="pass max_ctx"):
        e1_indexer_logits(q, w, c, s, b, GLM5)

    def f(q, w, c, s, b):
        return e1_indexer_logits(q, w, c, s, b, GLM5, max_ctx=192) * 2.0
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, w, c, s, b)
    assert tuple(got.shape) == (m, 192)


# ---- CPU: emulations of the kernel's index math and work split ----------------------------------------

def _logical_pair(pp: int, dim: int) -> int:
    """E1PagedLogits::logical_pair: physical byte pair of a row -> logical f16 pair of the K dimension."""
    t, r = divmod(pp, dim // 8)
    return 8 * (r >> 1) + 4 * (r & 1) + t


def _b_offset(n: int, kp: int, mma_n: int) -> int:
    """E1PagedLogits::b_offset: byte offset of logical pair kp of head n in the 128B-swizzled B tile."""
    return (kp >> 5) * mma_n * 128 + n * 128 + ((((kp & 31) >> 2) ^ (n & 7)) << 4) + ((kp & 3) << 2)


def _wgmma_b_read(smem_elems: np.ndarray, start: int, n: int, k: int) -> float:
    """What wgmma reads for B[k][n] (f16, K-major, 128B swizzle, SBO 1024) from a k-step whose
    descriptor start address is `start` (bytes from the 1024-aligned tile base): the linear address
    start + (n // 8) * 1024 + (n % 8) * 128 + 2k, then address bits [4:6] ^= bits [7:9]."""
    lin = start + (n // 8) * 1024 + (n % 8) * 128 + 2 * k
    phys = lin ^ (((lin >> 7) & 7) << 4)
    return smem_elems[phys // 2]


@pytest.mark.parametrize("heads, dim", [(32, 128), (4, 64), (20, 128), (17, 64), (1, 128)])
def test_fragment_index_math_emulation(heads, dim):
    """A numpy emulation of one page through the kernel (csrc/attn_pre/e1_indexer_logits.cuh):
    the consumer's shared loads of its rows (with the odd-g chunk swap), e4m3 -> f16 pairs into the
    wgmma register layout (CuTe ALayout_64x16), q stored by store_q (logical_pair + b_offset) and
    read back the way a 128B-swizzle descriptor addresses it, the k16 steps, the accumulator layout
    (CLayout_64xN) and the epilogue (ReLU, head weights, xor-1/2 quad reduction, lanes t = 0 / 1
    storing tokens g / g + 8) reproduce the plain formula. Every A/B fragment slot must be filled
    exactly once (NaN spreads otherwise), and the 16-byte loads must be bank-conflict free."""
    rng = np.random.default_rng(heads * 1000 + dim)
    mma_n, steps, chunks = -(-heads // 8) * 8, dim // 16, dim // 64
    q = rng.integers(-8, 8, size=(heads, dim)).astype(np.float64)
    k = rng.integers(-8, 8, size=(PAGE, dim)).astype(np.float64)
    sk = rng.random(PAGE) + 0.5
    w = rng.standard_normal(heads)
    want = (np.maximum(q @ k.T, 0) * w[:, None]).sum(0) * sk

    # store_q: B in shared memory, as f16 elements indexed by byte offset / 2
    b_smem = np.full(mma_n * dim, np.nan)
    for n in range(mma_n):
        for c in range(dim // 16):
            for wi in range(4):
                for half in range(2):
                    pp = c * 8 + wi * 2 + half
                    off = _b_offset(n, _logical_pair(pp, dim), mma_n)
                    assert off % 4 == 0 and 0 <= off < mma_n * dim * 2
                    assert np.isnan(b_smem[off // 2]), "two pairs stored at one place"
                    b_smem[off // 2: off // 2 + 2] = q[n, 2 * pp: 2 * pp + 2] if n < heads else 0.0
    assert not np.isnan(b_smem).any()

    # the consumer's loads: page K as bytes (values), row stride dim
    page = k.reshape(-1)
    acc = {}
    for warp in range(4):
        a_steps = np.full((steps, 64, 16), np.nan)
        addrs = {}  # (h, load) -> per-lane byte address, for the bank check
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for h in range(2):
                row = 16 * warp + g + 8 * h
                rowp = row * dim + t * (dim // 4)
                if chunks == 2:
                    odd = g & 1
                    x_at, y_at = rowp + 16 * odd, rowp + 16 * (odd ^ 1)
                    addrs.setdefault((h, 0), [None] * 32)[lane] = x_at
                    addrs.setdefault((h, 1), [None] * 32)[lane] = y_at
                    x, y = page[x_at: x_at + 16], page[y_at: y_at + 16]
                    raw = np.concatenate([y, x] if odd else [x, y])
                else:
                    addrs.setdefault((h, 0), [None] * 32)[lane] = rowp
                    raw = page[rowp: rowp + 16]
                for st in range(steps):  # raw word st: bytes 4st..4st+3; lo pair -> a0/a1, hi pair -> a2/a3
                    lo, hi = raw[4 * st: 4 * st + 2], raw[4 * st + 2: 4 * st + 4]
                    for kk, vals in ((2 * t, lo), (2 * t + 8, hi)):
                        assert np.isnan(a_steps[st, 16 * warp + g + 8 * h, kk: kk + 2]).all()
                        a_steps[st, 16 * warp + g + 8 * h, kk: kk + 2] = vals
        for key, lanes in addrs.items():  # 16-byte loads: each quarter-warp hits 8 distinct bank groups
            for qw in range(4):
                groups = {(a // 16) % 8 for a in lanes[8 * qw: 8 * qw + 8]}
                assert len(groups) == 8, (heads, dim, warp, key, qw, lanes[8 * qw: 8 * qw + 8])
        rows = slice(16 * warp, 16 * warp + 16)
        d = np.zeros((16, mma_n))
        for st in range(steps):
            start = (st >> 2) * mma_n * 128 + (st & 3) * 32
            bmat = np.array([[_wgmma_b_read(b_smem, start, n, kk) for n in range(mma_n)] for kk in range(16)])
            d += a_steps[st, rows] @ bmat
        acc[warp] = d
    got = np.full(PAGE, np.nan)
    for warp in range(4):
        d = acc[warp]
        p = np.zeros((32, 2))
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for j in range(mma_n // 8):
                for b in range(2):
                    head = 8 * j + 2 * t + b
                    wt = w[head] if head < heads else 0.0
                    p[lane, 0] += wt * max(d[g, 8 * j + 2 * t + b], 0.0)      # acc[4j + b]
                    p[lane, 1] += wt * max(d[g + 8, 8 * j + 2 * t + b], 0.0)  # acc[4j + 2 + b]
        for off in (1, 2):
            p = p + p[np.arange(32) ^ off]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            if t < 2:
                tok = 16 * warp + g + 8 * t
                assert np.isnan(got[tok])
                got[tok] = p[lane, t] * sk[tok]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9 * np.abs(want).max())


def _emulate_plan(lens, max_ctx, bt_width, ctas, threads=THREADS):
    """E1PagedLogits::plan + walk in Python (same integer arithmetic, same chunked block scans):
    -> per CTA the (row, page) list of its live pages and of its dead pages, in walk order."""
    cap = min(max_ctx, bt_width * PAGE)
    pw = -(-max_ctx // PAGE)
    clamped = [min(max(L, 0), cap) for L in lens]
    live = [-(-c // PAGE) for c in clamped]
    m = len(lens)
    total_live = sum(live)
    total_dead = m * pw - total_live
    out = []
    for cta in range(ctas):
        ql, rl = divmod(total_live, ctas)
        qd, rd = divmod(total_dead, ctas)
        p0, n_live = ql * cta + min(cta, rl), ql + (cta < rl)
        d0, n_dead = qd * cta + min(cta, rd), qd + (cta < rd)
        plan = dict(live_row=0, live_pg=0, dead_row=0, dead_pg=0)
        need_l, need_d, carry_l, carry_d = n_live > 0, n_dead > 0, 0, 0
        for base in range(0, m, threads):
            if not (need_l or need_d):
                break
            ls = [live[r] if r < m else 0 for r in range(base, base + threads)]
            ds = [pw - live[r] if r < m else 0 for r in range(base, base + threads)]
            il, id_ = np.cumsum(ls), np.cumsum(ds)
            for i, r in enumerate(range(base, base + threads)):
                el, ed = carry_l + il[i] - ls[i], carry_d + id_[i] - ds[i]
                if need_l and ls[i] > 0 and el <= p0 < el + ls[i]:
                    plan.update(live_row=r, live_pg=p0 - el)
                if need_d and ds[i] > 0 and ed <= d0 < ed + ds[i]:
                    plan.update(dead_row=r, dead_pg=ls[i] + d0 - ed)
            carry_l, carry_d = carry_l + il[-1], carry_d + id_[-1]
            need_l, need_d = need_l and carry_l <= p0, need_d and carry_d <= d0

        def walk(row, pg, count, is_live):
            got = []
            while count > 0 and row < m:
                segs = []
                for lane in range(32):
                    r = row + lane
                    lo = hi = 0
                    if r < m:
                        lo, hi = (0, live[r]) if is_live else (live[r], pw)
                        if lane == 0:
                            lo = max(lo, pg)
                    segs.append((r, lo, max(hi - lo, 0)))
                incl = np.cumsum([n for _, _, n in segs])
                for (r, lo, n), inc in zip(segs, incl):
                    take = max(min(inc, count) - (inc - n), 0)
                    got += [(r, lo + j) for j in range(take)]
                count -= min(int(incl[-1]), count)
                row, pg = row + 32, 0
            return got
        out.append((walk(plan["live_row"], plan["live_pg"], n_live, True),
                    walk(plan["dead_row"], plan["dead_pg"], n_dead, False)))
    return out, live, pw


@pytest.mark.parametrize("case", range(12))
def test_work_split_emulation(case):
    """Every live page and every -inf page block is owned by exactly one CTA, the shares are equal
    to +-1 page, and each CTA's share is contiguous in row-major order: for short and long rows,
    empty rows, rows longer than max_ctx or the block table, M across the 160-row scan chunks, and
    grids larger than the work."""
    rnd = random.Random(1000 + case)
    m = [1, 3, 16, 161, 320, 7, 64, 1, 2, 500, 33, 16][case]
    max_ctx = [8192, 100, 8191, 640, 1000, 65, 8192, 1, 64, 333, 4000, 130][case]
    bt_width = -(-max_ctx // PAGE) + rnd.choice([0, 0, 3])
    if case == 11:
        bt_width = 1  # the block table caps rows at 64 tokens
    ctas = [264, 264, 7, 264, 1000, 3, 130, 1, 5, 264, 17, 2048][case]
    lens = [rnd.choice([0, 1, 63, 64, 65, rnd.randint(0, max_ctx + 200)]) for _ in range(m)]
    shares, live, pw = _emulate_plan(lens, max_ctx, bt_width, ctas)
    all_live = [(r, p) for r in range(m) for p in range(live[r])]
    all_dead = [(r, p) for r in range(m) for p in range(live[r], pw)]
    got_live = [x for lv, _ in shares for x in lv]
    got_dead = [x for _, dd in shares for x in dd]
    assert sorted(got_live) == all_live and len(set(got_live)) == len(got_live)
    assert sorted(got_dead) == all_dead and len(set(got_dead)) == len(got_dead)
    for kind in (0, 1):
        sizes = [len(sh[kind]) for sh in shares]
        assert max(sizes) - min(sizes) <= 1, (kind, sizes[:20])
        flat = [x for sh in shares for x in sh[kind]]
        assert flat == sorted(flat), "shares must follow row-major order, CTA by CTA"


try:
    from glm5_fastpath.jit import compile_kernel, find_nvcc
    find_nvcc()
    _HAVE_NVCC = True
except Exception:  # noqa: BLE001 - NvccNotFoundError or a broken toolkit: skip the compile test
    _HAVE_NVCC = False


@pytest.mark.skipif(not _HAVE_NVCC, reason="nvcc not found (compile tests need the CUDA toolkit)")
@pytest.mark.parametrize("heads, dim", [(32, 128), (4, 64), (20, 128)])
def test_compiles_for_sm90a_without_spills(heads, dim, monkeypatch, tmp_path):
    from glm5_fastpath.jit import env
    for name in env.VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLM5_FASTPATH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GLM5_FASTPATH_PTXAS_VERBOSE", "1")
    ck = compile_kernel(config_for(heads, dim).spec, "sm_90a")
    r = ck.resources()["glm5_e1_indexer_logits"]
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, r
    # __launch_bounds__(160, 3): <= 136 registers, so 3 CTAs (2 of ours + 1 of the next kernel) fit an SM
    assert 0 < r.registers <= 136, r
    # ptxas must not serialize the wgmma chain (C7518/C7510 "wgmma.mma_async instructions are serialized")
    assert "serialized" not in ck.log, ck.log


# ---- GPU --------------------------------------------------------------------------------------------

@pytest.fixture
def no_pdl_override(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_DISABLE_PDL", raising=False)


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_mixed_lengths(m, seed, no_pdl_override):
    lens = lens_for(m, seed + m)
    case = Case(GLM5, lens, seed + m)
    width = max(lens)
    out = poison_(torch.empty(m, width, dtype=torch.float32, device="cuda"))
    res = e1_indexer_logits(*case.args(), GLM5, out=out)
    func = e1_indexer_logits(*case.args(), GLM5)  # max_ctx=None: host sync, the reference's contract
    torch.cuda.synchronize()
    assert res is out
    ref = reference(case)
    check(out, ref, lens, f"{m=} {seed=} lens[:8]={lens[:8]}")
    assert_equal(OP, func, out, context="functional vs out=")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_name", ["glm5", "small"])
def test_one_hot_queries_locate_layout_errors(cfg_name, seed, no_pdl_override):
    """Diagnostic for the wgmma fragment / K-permutation / B-swizzle mapping: row m's q is one-hot
    (head h_m, dim d_m, value 1), the head weights are distinct powers of two and every row reads
    the same page, so logits[m, t] = w[h_m] * relu(k[t, d_m]) * s_k[t] exactly. Rows cover every
    head and every dim; a failure lists the (head, dim) pairs that came out wrong."""
    cfg = GLM5 if cfg_name == "glm5" else SMALL
    h, d = cfg.index_n_heads, cfg.index_head_dim
    m = max(h, d) * 2
    heads = [i % h for i in range(m)]
    dims = [(i * 37 + i // d) % d for i in range(m)]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k8, ks = quant_per_row(torch.randn(PAGE, d, generator=gen))
    cache = torch.zeros(2, page_bytes(d), dtype=torch.uint8)
    cache[1, : PAGE * d] = k8.view(torch.uint8).reshape(-1)
    cache[1, PAGE * d:] = ks.reshape(PAGE).contiguous().view(torch.uint8)
    q = torch.zeros(m, h, d)
    for i in range(m):
        q[i, heads[i], dims[i]] = 1.0
    w = torch.tensor([2.0 ** (j % 8) * (1 + j // 8) for j in range(h)]).repeat(m, 1)
    args = (q.to(FP8).cuda(), w.cuda().contiguous(), cache.cuda(), torch.full((m,), PAGE, dtype=torch.int32).cuda(),
            torch.ones(m, 1, dtype=torch.int32).cuda())
    out = e1_indexer_logits(*args, cfg, max_ctx=PAGE).cpu()
    kf = k8.float()
    want = torch.stack([w[i, heads[i]] * kf[:, dims[i]].clamp_min(0) * ks.reshape(PAGE) for i in range(m)])
    bad = [(i, heads[i], dims[i]) for i in range(m) if not torch.equal(out[i], want[i])]
    assert not bad, (f"{OP} [{cfg_name}]: {len(bad)} of {m} one-hot rows wrong, (row, head, dim) e.g. {bad[:12]}; "
                     f"row {bad[0][0]}: got {out[bad[0][0], :6].tolist()} want {want[bad[0][0], :6].tolist()}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 33])
def test_small_preset(m, seed):
    lens = lens_for(m, seed)
    case = Case(SMALL, lens, seed)
    out = e1_indexer_logits(*case.args(), SMALL, max_ctx=max(lens) + 5)
    torch.cuda.synchronize()
    check(out, reference(case, max(lens) + 5), lens, f"small preset {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("garbage", ["neg", "big", "spare"])
def test_unused_block_table_entries_are_never_read(garbage, seed):
    lens = [1, 63, 64, 65, 2047, 130, 8191, 700]
    clean = Case(GLM5, lens, seed, garbage="neg")
    case = Case(GLM5, lens, seed, garbage=garbage, extra_cols=5)
    width = case.block_table.shape[1] * PAGE  # the whole capacity: many all -inf splits
    out = poison_(torch.empty(len(lens), width, device="cuda"))
    e1_indexer_logits(*case.args(), GLM5, out=out)
    torch.cuda.synchronize()
    check(out, reference(clean, width), lens, f"garbage={garbage}")


@pytest.mark.gpu
def test_out_of_range_live_page_gives_nan_not_a_fault(seed):
    lens = [300, 200]
    case = Case(GLM5, lens, seed)
    ref = reference(case)
    case.block_table[0, 1] = case.cache.shape[0] + 7  # tokens 64..127 of row 0
    case.block_table[1, 0] = -3                        # tokens 0..63 of row 1
    out = e1_indexer_logits(*case.args(), GLM5, max_ctx=300)
    torch.cuda.synchronize()
    assert bool(torch.isnan(out[0, 64:128]).all()) and bool(torch.isnan(out[1, :64]).all())
    keep = torch.ones_like(out, dtype=torch.bool)
    keep[0, 64:128] = False
    keep[1, :64] = False
    keep[1, 200:] = False
    assert_close(OP, out[keep], ref[keep], tol=TOL, context="pages around the bad ones")
    assert bool(torch.isneginf(out[1, 200:]).all())


@pytest.mark.gpu
def test_deterministic_across_runs_grids_and_flags(seed, no_pdl_override):
    """Bitwise equal outputs whatever the grid: one CTA for everything (the ring wraps ~50 times),
    one CTA per page slot (1024 CTAs in waves), odd grids, PDL off and metadata after the wait."""
    lens = [8191, 65, 1, 4097, 2048, 3000, 64, 129]
    case = Case(GLM5, lens, seed)
    base = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192)
    outs = {"again": e1_indexer_logits(*case.args(), GLM5, max_ctx=8192)}
    for pps in (1, 2, 3, 5, 37, 200, MAX_PAGES_PER_SPLIT):
        outs[f"{pps=}"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, pages_per_split=pps)
    outs["pdl off"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, pdl=False)
    outs["meta after wait"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, meta_before_wait=False)
    torch.cuda.synchronize()
    check(base, reference(case, 8192), lens, "base")
    for name, o in outs.items():
        assert_equal(OP, o, base, context=name)


@pytest.mark.gpu
@pytest.mark.parametrize("lens_kind", ["ones_263", "zeros_and_ones_300", "all_zero_but_one", "many_short_1000"])
def test_tiny_and_empty_rows(lens_kind, seed, no_pdl_override):
    """ctx = 1 everywhere, empty rows (seq_len 0) among short ones, and M = 1000 short rows (the
    work split's block scans then run over several 160-row chunks)."""
    rnd = random.Random(seed)
    lens = {"ones_263": [1] * 263,
            "zeros_and_ones_300": [rnd.choice([0, 1, 2, 63, 64, 65]) for _ in range(300)],
            "all_zero_but_one": [0] * 40 + [777] + [0] * 9,
            "many_short_1000": [rnd.randint(0, 300) for _ in range(1000)]}[lens_kind]
    case = Case(GLM5, lens, seed)
    width = max(lens) + 3
    out = poison_(torch.empty(len(lens), width, device="cuda"))
    e1_indexer_logits(*case.args(), GLM5, out=out)
    torch.cuda.synchronize()
    check(out, reference(case, width), lens, lens_kind)


@pytest.mark.gpu
def test_long_context(seed, no_pdl_override):
    """Rows of 100k tokens (1563 pages: each CTA's share spans many ring wraps) next to tiny ones."""
    lens = [100_000, 70_001, 1, 65_536]
    case = Case(GLM5, lens, seed)
    out = poison_(torch.empty(len(lens), 100_000, device="cuda"))
    e1_indexer_logits(*case.args(), GLM5, out=out)
    torch.cuda.synchronize()
    check(out, reference(case, 100_000), lens, "long context")


@pytest.mark.gpu
@pytest.mark.parametrize("max_ctx", [1, 63, 64, 65, 300, 4097])
def test_no_write_outside_the_output(max_ctx, seed, no_pdl_override):
    """The output sits inside a larger NaN-poisoned buffer: the guard bytes on both sides must stay
    untouched for widths that are no multiple of 64 and rows both shorter and longer than max_ctx."""
    lens = [max_ctx + 70, max_ctx, max(max_ctx - 1, 0), 0, 1, 5000]
    case = Case(GLM5, lens, seed, extra_cols=1)
    m, guard = len(lens), 4096
    buf = poison_(torch.empty(guard + m * max_ctx + guard, device="cuda"))
    out = buf[guard: guard + m * max_ctx].view(m, max_ctx)
    e1_indexer_logits(*case.args(), GLM5, out=out)
    torch.cuda.synchronize()
    clipped = [min(L, max_ctx) for L in lens]
    check(out, reference(case, max_ctx, lens=clipped), clipped, f"guarded {max_ctx=}")
    for name, g in (("before", buf[:guard]), ("after", buf[guard + m * max_ctx:])):
        assert bool(torch.isnan(g).all()), f"{OP}: wrote {int((~torch.isnan(g)).sum())} floats {name} the output"


@pytest.mark.gpu
def test_rows_longer_than_max_ctx_are_cut(seed):
    lens = [500, 90, 64]
    case = Case(GLM5, lens, seed)
    ref = reference(case)
    out = e1_indexer_logits(*case.args(), GLM5, max_ctx=100)
    torch.cuda.synchronize()
    check(out, ref[:, :100], [min(L, 100) for L in lens], "max_ctx < seq_len")


@pytest.mark.gpu
def test_with_make_decode_step_inputs(seed):
    """The project's standard decode-step builder (shuffled pages, current token's slot empty)."""
    from glm5_fastpath.testing.decode_step import make_decode_step
    lens = [1, 63, 64, 65, 2047, 130, 8191, 257]
    step = make_decode_step(GLM5, lens, seed=seed, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    q8, _ = quant_per_row(torch.randn(len(lens), 32, 128, generator=g, device="cuda"))
    head_w = torch.randn(len(lens), 32, generator=g, device="cuda") * 0.05
    out = e1_indexer_logits(q8, head_w, step.index_k_cache, step.seq_lens, step.block_table, GLM5)
    torch.cuda.synchronize()
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        ref = ref_e1(q8, head_w, step.index_k_cache, step.seq_lens, step.block_table, GLM5)
    finally:
        torch.set_float32_matmul_precision(prev)
    check(out, ref, lens, "make_decode_step")


@pytest.mark.gpu
def test_empty_inputs():
    case = Case(GLM5, [5, 3], 0)
    q, w, c, s, b = case.args()
    out = e1_indexer_logits(q[:0], w[:0], c, s[:0], b[:0], GLM5)
    assert tuple(out.shape) == (0, 0)
    out = e1_indexer_logits(q, w, c, torch.zeros_like(s), b, GLM5)
    assert tuple(out.shape) == (2, 0)
    out = e1_indexer_logits(q, w, c, torch.zeros_like(s), b, GLM5, max_ctx=70)
    torch.cuda.synchronize()
    assert bool(torch.isneginf(out).all())


@pytest.mark.gpu
def test_gpu_error_cases(monkeypatch):
    case = Case(GLM5, [100, 3], 0)
    q, w, c, s, b = case.args()
    buf = torch.empty(q.numel() + 16, dtype=torch.uint8, device="cuda")
    q_off = buf[1:1 + q.numel()].view(FP8).view(q.shape)
    q_off.copy_(q)
    with pytest.raises(ValueError, match="16-byte aligned"):
        e1_indexer_logits(q_off, w, c, s, b, GLM5, max_ctx=128)
    with pytest.raises(ValueError, match="one device"):
        e1_indexer_logits(q, w.cpu(), c, s, b, GLM5, max_ctx=128)
    monkeypatch.setattr(importlib.import_module("glm5_fastpath.ops._device"), "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(RuntimeError, match="Hopper"):
        e1_indexer_logits(q, w, c, s, b, GLM5, max_ctx=128)


# ---- PDL ------------------------------------------------------------------------------------------------

PDL_TEST_KERNELS = r"""
#include "common/pdl.cuh"
// Lets its dependents launch at once, spins spin_ns, then copies src -> dst (16-byte vectors).
extern "C" __global__ void e1_pdl_spin_then_copy(const uint4* src, uint4* dst, long long n_vec,
                                                 unsigned long long spin_ns) {
    glm5::ptx::griddep_launch_dependents();
    const uint64_t t0 = glm5::ptx::globaltimer_ns();
    while (glm5::ptx::globaltimer_ns() - t0 < spin_ns) {
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""
SPIN_NS = 50_000
PRODUCER_CTAS = 8  # few CTAs: E1's grid fits beside them and really starts early


def _producer():
    from glm5_fastpath.jit import KernelSpec, get_kernel
    return get_kernel(KernelSpec("e1_pdl_test_kernels", code=PDL_TEST_KERNELS, functions=("e1_pdl_spin_then_copy",)))


def _produce(producer, src: torch.Tensor, dst: torch.Tensor) -> None:
    n_vec = src.numel() * src.element_size() // 16
    assert n_vec * 16 == src.numel() * src.element_size()
    producer.launch((PRODUCER_CTAS, 1, 1), (256, 1, 1), [src, dst, ctypes.c_int64(n_vec), ctypes.c_uint64(SPIN_NS)],
                    pdl=False)


@pytest.mark.gpu
@pytest.mark.parametrize("meta_before_wait", [True, False])
@pytest.mark.parametrize("written", ["q_fp8", "head_w", "index_k_cache"])
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_e1_waits_for_the_previous_kernel_under_pdl(written, m, meta_before_wait, seed, no_pdl_override):
    """The producer spins ~50 us, then writes one input; E1, launched right after it with PDL
    (reading metadata and L2-prefetching pages before its wait, or not), must see the new values."""
    producer = _producer()
    lens = lens_for(m, seed)
    case = Case(GLM5, lens, seed)
    idx = {"q_fp8": 0, "head_w": 1, "index_k_cache": 2}[written]
    true_args = list(case.args())
    stale = true_args[idx].clone()
    stale.view(torch.uint8).zero_()  # zero q / w / cache -> all live logits 0: differs from the truth
    args = list(true_args)
    args[idx] = stale
    width = max(lens)
    ref = reference(case, width)
    e1_indexer_logits(*args, GLM5, max_ctx=width)  # compile + load outside the timed sequence
    for _ in range(3):
        stale.view(torch.uint8).zero_()
        out = poison_(torch.empty(m, width, device="cuda"))
        torch.cuda.synchronize()
        _produce(producer, true_args[idx], stale)
        e1_indexer_logits(*args, GLM5, out=out, pdl=True, meta_before_wait=meta_before_wait)
        torch.cuda.synchronize()
        check(out, ref, lens, f"PDL after a producer writing {written}, {m=}, {meta_before_wait=}")


# ---- CUDA graphs ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 16])
def test_cuda_graph_capture_and_replay_with_changing_lengths(m, seed, no_pdl_override):
    producer = _producer()
    lens0 = lens_for(m, seed)
    case = Case(GLM5, [8191] * m, seed, extra_cols=0)  # pages for the longest row everywhere
    max_ctx = case.block_table.shape[1] * PAGE
    q_src = case.q.clone()
    static_q = torch.empty_like(case.q)
    static_lens = torch.tensor(lens0, dtype=torch.int32, device="cuda")
    out = torch.empty(m, max_ctx, device="cuda")
    e1_indexer_logits(case.q, case.head_w, case.cache, static_lens, case.block_table, GLM5, out=out)  # warm up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _produce(producer, q_src, static_q)  # producer -> E1 with a PDL edge
        e1_indexer_logits(static_q, case.head_w, case.cache, static_lens, case.block_table, GLM5, out=out, pdl=True)
        func = e1_indexer_logits(static_q, case.head_w, case.cache, static_lens, case.block_table, GLM5,
                                 max_ctx=max_ctx)
    rnd = random.Random(seed)
    for step in range(4):
        lens = [rnd.randint(0 if step == 3 else 1, 8191) for _ in range(m)]
        if step == 0:
            lens[0] = 8191
        static_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        new_q, _ = quant_per_row(torch.randn(m, 32, 128, device="cuda") * (step + 1))
        q_src.copy_(new_q)
        static_q.view(torch.uint8).zero_()
        poison_(out)
        g.replay()
        torch.cuda.synchronize()
        case.q = new_q
        ref = reference(case, max_ctx, lens=lens)
        check(out, ref, lens, f"graph replay {step} {m=}")
        check(func, ref, lens, f"graph replay functional {step} {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 128])
def test_back_to_back_launches_in_one_graph(m, seed, no_pdl_override):
    """Several E1 launches chained with PDL in one CUDA graph, each on its own inputs and output
    (how the benchmark times it): a launch's early CTAs plan and L2-prefetch while the previous one
    still streams, and its writes wait for the previous one to finish. Replayed twice, outputs
    poisoned in between."""
    n = 4
    cases = [Case(GLM5, lens_for(m, seed + i), seed + i) for i in range(n)]
    width = max(max(c.lens) for c in cases)
    outs = [torch.empty(m, width, device="cuda") for _ in range(n)]
    for c, o in zip(cases, outs):  # warm up (compile, load) outside the capture
        e1_indexer_logits(*c.args(), GLM5, out=o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c, o in zip(cases, outs):
            e1_indexer_logits(*c.args(), GLM5, out=o, pdl=True)
    refs = [reference(c, width) for c in cases]
    for rep in range(2):
        for o in outs:
            poison_(o)
        g.replay()
        torch.cuda.synchronize()
        for i, (c, o, r) in enumerate(zip(cases, outs, refs)):
            check(o, r, c.lens, f"graph launch {i} of {n}, replay {rep}, {m=}")


@pytest.mark.gpu
def test_opcheck_fake_and_schema(seed):
    case = Case(GLM5, [70, 130], seed)
    args = case.args()
    # test_schema compares inputs before/after with torch.allclose, which CUDA fp8 (q_fp8) does not
    # support, so the schemas are checked directly below.
    torch.library.opcheck(torch.ops.glm5_fastpath.e1_indexer_logits.default, (*args, 192, 0, True, True),
                          test_utils=("test_faketensor",))
    out = torch.zeros(2, 192, device="cuda")
    torch.library.opcheck(torch.ops.glm5_fastpath.e1_indexer_logits_out.default, (*args, out, 0, True, True),
                          test_utils=("test_faketensor",))
    for op, want in ((torch.ops.glm5_fastpath.e1_indexer_logits.default, []),
                     (torch.ops.glm5_fastpath.e1_indexer_logits_out.default, ["logits"])):
        written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert written == want, (op, written)


@pytest.mark.gpu
def test_kernel_resources_report():
    """No local memory (spills), the parameter layout check is active, 3 CTAs of 160 threads fit per SM."""
    from glm5_fastpath.jit import get_kernel
    k = get_kernel(config_for(32, 128).spec)
    assert k.local_bytes == 0, k
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4), k.param_sizes
    assert 0 < k.num_regs <= 136 and k.max_threads >= THREADS, k
