"""Split-KV sparse MLA decode (sparse_mla_decode): the op, its reference and its algorithm.

CPU tests: ref.attn_core.sparse_mla_flat against an independent float64 formulation; the op on CPU tensors is
that reference; every validation error; the fake implementation (meta tensors, FakeTensorMode, torch.compile,
opcheck); the split heuristic; a float64 EMULATION of the kernels' exact two-stage algorithm (same 32-slot
blocks, same split partition, masked / zero-filled rows, the -inf guard of the online softmax, per-split O / l
and lse, the log-sum-exp combine) that must equal the float64 reference to 1e-10 -- the CPU evidence that the
algorithm is right -- and the same emulation with P rounded to bf16 (what the MMA sees), which bounds the GPU
error the tolerance below allows. A compile test (nvcc, no GPU) checks the kernels build without spills.

GPU tests (marked gpu; need an sm_90 GPU, nvcc and cuda-bindings): against the float64 reference over T, H, K,
-1 padding and scattered valid entries, rows from a large cache; poisoned outputs and workspace; empty rows /
splits; CUDA-graph replay and repeated calls bitwise equal to eager; PDL with a late producer.

Tolerance on the GPU: relative L2 <= 1e-2 against float64. The kernel rounds P to bf16 before the P V MMA (as
FlashMLA does; l sums the rounded P, so each output is an exact convex combination of V rows with weights off
by <= 2^-9 relative) and o to bf16 at the end; each is ~1e-3 relative on random data (the bf16-P emulation
test measures it), S and O accumulate in fp32.
"""
from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

from glm5_fastpath import ops
from glm5_fastpath.ops import sparse_mla as SM
from glm5_fastpath.ops import sparse_mla_decode
from glm5_fastpath.ref.attn_core import sparse_mla_flat
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_, rel_err

OP = "sparse_mla_decode"
BF16 = torch.bfloat16
D, DV = 576, 512
SCALE = 1.0 / math.sqrt(192 + 64)  # GLM-5's qk_head_dim
GPU_TOL = 1e-2


# ---- inputs --------------------------------------------------------------------------------------------------

def make_inputs(t: int, h: int, k: int, s: int, seed: int, device: str = "cpu", kv_2d: bool = False,
                pad_frac: float = 0.25, q_std: float = 0.7):
    """q [T, H, 576] (std q_std), kv [S, 1, 576] (or [S, 576]) random bf16; indices [T, K] of distinct random slots
    with a fraction set to -1 at scattered positions; row 0 keeps one valid slot (when T >= 2), the last row none
    (when T >= 3). With sm_scale = 1/16, q_std 0.7 gives logits of std ~1 (a flat softmax), 3.0 of std ~4.5
    (a peaky one)."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(t, h, D, generator=g) * q_std).to(BF16)
    kv = torch.randn(s, D, generator=g).to(BF16)
    if not kv_2d:
        kv = kv[:, None, :]
    idx = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(t)]).to(torch.int32) if t else \
        torch.empty(0, k, dtype=torch.int32)
    if t:
        drop = torch.rand(t, k, generator=g) < pad_frac
        idx[drop] = -1
        if t >= 2:
            keep = int(torch.randint(0, k, (1,), generator=g))
            v = int(torch.randint(0, s, (1,), generator=g))
            idx[0] = -1
            idx[0, keep] = v
        if t >= 3:
            idx[-1] = -1
    return q.to(device), kv.to(device), idx.to(device)


def reference64(q, kv, idx, sm_scale: float, d_v: int = DV):
    """Independent float64 formulation: per token, softmax over the valid slots -> (o [T, H, d_v], lse [T, H])."""
    q64 = q.detach().cpu().double()
    kv64 = kv.detach().cpu().reshape(kv.shape[0], -1).double()
    ind = idx.detach().cpu().long()
    t, h, _ = q64.shape
    o = torch.zeros(t, h, d_v, dtype=torch.float64)
    lse = torch.full((t, h), float("-inf"), dtype=torch.float64)
    for i in range(t):
        sel = ind[i][ind[i] >= 0]
        if sel.numel() == 0:
            continue
        rows = kv64[sel]
        sc = (q64[i] @ rows.T) * sm_scale
        o[i] = torch.softmax(sc, dim=-1) @ rows[:, :d_v]
        lse[i] = torch.logsumexp(sc, dim=-1)
    return o, lse


# ---- the kernels' algorithm, emulated ---------------------------------------------------------------------------

def split_blocks(k: int, num_splits: int, split: int) -> tuple[int, int]:
    """Mirror of SparseMlaSplitTile::run's partition: [blk_begin, blk_end) of 32-slot blocks for `split`."""
    nblocks = -(-k // SM.BLOCK)
    bps = -(-nblocks // num_splits)
    b0 = min(split * bps, nblocks)
    return b0, min(b0 + bps, nblocks)


def emulate_split_kv(q, kv, idx, sm_scale: float, num_splits: int, d_v: int = DV, bf16_p: bool = False):
    """Float64 emulation of stage 1 + stage 2 (csrc/attn_core/sparse_mla_decode.cuh), step for step:
    per split, blocks of 32 slots; rows with idx outside [0, S) or past K are zero-filled and masked to -inf;
    online softmax in log2 units with the running max replaced by 0 while it is -inf; O / l and lse (natural
    log) per split; combine with weights exp(lse_i - max lse). bf16_p: round P to bf16 before P V and sum the
    rounded P into l, as the kernel does. -> (o, lse, o_part, lse_part)."""
    q64 = q.detach().cpu().double()
    kv64 = kv.detach().cpu().reshape(kv.shape[0], -1).double()
    ind = idx.detach().cpu().long()
    t, h, _ = q64.shape
    s_rows, k = kv64.shape[0], ind.shape[1]
    scale2 = sm_scale * math.log2(math.e)
    o_part = torch.zeros(t, num_splits, h, d_v, dtype=torch.float64)
    lse_part = torch.full((t, num_splits, h), float("-inf"), dtype=torch.float64)
    for ti in range(t):
        for sp in range(num_splits):
            b0, b1 = split_blocks(k, num_splits, sp)
            m = torch.full((h,), float("-inf"), dtype=torch.float64)
            l = torch.zeros(h, dtype=torch.float64)
            acc = torch.zeros(h, d_v, dtype=torch.float64)
            for b in range(b0, b1):
                pos = torch.arange(b * SM.BLOCK, (b + 1) * SM.BLOCK)
                slot = torch.where(pos < k, ind[ti, pos.clamp_max(k - 1)], torch.full_like(pos, -1))
                valid = (slot >= 0) & (slot < s_rows)
                rows = torch.where(valid[:, None], kv64[slot.clamp(0, s_rows - 1)], torch.zeros(()).double())
                x = (q64[ti] @ rows.T) * scale2
                x = torch.where(valid[None, :], x, torch.full_like(x, float("-inf")))
                mnew = torch.maximum(m, x.amax(dim=1))
                muse = torch.where(torch.isneginf(mnew), torch.zeros_like(mnew), mnew)
                alpha = torch.exp2(m - muse)
                p = torch.exp2(x - muse[:, None])
                if bf16_p:
                    p = p.to(BF16).double()
                l = l * alpha + p.sum(dim=1)
                acc = acc * alpha[:, None] + p @ rows[:, :d_v]
                m = mnew
            o_part[ti, sp] = torch.where(l[:, None] > 0, acc / l.clamp_min(1e-300)[:, None], torch.zeros(()).double())
            lse_part[ti, sp] = torch.where(l > 0, (m + torch.log2(l.clamp_min(1e-300))) * math.log(2.0),
                                           torch.full_like(l, float("-inf")))
    mx = lse_part.amax(dim=1)
    mz = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
    w = torch.exp(lse_part - mz[:, None, :])  # exp(-inf) = 0 for empty splits
    wsum = w.sum(dim=1)
    num = (w[..., None] * o_part).sum(dim=1)
    o = torch.where(wsum[..., None] > 0, num / wsum.clamp_min(1e-300)[..., None], torch.zeros(()).double())
    lse = torch.where(wsum > 0, mz + torch.log(wsum.clamp_min(1e-300)), torch.full_like(wsum, float("-inf")))
    return o, lse, o_part, lse_part


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def assert_close_per_token(o: torch.Tensor, o64: torch.Tensor, tol: float, ctx: str) -> float:
    """Relative L2 per token (a token's rows alone: a one-slot row, |o| ~ 1, would otherwise hide the averaged
    rows, |o| ~ 0.03); zero rows must be exactly zero. -> the worst token's error."""
    worst = 0.0
    for i in range(o.shape[0]):
        if bool((o64[i] == 0).all()):
            assert bool((o[i].cpu() == 0).all()), f"{OP} [{ctx}]: token {i} has no valid slot but nonzero output"
            continue
        worst = max(worst, assert_close(OP, o[i], o64[i], tol=tol, context=f"{ctx} token {i}"))
    return worst


# l sums the bf16-rounded P (each p within 2^-9 relative), so lse may be off by up to log(1 + 2^-9) = 1.95e-3;
# the emulation with bf16 P reaches 1.4e-3 on the GPU tests' shapes (review, 2026-11-29)
LSE_TOL = 2.5e-3


def _lse_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over finite entries; -inf must meet -inf."""
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.equal(torch.isneginf(a), torch.isneginf(b)), "lse: -inf (empty rows) in different places"
    f = torch.isfinite(b)
    return (a[f] - b[f]).abs().max().item() if f.any() else 0.0


# ---- CPU: the reference ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, h, k, s", [(1, 16, 1, 7), (3, 16, 37, 200), (5, 32, 129, 1000), (7, 16, 300, 301),
                                        (2, 64, 2048, 3000)])
def test_reference_vs_float64(t, h, k, s, seed):
    q, kv, idx = make_inputs(t, h, k, s, seed)
    o, lse = sparse_mla_flat(q, kv, idx, SCALE, DV, return_lse=True)
    o64, lse64 = reference64(q, kv, idx, SCALE)
    assert o.dtype == BF16 and tuple(o.shape) == (t, h, DV) and lse.dtype == torch.float32
    # fp32 math, one bf16 rounding of o
    assert_close("sparse_mla_flat", o, o64, tol=4e-3, context=f"{t=} {h=} {k=}")
    assert _lse_err(lse, lse64) < 1e-4
    assert sparse_mla_flat(q, kv, idx, SCALE, DV).equal(o)  # return_lse=False: o alone


def test_reference_special_rows(seed):
    q, kv, idx = make_inputs(4, 16, 50, 400, seed)
    idx[1] = -1
    idx[1, 17] = 5  # one valid slot, not at the front: o = that row's V exactly (rounded to bf16)
    idx[2] = -1  # empty row
    o, lse = sparse_mla_flat(q, kv[:, 0], idx, SCALE, DV, return_lse=True)  # [S, D] kv
    assert torch.equal(o[1], kv[5, 0, :DV].expand(16, DV))
    assert torch.equal(o[2], torch.zeros(16, DV, dtype=BF16)) and bool(torch.isneginf(lse[2]).all())
    assert torch.isfinite(lse[[0, 1]]).all() and bool(torch.isneginf(lse[3]).all())  # make_inputs: last row empty
    expect = (q[1].double() @ kv[5, 0].double()) * SCALE  # one slot: lse = its scaled score
    assert (lse[1].double() - expect).abs().max().item() < 1e-3


# ---- CPU: the op is the reference on CPU tensors -----------------------------------------------------------------

@pytest.mark.parametrize("t, h, k", [(1, 16, 1), (3, 32, 77), (9, 64, 2048), (0, 16, 5)])
def test_cpu_op_is_the_reference(t, h, k, seed):
    q, kv, idx = make_inputs(t, h, k, 2500, seed)
    o, lse = sparse_mla_decode(q, kv, idx, SCALE, DV, return_lse=True)
    ro, rl = sparse_mla_flat(q, kv, idx, SCALE, DV, return_lse=True)
    assert_equal(OP, o, ro, context="cpu o")
    assert torch.equal(lse, rl) and tuple(lse.shape) == (t, h)
    o2 = sparse_mla_decode(q, kv, idx, SCALE)  # defaults: d_v=512, o alone
    assert_equal(OP, o2, ro, context="cpu defaults")
    o3, lse3 = torch.ops.glm5_fastpath.sparse_mla_decode(q, kv, idx, SCALE, DV, False, 3 if k else None)
    assert_equal(OP, o3, ro, context="torch.ops on CPU")


def test_cpu_empty_batch():
    q = torch.empty(0, 64, D, dtype=BF16)
    kv = torch.zeros(10, 1, D, dtype=BF16)
    o = sparse_mla_decode(q, kv, torch.empty(0, 2048, dtype=torch.int32), SCALE)
    assert tuple(o.shape) == (0, 64, DV) and o.dtype == BF16


def test_cpu_strided_inputs(seed):
    q, kv, idx = make_inputs(4, 16, 40, 300, seed)
    qbuf = torch.zeros(4, 24, D + 64, dtype=BF16)
    qbuf[:, 3:19, 8:8 + D] = q
    kvbuf = torch.zeros(300, D + 128, dtype=BF16)
    kvbuf[:, 64:64 + D] = kv[:, 0]
    ibuf = torch.full((4, 100), 7, dtype=torch.int32)
    ibuf[:, 10:50] = idx
    qv, kvv, iv = qbuf[:, 3:19, 8:8 + D], kvbuf[:, 64:64 + D], ibuf[:, 10:50]
    assert qv.stride() == (24 * (D + 64), D + 64, 1) and kvv.stride() == (D + 128, 1)
    assert_equal(OP, sparse_mla_decode(qv, kvv, iv, SCALE), sparse_mla_flat(q, kv, idx, SCALE, DV), context="strided")


# ---- CPU: the algorithm (float64 emulation of both kernels) ---------------------------------------------------------

@pytest.mark.parametrize("t, h, k, s, splits", [
    (1, 16, 2048, 5000, None),   # T = 1: 16 splits of four blocks
    (1, 16, 2048, 5000, 64),     # 64 splits of one block
    (3, 16, 2048, 5000, None),
    (2, 32, 100, 700, None),     # K not a multiple of 32: a partial last block
    (5, 16, 333, 2000, 7),       # uneven split partition
    (4, 16, 70, 500, 64),        # more splits than blocks: empty splits
    (3, 16, 1, 20, None),        # K = 1
    (7, 16, 129, 900, 2),
])
def test_split_algorithm_emulation_matches_float64(t, h, k, s, splits, seed):
    q, kv, idx = make_inputs(t, h, k, s, seed)
    if splits is None:
        splits = SM.split_plan(t, h, k, 132).num_splits
    o, lse, o_part, lse_part = emulate_split_kv(q, kv, idx, SCALE, splits)
    o64, lse64 = reference64(q, kv, idx, SCALE)
    assert _max_abs(o, o64) < 1e-10, _max_abs(o, o64)
    assert _lse_err(lse, lse64) < 1e-10
    if t >= 3:  # the empty last row: zeros, lse -inf, and every split of it empty
        assert bool((o[-1] == 0).all()) and bool(torch.isneginf(lse[-1]).all())
        assert bool(torch.isneginf(lse_part[-1]).all()) and bool((o_part[-1] == 0).all())
    assert torch.isfinite(o_part).all() and not torch.isnan(lse_part).any()


def test_emulation_all_invalid_chunks(seed):
    """Valid slots only in the first and the last block: every split in between sees only masked rows (its running
    max stays -inf; p must be 0, not NaN), writes lse = -inf, and the combine skips it."""
    q, kv, _ = make_inputs(2, 16, 2048, 4000, seed)
    idx = torch.stack([torch.randperm(4000)[:2048] for _ in range(2)]).to(torch.int32)
    idx[:, 32:-32] = -1
    idx[1, :32] = -1  # token 1: valid slots only in the last block
    o, lse, o_part, lse_part = emulate_split_kv(q, kv, idx, SCALE, 64)
    assert bool(torch.isneginf(lse_part[:, 1:63]).all()) and bool((o_part[:, 1:63] == 0).all())
    assert bool(torch.isneginf(lse_part[1, 0]).all()) and torch.isfinite(lse_part[:, 63]).all()
    o64, lse64 = reference64(q, kv, idx, SCALE)
    assert _max_abs(o, o64) < 1e-10 and _lse_err(lse, lse64) < 1e-10
    # a block whose first rows are valid and the rest masked, inside one split
    o2, _, _, _ = emulate_split_kv(q, kv, idx, SCALE, 1)
    assert _max_abs(o2, o64) < 1e-10


def test_emulation_slots_outside_the_cache_are_unused(seed):
    """The kernel treats any entry outside [0, S) as unused (memory safety): equal to replacing it with -1."""
    q, kv, idx = make_inputs(3, 16, 90, 300, seed)
    bad = idx.clone()
    bad[0, 3], bad[1, 50], bad[2, 89] = 300, 10**6, -7
    o, _, _, _ = emulate_split_kv(q, kv, bad, SCALE, 2)
    clean = bad.clone()
    clean[(clean >= 300) | (clean < 0)] = -1
    o64, _ = reference64(q, kv, clean, SCALE)
    assert _max_abs(o, o64) < 1e-10


@pytest.mark.parametrize("t, h, k, splits", [(2, 64, 2048, None), (3, 16, 100, 2), (2, 16, 2048, 1)])
def test_bf16_p_rounding_is_within_the_gpu_tolerance(t, h, k, splits, seed):
    """The kernel's one deliberate deviation from float64: P rounded to bf16 for the MMA (l sums the rounded P),
    then o rounded to bf16. On the GPU tests' data that costs ~1e-3 relative L2, well inside GPU_TOL."""
    q, kv, idx = make_inputs(t, h, k, 10000, seed)
    splits = splits or SM.split_plan(t, h, k, 132).num_splits
    for q_std in (0.7, 3.0):
        qq = (q.float() * (q_std / 0.7)).to(BF16)
        o, lse, _, _ = emulate_split_kv(qq, kv, idx, SCALE, splits, bf16_p=True)
        o64, lse64 = reference64(qq, kv, idx, SCALE)
        e = assert_close_per_token(o.to(BF16), o64, GPU_TOL / 3, f"bf16-P emulation {q_std=}")
        assert _lse_err(lse, lse64) < LSE_TOL, f"bf16-P emulation lse {q_std=}"  # the GPU tests' lse bound
        assert e > 1e-4  # the rounding is really there (the test would not see a broken emulation otherwise)


def test_split_partition_covers_every_block_once():
    """Mirror of the kernel's partition: for any K and num_splits, each 32-slot block belongs to exactly one split,
    the non-empty splits come first and are contiguous."""
    for k in (1, 31, 32, 33, 100, 1000, 2047, 2048):
        nblocks = -(-k // 32)
        for ns in range(1, SM.MAX_SPLITS + 1):
            seen = [0] * nblocks
            prev_end = 0
            for sp in range(ns):
                b0, b1 = split_blocks(k, ns, sp)
                assert b0 == prev_end or b0 == b1 == nblocks
                for b in range(b0, b1):
                    seen[b] += 1
                prev_end = max(prev_end, b1)
            assert seen == [1] * nblocks, (k, ns)


# ---- CPU: a lane-level mirror of the split kernel's indexing ------------------------------------------------------

class _LaneMirror:
    """One stage-1 CTA of csrc/attn_core/sparse_mla_decode.cuh replayed lane by lane: the same shared-memory
    byte layout and copy mapping, the same per-lane ldmatrix offsets, mma.sync m16n8k16 / ldmatrix fragments as
    the PTX ISA defines them (lane = 4g + t; A: a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
    a3 = A[g+8][2t+8..]; B: b0 = B[2t..][g], b1 = B[2t+8..][g]; C: c0/c1 = C[g][2t, 2t+1], c2/c3 = C[g+8][..];
    ldmatrix: matrix i's row addresses from lanes 8i..8i+7, lane (g, t) gets M[g][2t..2t+1], .trans
    M[2t][g], M[2t+1][g]). Arithmetic in float64 except P, rounded to bf16 as in the kernel. It checks the
    offsets (a slip there is what a CPU machine cannot otherwise see), not the hardware."""

    ROW = SM.D_QK * 2 + 16
    STAGE = SM.BLOCK * ROW
    QOFF = 2 * STAGE

    def __init__(self, q, kv, idx, sm_scale, num_splits):
        self.q = q.view(torch.int16).numpy().view("uint16")
        self.kv = kv.reshape(kv.shape[0], -1).view(torch.int16).numpy().view("uint16")
        self.idx = idx.numpy()
        self.scale2 = sm_scale * math.log2(math.e)
        self.ns = num_splits
        import numpy as np
        self.np = np
        lanes = np.arange(32)
        self.g, self.t = lanes // 4, lanes % 4

    def bf(self, u16):
        return (self.np.asarray(u16, dtype=self.np.uint32) << 16).view(self.np.float32).astype(self.np.float64)

    def ldsm(self, addr, trans=False):
        np, g, t = self.np, self.g, self.t
        out = np.zeros((32, 4, 2))
        for i in range(4):
            rows = addr[8 * i: 8 * i + 8]
            for e in range(2):
                a = rows[2 * t + e] + 2 * g if trans else rows[g] + 4 * t + 2 * e
                out[:, i, e] = self.bf(self.smem[a // 2])
        return out

    def mma(self, c, a, b):
        np, g, t = self.np, self.g, self.t
        am, bm = np.zeros((16, 16)), np.zeros((16, 8))
        for e in range(2):
            am[g, 2 * t + e], am[g + 8, 2 * t + e] = a[:, 0, e], a[:, 1, e]
            am[g, 2 * t + 8 + e], am[g + 8, 2 * t + 8 + e] = a[:, 2, e], a[:, 3, e]
            bm[2 * t + e, g], bm[2 * t + 8 + e, g] = b[:, 0, e], b[:, 1, e]
        d = am @ bm
        c[:, 0] += d[g, 2 * t]
        c[:, 1] += d[g, 2 * t + 1]
        c[:, 2] += d[g + 8, 2 * t]
        c[:, 3] += d[g + 8, 2 * t + 1]

    def copy16(self, dst_byte, src_u16):
        self.smem[dst_byte // 2: dst_byte // 2 + 8] = src_u16

    def run(self, t_tok, split, hblk):
        np, g, tq = self.np, self.g, self.t
        k, s_rows = self.idx.shape[1], self.kv.shape[0]
        self.smem = np.full(SM.SPLIT_SMEM // 2, 0x7FC0, dtype=np.uint16)  # NaN: a row never written shows up
        red = np.full(4 * 16 * 40, np.nan)
        bias = np.full(2 * SM.BLOCK, np.nan)
        nblocks = -(-k // 32)
        bps = -(-nblocks // self.ns)
        b0 = min(split * bps, nblocks)
        b1 = min(b0 + bps, nblocks)
        h0 = hblk * 16
        for tid in range(128):  # Q: thread -> row tid / 8, pieces tid % 8 + 8i
            r, part = tid // 8, tid % 8
            for i in range(9):
                c = part + 8 * i
                self.copy16(self.QOFF + r * self.ROW + c * 16, self.q[t_tok, h0 + r, c * 8: c * 8 + 8])

        def issue(blk, st):  # thread -> row tid / 4, pieces tid % 4 + 4i; invalid rows zero-filled
            for tid in range(128):
                row, part = tid // 4, tid % 4
                pos = blk * 32 + row
                slot = int(self.idx[t_tok, pos]) if pos < k else -1
                valid = 0 <= slot < s_rows
                for i in range(18):
                    c = part + 4 * i
                    src = self.kv[slot, c * 8: c * 8 + 8] if valid else np.zeros(8, np.uint16)
                    self.copy16(st * self.STAGE + row * self.ROW + c * 16, src)
                if part == 0:
                    bias[st * 32 + row] = 0.0 if valid else -np.inf

        lane = np.arange(32)
        a_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * self.ROW + 16 * (lane >> 4)
        k_off = (8 * (lane >> 4) + (lane & 7)) * self.ROW + 16 * ((lane >> 3) & 1)
        v_off = [((lane & 7) + 8 * ((lane >> 3) & 1)) * self.ROW + 16 * (lane >> 4) + w * 128 * 2 for w in range(4)]
        qf = [[self.ldsm(self.QOFF + a_off + w * 9 * 32 + kk * 32) for kk in range(9)] for w in range(4)]
        o = [np.zeros((16, 32, 4)) for _ in range(4)]
        m = [np.full((32, 2), -np.inf) for _ in range(4)]
        lsum = [np.zeros((32, 2)) for _ in range(4)]
        if b0 < b1:
            issue(b0, 0)
        for blk in range(b0, b1):
            st = (blk - b0) & 1
            if blk + 1 < b1:
                issue(blk + 1, st ^ 1)
            for w in range(4):  # partial S over dims [144w, 144w + 144)
                sacc = np.zeros((4, 32, 4))
                kbase = st * self.STAGE + k_off + w * 9 * 32
                for kk in range(9):
                    b01, b23 = self.ldsm(kbase + kk * 32), self.ldsm(kbase + 16 * self.ROW + kk * 32)
                    for j, (bb, hi) in enumerate(((b01, 0), (b01, 2), (b23, 0), (b23, 2))):
                        self.mma(sacc[j], qf[w][kk], bb[:, hi: hi + 2])
                base = w * 16 * 40
                for j in range(4):
                    for e in range(2):
                        red[base + g * 40 + 8 * j + 2 * tq + e] = sacc[j][:, e]
                        red[base + (g + 8) * 40 + 8 * j + 2 * tq + e] = sacc[j][:, 2 + e]
            for w in range(4):
                x = np.zeros((4, 32, 4))
                for j in range(4):
                    lo = sum(red[ww * 640 + g * 40 + 8 * j + 2 * tq + np.arange(2)[:, None]] for ww in range(4))
                    hi = sum(red[ww * 640 + (g + 8) * 40 + 8 * j + 2 * tq + np.arange(2)[:, None]] for ww in range(4))
                    bx, by = bias[st * 32 + 8 * j + 2 * tq], bias[st * 32 + 8 * j + 2 * tq + 1]
                    x[j][:, 0] = np.where(bx == 0, lo[0] * self.scale2, -np.inf)
                    x[j][:, 1] = np.where(by == 0, lo[1] * self.scale2, -np.inf)
                    x[j][:, 2] = np.where(bx == 0, hi[0] * self.scale2, -np.inf)
                    x[j][:, 3] = np.where(by == 0, hi[1] * self.scale2, -np.inf)
                alpha, muse = np.zeros((32, 2)), np.zeros((32, 2))
                for r in range(2):
                    mx = x[:, :, 2 * r: 2 * r + 2].max(axis=(0, 2))
                    mx = np.repeat(mx.reshape(8, 4).max(axis=1), 4)  # shfl_xor 1, 2: the quad's max
                    mnew = np.maximum(m[w][:, r], mx)
                    muse[:, r] = np.where(mnew == -np.inf, 0.0, mnew)
                    alpha[:, r] = np.exp2(m[w][:, r] - muse[:, r])
                    m[w][:, r] = mnew
                pk = np.zeros((4, 32, 2, 2))  # [j][lane][r][e]
                for j in range(4):
                    for r in range(2):
                        for e in range(2):
                            p = torch.from_numpy(np.exp2(x[j][:, 2 * r + e] - muse[:, r])).float().to(BF16).double()
                            pk[j][:, r, e] = p.numpy()
                lsum[w] = lsum[w] * alpha + pk.sum(axis=(0, 3))
                o[w][:, :, 0:2] *= alpha[None, :, 0:1]
                o[w][:, :, 2:4] *= alpha[None, :, 1:2]
                vbase = st * self.STAGE + v_off[w]
                for kk in range(2):
                    a = np.stack([pk[2 * kk][:, 0], pk[2 * kk][:, 1], pk[2 * kk + 1][:, 0], pk[2 * kk + 1][:, 1]], axis=1)
                    for pp in range(8):
                        b = self.ldsm(vbase + kk * 16 * self.ROW + pp * 32, trans=True)
                        self.mma(o[w][2 * pp], a, b[:, 0:2])
                        self.mma(o[w][2 * pp + 1], a, b[:, 2:4])
        out = np.full((16, SM.D_V), np.nan)
        lse = np.full(16, np.nan)
        for w in range(4):
            lq = lsum[w].reshape(8, 4, 2).sum(axis=1).repeat(4, axis=0)  # quad sum
            inv = np.where(lq > 0, 1.0 / np.where(lq > 0, lq, 1.0), 0.0)
            for n in range(16):
                for e in range(2):
                    out[g, w * 128 + 8 * n + 2 * tq + e] = o[w][n][:, e] * inv[:, 0]
                    out[g + 8, w * 128 + 8 * n + 2 * tq + e] = o[w][n][:, 2 + e] * inv[:, 1]
            if w == 0:
                sel = tq == 0
                for r in range(2):
                    val = np.where(lq[:, r] > 0, (m[0][:, r] + np.log2(np.where(lq[:, r] > 0, lq[:, r], 1.0))) * math.log(2.0), -np.inf)
                    lse[g[sel] + 8 * r] = val[sel]
        return torch.from_numpy(out), torch.from_numpy(lse)


@pytest.mark.parametrize("t, h, k, splits", [(2, 32, 70, 2), (1, 16, 33, 1), (3, 16, 100, 64)])
def test_lane_level_mirror_of_the_split_kernel(t, h, k, splits, seed):
    """Every CTA of stage 1, replayed lane by lane (_LaneMirror), gives the algorithm's partials: the fragment
    offsets put each product where the math says. Shapes: a partial last block, both stages, an empty split, the
    second head block, an empty row, a one-slot row."""
    q, kv, idx = make_inputs(t, h, k, 300, seed, q_std=3.0)
    mirror = _LaneMirror(q, kv, idx, SCALE, splits)
    _, _, o_part, lse_part = emulate_split_kv(q, kv, idx, SCALE, splits, bf16_p=True)
    for ti in range(t):
        for sp in range(min(splits, 3)):
            for hb in range(h // 16):
                o, lse = mirror.run(ti, sp, hb)
                want_o, want_lse = o_part[ti, sp, 16 * hb: 16 * hb + 16], lse_part[ti, sp, 16 * hb: 16 * hb + 16]
                assert not torch.isnan(o).any() and not torch.isnan(lse).any()
                assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
                assert _max_abs(o, want_o) <= 1e-6 * max(1.0, want_o.abs().max().item()), (ti, sp, hb)
                f = torch.isfinite(want_lse)
                assert _max_abs(lse[f], want_lse[f]) < 1e-9, (ti, sp, hb)


def test_combine_mapping_covers_every_column_and_split_once():
    """Mirror of SparseMlaCombineTile: thread (grp = tid / 64, lane = tid % 64) of CTA part z sums splits
    i = grp (mod 4) at columns 256 z + 4 lane + 0..3: every (split, column) exactly once."""
    for ns in (1, 2, 5, 64):
        seen = torch.zeros(ns, SM.D_V, dtype=torch.int32)
        for z in range(SM.COMBINE_PARTS):
            for tid in range(SM.COMBINE_THREADS):
                grp, lane = tid // 64, tid % 64
                for i in range(grp, ns, 4):
                    seen[i, 256 * z + 4 * lane: 256 * z + 4 * lane + 4] += 1
        assert bool((seen == 1).all())


def test_wgmma_cluster_choice():
    auto = [SM.wgmma_cluster(n, "auto") for n in (1, 2, 3, 4, 6, 8, 16, 32, 64)]
    assert auto == [1, 2, 1, 4, 2, 8, 8, 8, 8]
    assert [SM.wgmma_cluster(n, "pair") for n in (1, 2, 3, 4, 8)] == [1, 2, 1, 1, 1]
    assert SM.wgmma_cluster(16, "off") == 1 and SM.WGMMA_CLUSTER == "pair"
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    assert "static constexpr int kObufStride = kDv + 8;" in text and "ptx::cluster_sync();  // (3)" in text


def test_warp_combine_mapping_covers_every_head_and_column_once():
    """Mirror of glm5_sparse_mla_combine_warp's launch: CTA y, warp w -> unit 8 y + w = (head, slice); lane -> columns
    128 slice + 4 lane + 0..3: every (head, column) of a token exactly once, for H = 16 / 64 / 128."""
    for h in (16, 64, 128):
        seen = torch.zeros(h, SM.D_V, dtype=torch.int32)
        for y in range(h * 4 // SM.COMBINE_WARP_UNITS_PER_CTA):
            for w in range(SM.COMBINE_WARP_THREADS // 32):
                unit = y * SM.COMBINE_WARP_UNITS_PER_CTA + w
                head, sl = unit // 4, unit % 4
                for lane in range(32):
                    seen[head, 128 * sl + 4 * lane: 128 * sl + 4 * lane + 4] += 1
        assert bool((seen == 1).all())
    assert SM.COMBINE == "warp" and SM.COMBINE in SM.COMBINE_CHOICES


# ---- CPU: the split heuristic ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, want", [(1, (16, 4)), (2, (16, 4)), (4, (16, 4)), (8, (8, 8)), (16, (4, 16)),
                                     (64, (1, 64))])
def test_split_plan_glm5_on_132_sms(t, want):
    plan = SM.split_plan(t, 64, 2048, 132)
    assert tuple(plan) == want
    ctas = t * 4 * plan.num_splits
    # one wave of 2 per SM (264); fewer only where the 4-block minimum (T <= 2) caps it
    assert ctas <= 264 and (ctas >= 256 or plan.blocks_per_split == SM.MIN_BLOCKS_PER_SPLIT)


def test_split_plan_invariants():
    for sms in (1, 78, 114, 132):
        for h in (16, 32, 64, 128):
            for k in (1, 5, 32, 33, 500, 2048):
                nblocks = -(-k // 32)
                for t in (1, 2, 3, 7, 16, 64, 300):
                    ns, bps = SM.split_plan(t, h, k, sms)
                    assert 1 <= ns <= min(nblocks, SM.MAX_SPLITS)
                    assert (ns - 1) * bps < nblocks <= ns * bps  # no empty split
                    assert split_blocks(k, ns, ns - 1)[1] == nblocks and split_blocks(k, ns, 0)[1] - split_blocks(k, ns, 0)[0] == bps
                    first = max(1, min(-(-nblocks // SM.MIN_BLOCKS_PER_SPLIT), 2 * sms // (t * h // 16)))
                    assert -(-first // 2) <= ns <= first  # evening-out at most halves the target
    assert SM.split_plan(1000, 64, 2048, 132).num_splits == 1  # plenty of CTAs: no split, no combine traffic


# ---- CPU: validation -----------------------------------------------------------------------------------------------------

def _ok(t=2, h=16, k=8, s=20):
    return (torch.zeros(t, h, D, dtype=BF16), torch.zeros(s, 1, D, dtype=BF16),
            torch.zeros(t, k, dtype=torch.int32))


def _bad(i, v):
    a = list(_ok())
    a[i] = v
    return a


@pytest.mark.parametrize("args, kw, match", [
    (_bad(0, torch.zeros(2, 16, D)), {}, "q must be torch.bfloat16"),
    (_bad(1, torch.zeros(20, 1, D, dtype=torch.float16)), {}, "kv must be torch.bfloat16"),
    (_bad(2, torch.zeros(2, 8, dtype=torch.int64)), {}, "indices must be torch.int32"),
    (_bad(0, torch.zeros(2, 16 * D, dtype=BF16)), {}, r"q must be 3-D \[T, H, D\]"),
    (_bad(1, torch.zeros(20, 2, D, dtype=BF16)), {}, "one KV head"),
    (_bad(1, torch.zeros(20, D, 1, dtype=BF16)), {}, "one KV head"),
    (_bad(1, torch.zeros(D, dtype=BF16)), {}, r"kv must be \[S, 1, D\] or \[S, D\]"),
    (_bad(2, torch.zeros(2, 8, 1, dtype=torch.int32)), {}, r"indices must be 2-D \[T, K\]"),
    (_bad(0, torch.zeros(2, 24, D, dtype=BF16)), {}, "H=24 heads is not supported: H must be a positive multiple of 16"),
    (_bad(0, torch.zeros(2, 0, D, dtype=BF16)), {}, "H=0 heads"),
    (_bad(0, torch.zeros(2, 16, 512 + 32, dtype=BF16)), {}, "D=544, d_v=512 is not supported"),
    (_ok(), {"d_v": 448}, "D=576, d_v=448 is not supported"),
    (_ok(), {"d_v": 512.0}, "d_v must be an int"),
    (_bad(1, torch.zeros(20, 1, 640, dtype=BF16)), {}, "kv rows have 640 columns but q has D=576"),
    (_bad(2, torch.zeros(3, 8, dtype=torch.int32)), {}, "indices has 3 rows for T=2"),
    (_bad(2, torch.zeros(2, 2049, dtype=torch.int32)), {}, "K=2049 index columns is not supported"),
    (_bad(2, torch.zeros(2, 0, dtype=torch.int32)), {}, "K=0 index columns is not supported"),
    (_bad(1, torch.zeros(0, 1, D, dtype=BF16)), {}, "kv must have at least one row"),
    (_bad(0, torch.zeros(2, 16, 2 * D, dtype=BF16)[:, :, ::2]), {}, "q must have a contiguous last dim"),
    (_bad(1, torch.zeros(20, 2 * D, dtype=BF16)[:, ::2]), {}, "kv must have a contiguous last dim"),
    (_bad(2, torch.zeros(2, 16, dtype=torch.int32)[:, ::2]), {}, "indices must have a contiguous last dim"),
    (_bad(1, torch.zeros(20, 1, D, dtype=BF16, device="meta")), {}, "must be on one device"),
    (_bad(0, [[0.0]]), {}, "q must be a torch.Tensor"),
    (_ok(), {"num_splits": 0}, "num_splits must be None"),
    (_ok(), {"num_splits": 65}, r"int in 1\.\.64"),
    (_ok(), {"num_splits": True}, "num_splits must be None"),
    (_ok(), {"pdl": 1}, "pdl must be a bool"),
    (_ok(), {"return_lse": None}, "return_lse must be a bool"),
])
def test_bad_inputs_raise_naming_the_op(args, kw, match):
    with pytest.raises(SM.SparseMlaInputError, match=match) as ei:
        sparse_mla_decode(*args, SCALE, **kw)
    assert isinstance(ei.value, ValueError) and str(ei.value).startswith("glm5_fastpath.sparse_mla_decode: ")


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1", None, True])
def test_bad_sm_scale(scale):
    with pytest.raises(SM.SparseMlaInputError, match="sm_scale must be a finite float"):
        sparse_mla_decode(*_ok(), scale)


def test_bad_inputs_through_torch_ops():
    q, kv, idx = _ok()
    with pytest.raises(ValueError, match="sparse_mla_decode: q must be torch.bfloat16"):
        torch.ops.glm5_fastpath.sparse_mla_decode(q.float(), kv, idx, SCALE, DV, True, None)
    with pytest.raises(ValueError, match="sparse_mla_decode: H=8 heads"):
        torch.ops.glm5_fastpath.sparse_mla_decode(torch.empty(2, 8, D, dtype=BF16, device="meta"),
                                                  kv.to("meta"), idx.to("meta"), SCALE, DV, True, None)


def test_launch_refuses_non_cuda_tensors():
    q, kv, idx = _ok()
    with pytest.raises(ValueError, match="sparse_mla_decode: tensors must be on a CUDA device"):
        SM._launch(q, kv, idx, SCALE, torch.empty(2, 16, DV, dtype=BF16), torch.empty(2, 16), True, None)


# ---- CPU: fake implementation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, h, k", [(0, 16, 1), (5, 64, 2048), (300, 32, 7)])
def test_fake_shapes_meta(t, h, k):
    q = torch.empty(t, h, D, dtype=BF16, device="meta")
    kv = torch.empty(1000, 1, D, dtype=BF16, device="meta")
    idx = torch.empty(t, k, dtype=torch.int32, device="meta")
    o, lse = torch.ops.glm5_fastpath.sparse_mla_decode(q, kv, idx, SCALE, DV, True, None)
    assert (tuple(o.shape), o.dtype, o.device.type) == ((t, h, DV), BF16, "meta") and o.is_contiguous()
    assert (tuple(lse.shape), lse.dtype) == ((t, h), torch.float32) and lse.is_contiguous()
    o2 = sparse_mla_decode(q, kv[:, 0], idx, SCALE)
    assert tuple(o2.shape) == (t, h, DV) and o2.device.type == "meta"


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(7, 64, D, dtype=BF16)
        kv = torch.empty(10000, 1, D, dtype=BF16)
        idx = torch.empty(7, 2048, dtype=torch.int32)
        o = sparse_mla_decode(q, kv, idx, SCALE)
        assert tuple(o.shape) == (7, 64, DV) and o.dtype == BF16 and o.stride() == (64 * DV, DV, 1)
        o, lse = sparse_mla_decode(q, kv, idx, SCALE, return_lse=True, num_splits=5)
        assert tuple(lse.shape) == (7, 64) and lse.dtype == torch.float32
        with pytest.raises(SM.SparseMlaInputError, match="indices has 6 rows"):
            sparse_mla_decode(q, kv, idx[:6], SCALE)


def test_fake_under_torch_compile_meta():
    def f(q, kv, idx):
        o, lse = sparse_mla_decode(q, kv, idx, SCALE, return_lse=True)
        return o, lse

    q = torch.empty(3, 32, D, dtype=BF16, device="meta")
    kv = torch.empty(50, D, dtype=BF16, device="meta")
    idx = torch.empty(3, 40, dtype=torch.int32, device="meta")
    outs = torch.compile(f, backend="aot_eager", fullgraph=True)(q, kv, idx)
    assert [tuple(o.shape) for o in outs] == [(3, 32, DV), (3, 32)]


def test_opcheck_cpu(seed):
    q, kv, idx = make_inputs(3, 16, 45, 100, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.sparse_mla_decode.default, (q, kv, idx, SCALE, DV, True, None),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration",
                                      "test_aot_dispatch_dynamic"))


# ---- CPU: registration, compile -----------------------------------------------------------------------------------------

def test_registered_in_ops_package():
    assert ops.sparse_mla_decode is sparse_mla_decode and "sparse_mla_decode" in ops.__all__
    assert SM in ops._MODULES and SM.SPEC in ops.compile_check_specs()
    assert SM.compile_check_specs() == [SM.SPEC, SM.spec_for(5), SM.wgmma_spec(4)]
    assert SM.SPEC.source == "attn_core/sparse_mla_decode.cu" and SM.wgmma_spec(3) is SM.SPEC
    assert SM.wgmma_spec(4).defines == (("GLM5_SPARSE_MLA_WGMMA_STAGES", "4"),)
    assert SM.SPEC.functions == (SM.FUNCTION_SPLIT, SM.FUNCTION_COMBINE, SM.FUNCTION_SPLIT_WGMMA,
                                 SM.FUNCTION_COMBINE_WARP, SM.FUNCTION_SPLIT_PP)
    assert SM.SPEC.defines == ()
    assert SM.spec_for(2) is SM.SPEC  # the default build keeps its cache entry
    s5 = SM.spec_for(5)
    assert s5.name == "glm5_sparse_mla_decode_s5" and s5.defines == (("GLM5_SPARSE_MLA_STAGES", "5"),)
    assert s5.functions == (SM.FUNCTION_SPLIT, SM.FUNCTION_COMBINE, SM.FUNCTION_COMBINE_WARP)
    assert s5.source == SM.SPEC.source
    assert SM.SPLIT_SMEM == SM.split_smem(2) == 93696 and SM.ctas_per_sm(2) == 2  # 2 CTAs per SM
    assert SM.split_smem(5) == 5 * 37376 + 18688 + 5 * 128 <= 227 * 1024 and SM.ctas_per_sm(5) == 1


def test_stages_argument_is_validated():
    q, kv, idx = make_inputs(2, 16, 40, 100, 0)
    for bad in (3, 0, True, "5", 2.0):
        with pytest.raises(SM.SparseMlaInputError, match="stages must be None"):
            sparse_mla_decode(q, kv, idx, SCALE, stages=bad)
    for st in (None, 2, 5):  # CPU: the reference, whatever the build
        assert sparse_mla_decode(q, kv, idx, SCALE, stages=st).shape == (2, 16, DV)
    with pytest.raises(SM.SparseMlaInputError, match="precompile: stages must be in"):
        SM.precompile("cpu", stages=(4,))  # checked before any device work


def test_split_plan_for_the_deep_ring():
    """One CTA per SM: the plan targets one wave (T * H/16 * splits >= SMs), still >= 4 blocks per split."""
    got = {t: tuple(SM.split_plan(t, 64, 2048, 132, per_sm=SM.ctas_per_sm(5))) for t in (1, 2, 4, 8, 16)}
    assert got == {1: (16, 4), 2: (16, 4), 4: (8, 8), 8: (4, 16), 16: (2, 32)}
    for t, (ns, _) in got.items():
        assert t * 4 * ns <= 132  # one wave


def test_constants_match_the_kernel_header():
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    for name, value in (("kHeads", SM.HEAD_BLOCK), ("kBlock", SM.BLOCK), ("kMaxTopk", SM.MAX_TOPK),
                        ("kDv", SM.D_V), ("kDqk", SM.D_QK), ("kWarps", SM.SPLIT_THREADS // 32)):
        assert f"static constexpr int {name} = {value};" in text, name
    assert "// 93696" in text and "kGroups = 4" in text and "kLanes = 64" in text
    # the expressions _LaneMirror replays (its offsets are these, with kRowBytes = ROW)
    for expr in ("a_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + 16 * (lane >> 4);",
                 "k_off = (8 * (lane >> 4) + (lane & 7)) * kRowBytes + 16 * ((lane >> 3) & 1);",
                 "v_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + 16 * (lane >> 4) + warp * kDvPerWarp * 2;",
                 "ldmatrix_x4(b01, kbase + kk * 32);", "ldmatrix_x4(b23, kbase + 16 * kRowBytes + kk * 32);",
                 "warp * kKStepsPerWarp * 32", "ptx::ldmatrix_x4_trans(b, vbase + kk * 16 * kRowBytes + pp * 32);",
                 "a0 = pk[2 * kk][0], a1 = pk[2 * kk][1], a2 = pk[2 * kk + 1][0], a3 = pk[2 * kk + 1][1];",
                 "mine + g * kRedStride + 8 * j + 2 * tq", "(mine + (g + 8) * kRedStride + 8 * j + 2 * tq)",
                 "out0 = p.o_part + (row0 + g) * kDv + warp * kDvPerWarp + 2 * tq;"):
        assert expr in text, expr
    assert SM.COMBINE_THREADS == 4 * 64 and SM.COMBINE_PARTS * 256 == SM.D_V


@pytest.mark.parametrize("stages", SM.STAGE_CHOICES)
def test_compile_spec_without_spills_or_warnings(nvcc_jit, stages):
    ck = nvcc_jit(SM.spec_for(stages))
    res = ck.resources()
    for fn in (SM.FUNCTION_SPLIT, SM.FUNCTION_COMBINE, SM.FUNCTION_COMBINE_WARP):  # the 64-head tiles: own tests
        r = res[fn]
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, (fn, r)
    split, comb = res[SM.FUNCTION_SPLIT], res[SM.FUNCTION_COMBINE]
    per_sm = SM.ctas_per_sm(stages)  # 2 CTAs per SM for the double buffer, 1 for the deep ring
    assert 0 < split.registers and split.registers * SM.SPLIT_THREADS * per_sm <= 65536, split
    assert split.smem_bytes == 0, split  # all of it dynamic (SPLIT_SMEM)
    assert comb.smem_bytes <= 8192 and 0 < comb.registers <= 64, comb
    assert "warning" not in ck.log.lower(), ck.log


# ---- GPU -----------------------------------------------------------------------------------------------------------------

def _gpu_inputs(t, h, k, seed, s=10000, **kw):
    return make_inputs(t, h, k, s, seed, device="cuda", **kw)


def _check_vs_float64(o, lse, q, kv, idx, ctx: str):
    o64, lse64 = reference64(q, kv, idx, SCALE)
    assert_no_poison(OP, o, lse, names=["o", "lse"])
    assert_close(OP, o, o64, tol=GPU_TOL, context=ctx)
    assert_close_per_token(o, o64, GPU_TOL, ctx)
    assert _lse_err(lse, lse64) < LSE_TOL, ctx
    empty = (idx.cpu() < 0).all(dim=1)
    assert bool((o.cpu()[empty] == 0).all()), f"{ctx}: a row without a valid slot must give zeros"


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 100, 1])
@pytest.mark.parametrize("h", [64, 16])
@pytest.mark.parametrize("t", [1, 2, 3, 8, 16, 31, 64])
def test_matches_float64_reference(t, h, k, seed, no_pdl_override):
    """Odd T: a flat softmax (logit std ~1); even T: a peaky one (std ~4.5)."""
    q, kv, idx = _gpu_inputs(t, h, k, seed + 31 * t + h + k, q_std=0.7 if t % 2 else 3.0)
    o = poison_(torch.empty(t, h, DV, dtype=BF16, device="cuda"))
    lse = poison_(torch.empty(t, h, device="cuda"))
    ns = SM.split_plan(t, h, k, torch.cuda.get_device_properties(0).multi_processor_count).num_splits
    ws = (poison_(torch.empty(t, ns, h, DV, device="cuda")), poison_(torch.empty(t, ns, h, device="cuda")))
    SM._launch(q, kv, idx, SCALE, o, lse, True, None, workspace=ws, kernel="mma")  # poisoned outputs and workspace
    torch.cuda.synchronize()
    _check_vs_float64(o, lse, q, kv, idx, f"{t=} {h=} {k=} splits={ns}")
    fo, flse = sparse_mla_decode(q, kv, idx, SCALE, return_lse=True, kernel="mma")  # the public path: same bits
    torch.cuda.synchronize()
    assert_equal(OP, fo, o, context="functional vs _launch")
    assert torch.equal(flse, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 64])
def test_explicit_num_splits_and_empty_splits(splits, seed):
    """Any split count gives the reference; with more splits than blocks (K = 100: 4 blocks) the tail splits are
    empty (lse -inf) and skipped by the combine, even over a poisoned workspace."""
    for t, h, k in ((5, 64, 2048), (3, 16, 100)):
        q, kv, idx = _gpu_inputs(t, h, k, seed + splits)
        o = poison_(torch.empty(t, h, DV, dtype=BF16, device="cuda"))
        lse = poison_(torch.empty(t, h, device="cuda"))
        ws = (poison_(torch.empty(t, splits, h, DV, device="cuda")), poison_(torch.empty(t, splits, h, device="cuda")))
        SM._launch(q, kv, idx, SCALE, o, lse, True, splits, workspace=ws, cluster="off")
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"{t=} {k=} {splits=}")
        assert not torch.isnan(ws[1]).any()  # stage 1 wrote every split's lse


@pytest.mark.gpu
def test_all_invalid_chunks_and_empty_rows(seed):
    q, kv, _ = _gpu_inputs(4, 64, 2048, seed)
    idx = torch.stack([torch.randperm(10000)[:2048] for _ in range(4)]).to(torch.int32).cuda()
    idx[:, 32:-32] = -1  # only the first / last block valid: 62 all-invalid splits at T = 4 (64 splits of 1 block)
    idx[1, :32] = -1
    idx[2] = -1  # empty row
    idx[3, :] = -1
    idx[3, 1000] = 17  # one valid slot mid-row
    o, lse = sparse_mla_decode(q, kv, idx, SCALE, return_lse=True, num_splits=64)
    torch.cuda.synchronize()
    _check_vs_float64(o, lse, q, kv, idx, "all-invalid chunks")
    assert bool(torch.isneginf(lse[2]).all()) and bool((o[2] == 0).all())
    assert torch.equal(o[3].cpu(), kv[17, 0, :DV].cpu().expand(64, DV))  # one slot: exactly its V row
    every = torch.full((3, 2048), -1, dtype=torch.int32, device="cuda")
    o0 = sparse_mla_decode(q[:3], kv, every, SCALE)
    torch.cuda.synchronize()
    assert bool((o0 == 0).all())


@pytest.mark.gpu
def test_out_of_range_slots_are_unused(seed):
    q, kv, idx = _gpu_inputs(3, 16, 90, seed, s=300)
    bad = idx.clone()
    bad[0, 3], bad[1, 50], bad[2, 89] = 300, 10**6, -7
    clean = bad.clone()
    clean[(clean >= 300) | (clean < 0)] = -1
    o = sparse_mla_decode(q, kv, bad, SCALE)
    torch.cuda.synchronize()
    assert_equal(OP, o, sparse_mla_decode(q, kv, clean, SCALE), context="slots outside [0, S)")


@pytest.mark.gpu
def test_layouts_2d_kv_and_strided_views(seed):
    t, h, k = 5, 32, 300
    q, kv, idx = _gpu_inputs(t, h, k, seed)
    want = sparse_mla_decode(q, kv, idx, SCALE)
    qbuf = torch.zeros(t, h + 16, D + 64, dtype=BF16, device="cuda")
    qbuf[:, 8:8 + h, 64:64 + D] = q
    kvbuf = torch.zeros(kv.shape[0], D + 8, dtype=BF16, device="cuda")
    kvbuf[:, :D] = kv[:, 0]
    ibuf = torch.full((t, k + 3), 5, dtype=torch.int32, device="cuda")
    ibuf[:, 3:] = idx
    for args in ((q, kv[:, 0], idx), (qbuf[:, 8:8 + h, 64:64 + D], kvbuf[:, :D], ibuf[:, 3:])):
        got = sparse_mla_decode(*args, SCALE)
        torch.cuda.synchronize()
        assert_equal(OP, got, want, context=f"layout strides {[a.stride() for a in args]}")


@pytest.mark.gpu
@pytest.mark.parametrize("t, h", [(1, 64), (16, 64), (3, 16)])
def test_deterministic_and_pdl_off_and_torch_ops_agree(t, h, seed):
    q, kv, idx = _gpu_inputs(t, h, 2048, seed)
    a = sparse_mla_decode(q, kv, idx, SCALE)
    outs = [sparse_mla_decode(q, kv, idx, SCALE) for _ in range(5)]
    outs.append(sparse_mla_decode(q, kv, idx, SCALE, pdl=False))
    outs.append(torch.ops.glm5_fastpath.sparse_mla_decode(q, kv, idx, SCALE, DV, True, None)[0])
    torch.cuda.synchronize()
    for i, b in enumerate(outs):
        assert_equal(OP, b, a, context=f"repeat {i}")


@pytest.mark.gpu
def test_empty_batch_on_gpu():
    q = torch.empty(0, 64, D, dtype=BF16, device="cuda")
    kv = torch.zeros(10, 1, D, dtype=BF16, device="cuda")
    o, lse = sparse_mla_decode(q, kv, torch.empty(0, 2048, dtype=torch.int32, device="cuda"), SCALE, return_lse=True)
    assert tuple(o.shape) == (0, 64, DV) and tuple(lse.shape) == (0, 64)


@pytest.mark.gpu
def test_gpu_error_cases(monkeypatch):
    q, kv, idx = _gpu_inputs(2, 16, 8, 0, s=100)
    qbuf = torch.zeros(2 * 16 * D + 8, dtype=BF16, device="cuda")
    with pytest.raises(SM.SparseMlaInputError, match="q data must be 16-byte aligned"):
        sparse_mla_decode(qbuf[1:1 + 2 * 16 * D].view(2, 16, D), kv, idx, SCALE)
    wide = torch.zeros(100, D + 4, dtype=BF16, device="cuda")
    with pytest.raises(SM.SparseMlaInputError, match=r"kv rows must be 16-byte aligned: the row stride \(580"):
        sparse_mla_decode(q, wide[:, :D], idx, SCALE)
    qw = torch.zeros(2, 16, D + 4, dtype=BF16, device="cuda")
    with pytest.raises(SM.SparseMlaInputError, match="q rows must be 16-byte aligned"):
        sparse_mla_decode(qw[:, :, :D], kv, idx, SCALE)
    with pytest.raises(SM.SparseMlaInputError, match="one device"):
        sparse_mla_decode(q, kv.cpu(), idx, SCALE)
    monkeypatch.setattr(importlib.import_module("glm5_fastpath.ops._device"), "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(RuntimeError, match="sparse_mla_decode: needs a Hopper"):
        sparse_mla_decode(q, kv, idx, SCALE)


@pytest.mark.gpu
@pytest.mark.parametrize("t, h", [(2, 64), (16, 16)])
def test_cuda_graph_capture_and_replay_bitwise(t, h, seed):
    q, kv, idx = _gpu_inputs(t, h, 2048, seed)
    sq, sidx = q.clone(), idx.clone()
    SM.precompile()
    eager = sparse_mla_decode(q, kv, idx, SCALE)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sparse_mla_decode(sq, kv, sidx, SCALE)
    for step in range(3):
        q2, _, idx2 = _gpu_inputs(t, h, 2048, seed + 100 + step)
        sq.copy_(q2)
        sidx.copy_(idx2)
        poison_(out)
        g.replay()
        want = sparse_mla_decode(q2, kv, idx2, SCALE)
        torch.cuda.synchronize()
        assert_equal(OP, out, want, context=f"graph replay {step}")
    sq.copy_(q)
    sidx.copy_(idx)
    g.replay()
    torch.cuda.synchronize()
    assert_equal(OP, out, eager, context="graph replay vs eager")


@pytest.mark.gpu
@pytest.mark.parametrize("late", ["q", "kv", "indices"])
@pytest.mark.parametrize("t, h", [(1, 64), (8, 16)])
def test_waits_for_the_previous_kernel_under_pdl(late, t, h, seed, no_pdl_override):
    from glm5_fastpath.testing.pdl import late_producer, produce
    producer = late_producer()
    q, kv, idx = _gpu_inputs(t, h, 256, seed, s=2048)
    want = sparse_mla_decode(q, kv, idx, SCALE)  # compile + load outside the checked sequence
    torch.cuda.synchronize()
    src = {"q": q, "kv": kv, "indices": idx}[late]
    stale = {"q": lambda x: x.fill_(3.0), "kv": lambda x: x.fill_(-2.0), "indices": lambda x: x.fill_(-1)}[late]
    dst = torch.empty_like(src)
    args = {"q": q, "kv": kv, "indices": idx}
    args[late] = dst
    for _ in range(3):
        stale(dst)
        torch.cuda.synchronize()
        produce(producer, src, dst)  # dst <- src ~50 us after the launch; our kernels start early under PDL
        got = sparse_mla_decode(args["q"], args["kv"], args["indices"], SCALE, pdl=True)
        torch.cuda.synchronize()
        assert_equal(OP, got, want, context=f"PDL after a late producer of {late}")


@pytest.mark.gpu
@pytest.mark.parametrize("t, h, k", [(1, 64, 2048), (2, 64, 2048), (3, 16, 100), (8, 64, 2048), (16, 64, 2048),
                                     (5, 16, 1), (31, 16, 333)])
def test_deep_ring_matches_reference_and_the_double_buffer_bitwise(t, h, k, seed):
    """stages=5 (four gathered blocks in flight): the float64 reference over poisoned outputs and workspace, and
    the same bits as the default build for the same split count (the ring depth changes when rows land, not the
    arithmetic or its order), for the heuristic's splits and for splits with more blocks than the ring."""
    q, kv, idx = _gpu_inputs(t, h, k, seed + 7 * t + k)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for ns in {SM.split_plan(t, h, k, sms, SM.ctas_per_sm(5)).num_splits, 1, 3}:
        o = poison_(torch.empty(t, h, DV, dtype=BF16, device="cuda"))
        lse = poison_(torch.empty(t, h, device="cuda"))
        ws = (poison_(torch.empty(t, ns, h, DV, device="cuda")), poison_(torch.empty(t, ns, h, device="cuda")))
        SM._launch(q, kv, idx, SCALE, o, lse, True, ns, workspace=ws, stages=5)
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"stages=5 {t=} {h=} {k=} splits={ns}")
        o2, lse2 = sparse_mla_decode(q, kv, idx, SCALE, num_splits=ns, stages=2, return_lse=True)
        torch.cuda.synchronize()
        assert_equal(OP, o, o2, context=f"stages 5 vs 2, splits={ns}")
        assert torch.equal(lse, lse2)


@pytest.mark.gpu
@pytest.mark.parametrize("late", ["q", "kv", "indices"])
def test_deep_ring_waits_for_the_previous_kernel_under_pdl(late, seed, no_pdl_override):
    from glm5_fastpath.testing.pdl import late_producer, produce
    producer = late_producer()
    q, kv, idx = _gpu_inputs(4, 64, 2048, seed, s=4096)
    want = sparse_mla_decode(q, kv, idx, SCALE, stages=5)
    torch.cuda.synchronize()
    src = {"q": q, "kv": kv, "indices": idx}[late]
    stale = {"q": lambda x: x.fill_(3.0), "kv": lambda x: x.fill_(-2.0), "indices": lambda x: x.fill_(-1)}[late]
    dst = torch.empty_like(src)
    args = {"q": q, "kv": kv, "indices": idx}
    args[late] = dst
    for _ in range(3):
        stale(dst)
        torch.cuda.synchronize()
        produce(producer, src, dst)
        got = sparse_mla_decode(args["q"], args["kv"], args["indices"], SCALE, pdl=True, stages=5)
        torch.cuda.synchronize()
        assert_equal(OP, got, want, context=f"stages=5, PDL after a late producer of {late}")


@pytest.mark.gpu
def test_deep_ring_graph_replay_and_determinism(seed):
    q, kv, idx = _gpu_inputs(8, 64, 2048, seed)
    SM.precompile(stages=(5,))
    first = sparse_mla_decode(q, kv, idx, SCALE, stages=5)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sparse_mla_decode(q, kv, idx, SCALE, stages=5)
    for i in range(20):
        poison_(out)
        g.replay()
        torch.cuda.synchronize()
        assert_equal(OP, out, first, context=f"stages=5 replay {i}")


@pytest.mark.gpu
def test_torch_compile_fullgraph(seed):
    q, kv, idx = _gpu_inputs(4, 64, 2048, seed)

    def f(a, b, c):
        return sparse_mla_decode(a, b, c, SCALE) * 1.0

    want = f(q, kv, idx)
    got = torch.compile(f, fullgraph=True)(q, kv, idx)
    torch.cuda.synchronize()
    assert_equal(OP, got, want, context="torch.compile")


@pytest.mark.gpu
def test_opcheck_gpu(seed):
    q, kv, idx = _gpu_inputs(3, 16, 64, seed, s=500)
    torch.library.opcheck(torch.ops.glm5_fastpath.sparse_mla_decode.default, (q, kv, idx, SCALE, DV, True, None),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
def test_kernel_resources_report():
    from glm5_fastpath.jit import get_kernel
    ks = get_kernel(SM.SPEC, SM.FUNCTION_SPLIT)
    kc = get_kernel(SM.SPEC, SM.FUNCTION_COMBINE)
    assert ks.local_bytes == 0 and kc.local_bytes == 0, (ks, kc)
    assert ks.param_sizes is None or ks.param_sizes == (8,) * 10 + (4, 4, 4, 4), ks.param_sizes
    assert kc.param_sizes is None or kc.param_sizes == (8, 8, 8, 8, 4, 4), kc.param_sizes
    assert ks.num_regs * SM.SPLIT_THREADS * 2 <= 65536 and ks.max_threads >= SM.SPLIT_THREADS


def test_unsupported_is_the_validation_without_raising():
    """unsupported() (what the SGLang seam routes by) says None exactly where the op's validation passes."""
    q, kv, idx = make_inputs(2, 16, 8, 50, 0)
    assert SM.unsupported(q, kv, idx, SCALE) is None
    msg = SM.unsupported(q.float(), kv, idx, SCALE)
    assert msg.startswith("glm5_fastpath.sparse_mla_decode: ") and "bfloat16" in msg
    assert "multiple of 16" in SM.unsupported(q[:, :8], kv, idx, SCALE)
    assert "K=" in SM.unsupported(q, kv, torch.zeros(2, 4096, dtype=torch.int32), SCALE)


def test_split_table_parsing(tmp_path):
    """Tuned num_splits tables: inline T:S lists or bench sparse-mla's JSON; lookups take the largest T' <= T;
    bad entries name the op and the entry."""
    assert SM.parse_split_table("1:16, 8:32") == {1: 16, 8: 32}
    p = tmp_path / "splits.json"
    p.write_text(json.dumps({"gpu": "NVIDIA H200", "splits": {"1": 64, "4": 16}}))
    tab = SM.parse_split_table(str(p))
    assert tab == {1: 64, 4: 16} and SM.parse_split_table('{"2": 8}') == {2: 8}
    assert [SM.splits_for(tab, t) for t in (1, 3, 4, 100)] == [64, 64, 16, 16]
    assert SM.splits_for({4: 16}, 2) is None and SM.splits_for(None, 2) is None
    for bad in ("1:0", "1:65", "x:3", "0:4", "", str(tmp_path / "none.json") + "x", '{"splits": {}}'):
        with pytest.raises(SM.SparseMlaInputError, match="glm5_fastpath.sparse_mla"):
            SM.parse_split_table(bad)


# ---- CPU: the split tile's gather ring (cp.async group accounting and stage reuse) ----------------------------------

def _ring_replay(stages: int, nblocks: int) -> None:
    """Replays SparseMlaSplitTileT<stages>::run's issue / commit / wait schedule (the expressions checked against
    the source below): every computed block's cp.async group has completed at its wait_group, the Q group has
    landed before the Q fragments are read, and a gather never targets a stage whose block is still to be
    computed or is being computed."""
    groups: list[object] = ["Q"]  # commit order; wait_group<n>: all but the newest n are complete
    done: set = set()

    def wait_group(n):
        for g in groups[: max(0, len(groups) - n)]:
            done.add(g)

    stage_of: dict[int, int] = {}
    for j in range(stages - 1):  # prologue
        if j < nblocks:
            stage_of[j] = j
        groups.append(("blk", j) if j < nblocks else ("empty", j))
    wait_group(stages - 1)
    assert "Q" in done
    for i in range(nblocks):
        st = i % stages
        wait_group(stages - 2)
        assert ("blk", i) in done, (stages, nblocks, i)
        assert stage_of[i] == st
        nst = (i + stages - 1) % stages
        nxt = i + stages - 1
        if nxt < nblocks:
            # the stage must not hold a block >= i (not yet computed, or being computed now)
            assert all(stage_of[b] != nst for b in range(i, nxt) if b in stage_of), (stages, nblocks, i)
            stage_of[nxt] = nst
        groups.append(("blk", nxt) if nxt < nblocks else ("empty", nxt))


@pytest.mark.parametrize("stages", SM.STAGE_CHOICES)
def test_gather_ring_schedule(stages):
    for nblocks in range(0, 23):
        _ring_replay(stages, nblocks)


def test_gather_ring_source_matches_the_replay():
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    for expr in ("for (int j = 0; j < kStages - 1; ++j) {",
                 "slot_pro[j] = load_index(idx_row, blk_begin + j, blk_end, grow, p.topk);",
                 "if (blk_begin + j < blk_end) issue_block(p, stage_ptr(smem_raw, j), bias_ptr(smem_raw, j), slot_pro[j], tid);",
                 "int32_t slot_next = load_index(idx_row, blk_begin + kStages - 1, blk_end, grow, p.topk);",
                 "ptx::cp_async_wait<kStages - 1>();",
                 "const int st = static_cast<int>(static_cast<unsigned>(i) % kStages);",
                 "ptx::cp_async_wait<kStages - 2>();",
                 "const int nst = static_cast<int>(static_cast<unsigned>(i + kStages - 1) % kStages);",
                 "if (blk + kStages - 1 < blk_end)",
                 "slot_next = load_index(idx_row, blk + kStages, blk_end, grow, p.topk);"):
        assert expr in text, expr
    mma_tile, wgmma_tile = text.split("struct SparseMlaSplitWgmmaTileT", 1)
    wgmma_tile = wgmma_tile.split("struct SparseMlaSplitPingPongTileT", 1)[0]
    assert mma_tile.count("ptx::cp_async_commit();") == 3  # Q, each prologue block, each loop iteration
    assert wgmma_tile.count("ptx::cp_async_commit();") == 3  # the same group accounting in the wgmma tile


# ---- the 64-head wgmma split tile (kernel="wgmma") ---------------------------------------------------------------

def test_kernel_argument_is_validated():
    q, kv, idx = make_inputs(2, 64, 8, 50, 0)
    assert SM.DEFAULT_KERNEL == "auto" and SM.resolve_kernel(None, 64, 1) == "mma"
    assert SM.resolve_kernel("auto", 64, 2) == "wgmma" and SM.resolve_kernel("auto", 64, 8, stages=2) == "mma"
    assert SM.resolve_kernel("auto", 64) == "wgmma" and SM.resolve_kernel("auto", 32) == "mma"
    assert SM.resolve_kernel("auto", 128) == "wgmma" and SM.resolve_kernel("mma", 64) == "mma"
    for bad in ("tma", 1, "WGMMA"):
        with pytest.raises(SM.SparseMlaInputError, match="kernel must be None"):
            sparse_mla_decode(q, kv, idx, SCALE, kernel=bad)
    with pytest.raises(SM.SparseMlaInputError, match="needs H to be a multiple of 64"):
        sparse_mla_decode(q[:, :32], kv, idx, SCALE, kernel="wgmma")
    with pytest.raises(SM.SparseMlaInputError, match="one build"):
        sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma", stages=2)
    sparse_mla_decode(q, kv, idx, SCALE, stages=2)  # auto + an mma build: the mma tile
    # CPU: every kernel choice is the reference
    want = sparse_mla_flat(q, kv, idx, SCALE, DV)
    for k in ("mma", "wgmma", "auto"):
        assert_equal(OP, sparse_mla_decode(q, kv, idx, SCALE, kernel=k), want, context=k)


@pytest.mark.parametrize("t, want", [(1, (32, 2)), (2, (32, 2)), (4, (16, 4)), (8, (16, 4)), (16, (8, 8)),
                                     (64, (2, 32)), (132, (1, 64)), (200, (1, 64))])
def test_split_plan_for_the_wgmma_tile(t, want):
    """One 64-head CTA per SM: the splits fill 132 SMs with whole waves, >= 2 blocks per split up to 2 tokens, >= 4
    from 4."""
    assert tuple(SM.split_plan(t, 64, 2048, 132, 1, SM.WGMMA_HEAD_BLOCK, SM.wgmma_min_blocks(t))) == want


def test_wgmma_constants_match_the_kernel_header():
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    start = text.index("struct SparseMlaSplitWgmmaTileT")
    body = text[start:text.index("using SparseMlaSplitWgmmaTile", start)]
    for name, value in (("kHeads", SM.WGMMA_HEAD_BLOCK), ("kBlock", SM.BLOCK), ("kThreads", SM.WGMMA_THREADS),
                        ("kDv", SM.D_V), ("kDqk", SM.D_QK)):
        assert f"static constexpr int {name} = {value};" in body, name
    q_bytes, stage, xchg = 64 * 1152, 32 * 1152, 2 * 4 * 128 * 16
    assert f"#define GLM5_SPARSE_MLA_WGMMA_STAGES {SM.WGMMA_STAGES}" in text
    assert "using SparseMlaSplitWgmmaTile = SparseMlaSplitWgmmaTileT<GLM5_SPARSE_MLA_WGMMA_STAGES>;" in text
    assert "kXchgInStage = kStages >= 4;" in body
    assert SM.wgmma_smem(4) == q_bytes + 4 * stage + 4 * 32 * 4 + 1024 <= 227 * 1024
    assert SM.WGMMA_SMEM == q_bytes + SM.WGMMA_STAGES * stage + xchg + SM.WGMMA_STAGES * 32 * 4 + 1024
    assert SM.WGMMA_SMEM <= 227 * 1024


def test_wgmma_descriptor_encoding():
    """smem_desc_mn128sw's bits, mirrored: start >> 4 in [0, 14), LBO >> 4 in [16, 30), SBO >> 4 in [32, 46),
    128-byte swizzle in [62, 64) (what the P V product's B operand uses: LBO = one 4 KB chunk, SBO = 1 KB)."""
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "common" / "sm90_wgmma_bf16.cuh").read_text()
    assert "((lbo_bytes >> 4) & 0x3FFFu) << 16" in text and "((sbo_bytes >> 4) & 0x3FFFu) << 32" in text
    assert "(1ull << 62)" in text and "p, 1, 1, 1;" in text  # imm-trans-b = 1 on the register-A form
    assert "sm90::smem_desc_mn128sw(vb, kKvChunkBytes, 1024)" in (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()


@pytest.mark.parametrize("stages", SM.WGMMA_STAGE_CHOICES)
def test_compile_wgmma_tile_without_spills(nvcc_jit, stages):
    ck = nvcc_jit(SM.wgmma_spec(stages))
    r = ck.resources()[SM.FUNCTION_SPLIT_WGMMA]
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, r
    assert 0 < r.registers <= 255 and r.registers * SM.WGMMA_THREADS <= 65536, r
    assert r.smem_bytes == 0, r
    assert "warning" not in ck.log.lower(), ck.log


def test_wgmma_stages_env(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", raising=False)
    assert SM.wgmma_stages() == SM.WGMMA_STAGES
    monkeypatch.setenv("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", "4")
    assert SM.wgmma_stages() == 4
    monkeypatch.setenv("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", "5")
    with pytest.raises(SM.SparseMlaInputError, match="one of"):
        SM.wgmma_stages()


@pytest.fixture(params=SM.WGMMA_STAGE_CHOICES)
def wgmma_ring(request, monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", str(request.param))
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("t, k", [(1, 2048), (3, 100), (8, 2048), (16, 2048), (31, 1), (64, 2048)])
def test_wgmma_ring_builds_are_bitwise_equal(t, k, seed, monkeypatch):
    """The 4-stage build moves the partial-S exchange into the ring: the same sums in the same order, so the
    same bits as the 3-stage build, at the heuristic's splits and at 1 / 3 splits."""
    q, kv, idx = _gpu_inputs(t, 64, k, seed + t + k)
    for ns in (None, 1, 3):
        outs = []
        for st in SM.WGMMA_STAGE_CHOICES:
            monkeypatch.setenv("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES", str(st))
            outs.append(sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma", num_splits=ns, return_lse=True))
        torch.cuda.synchronize()
        assert_equal(OP, outs[1][0], outs[0][0], context=f"wgmma 4 vs 3 stages {t=} {k=} splits={ns}")
        assert torch.equal(outs[1][1], outs[0][1])
        _check_vs_float64(outs[1][0], outs[1][1], q, kv, idx, f"wgmma 4 stages {t=} {k=} splits={ns}")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 100, 1])
@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("t", [1, 2, 3, 8, 16, 31, 64])
def test_wgmma_matches_float64_reference(t, h, k, seed, no_pdl_override, wgmma_ring):
    """The wgmma tile over poisoned outputs and workspace, at its own split plan and at explicit splits."""
    q, kv, idx = _gpu_inputs(t, h, k, seed + 31 * t + h + k + 5, q_std=0.7 if t % 2 else 3.0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for ns in sorted({SM.split_plan(t, h, k, sms, 1, SM.WGMMA_HEAD_BLOCK, 2).num_splits, 1, 3}):
        o = poison_(torch.empty(t, h, DV, dtype=BF16, device="cuda"))
        lse = poison_(torch.empty(t, h, device="cuda"))
        ws = (poison_(torch.empty(t, ns, h, DV, device="cuda")), poison_(torch.empty(t, ns, h, device="cuda")))
        SM._launch(q, kv, idx, SCALE, o, lse, True, ns, workspace=ws, kernel="wgmma", cluster="off")
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"wgmma {t=} {h=} {k=} splits={ns}")
        # the cluster merge (auto: the largest of 8 / 4 / 2 dividing ns), over poisoned outputs
        c = SM.wgmma_cluster(ns, "auto")
        o2 = poison_(torch.empty(t, h, DV, dtype=BF16, device="cuda"))
        lse2 = poison_(torch.empty(t, h, device="cuda"))
        ws2 = None if c == ns else (poison_(torch.empty(t, ns // c, h, DV, device="cuda")),
                                    poison_(torch.empty(t, ns // c, h, device="cuda")))
        SM._launch(q, kv, idx, SCALE, o2, lse2, True, ns, workspace=ws2, kernel="wgmma", cluster="auto")
        torch.cuda.synchronize()
        _check_vs_float64(o2, lse2, q, kv, idx, f"wgmma cluster={c} {t=} {h=} {k=} splits={ns}")
        assert_close(OP, o2, o, tol=2e-3, context=f"cluster {c} vs partials, {t=} {k=} splits={ns}")
    fo = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma", num_splits=ns)  # the default (pair) cluster rule
    torch.cuda.synchronize()
    assert_equal(OP, fo, o2 if SM.wgmma_cluster(ns) == SM.wgmma_cluster(ns, "auto") else o,
                 context="functional vs _launch (wgmma)")


@pytest.mark.gpu
def test_wgmma_all_invalid_chunks_and_empty_rows(seed, wgmma_ring):
    q, kv, _ = _gpu_inputs(4, 64, 2048, seed)
    idx = torch.stack([torch.randperm(10000)[:2048] for _ in range(4)]).to(torch.int32).cuda()
    idx[:, 32:-32] = -1
    idx[1, :32] = -1
    idx[2] = -1
    idx[3, :] = -1
    idx[3, 1000] = 17
    for ns in (64, 16, 1):
        o, lse = sparse_mla_decode(q, kv, idx, SCALE, return_lse=True, num_splits=ns, kernel="wgmma")
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"wgmma all-invalid chunks, splits={ns}")
        assert bool(torch.isneginf(lse[2]).all()) and bool((o[2] == 0).all())
        assert torch.equal(o[3].cpu(), kv[17, 0, :DV].cpu().expand(64, DV))


@pytest.mark.gpu
def test_wgmma_out_of_range_slots_and_strided_views(seed):
    q, kv, idx = _gpu_inputs(3, 64, 90, seed, s=300)
    bad = idx.clone()
    bad[0, 3], bad[1, 50], bad[2, 89] = 300, 10**6, -7
    clean = bad.clone()
    clean[(clean >= 300) | (clean < 0)] = -1
    o = sparse_mla_decode(q, kv, bad, SCALE, kernel="wgmma")
    torch.cuda.synchronize()
    assert_equal(OP, o, sparse_mla_decode(q, kv, clean, SCALE, kernel="wgmma"), context="wgmma slots outside [0, S)")
    t, h, k = 5, 64, 300
    q, kv, idx = _gpu_inputs(t, h, k, seed + 1)
    want = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma")
    qbuf = torch.zeros(t, h + 16, D + 64, dtype=BF16, device="cuda")
    qbuf[:, 8:8 + h, 64:64 + D] = q
    kvbuf = torch.zeros(kv.shape[0], D + 8, dtype=BF16, device="cuda")
    kvbuf[:, :D] = kv[:, 0]
    ibuf = torch.full((t, k + 3), 5, dtype=torch.int32, device="cuda")
    ibuf[:, 3:] = idx
    got = sparse_mla_decode(qbuf[:, 8:8 + h, 64:64 + D], kvbuf[:, :D], ibuf[:, 3:], SCALE, kernel="wgmma")
    torch.cuda.synchronize()
    assert_equal(OP, got, want, context="wgmma strided views")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_wgmma_deterministic_graph_replay(t, seed, wgmma_ring):
    q, kv, idx = _gpu_inputs(t, 64, 2048, seed)
    sq, sidx = q.clone(), idx.clone()
    SM.precompile()
    eager = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma")
    for i in range(5):
        assert_equal(OP, sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma", pdl=bool(i % 2)), eager,
                     context=f"wgmma repeat {i}")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sparse_mla_decode(sq, kv, sidx, SCALE, kernel="wgmma")
    for step in range(3):
        q2, _, idx2 = _gpu_inputs(t, 64, 2048, seed + 100 + step)
        sq.copy_(q2)
        sidx.copy_(idx2)
        poison_(out)
        g.replay()
        want = sparse_mla_decode(q2, kv, idx2, SCALE, kernel="wgmma")
        torch.cuda.synchronize()
        assert_equal(OP, out, want, context=f"wgmma graph replay {step}")
    sq.copy_(q)
    sidx.copy_(idx)
    g.replay()
    torch.cuda.synchronize()
    assert_equal(OP, out, eager, context="wgmma graph replay vs eager")


@pytest.mark.gpu
@pytest.mark.parametrize("late", ["q", "kv", "indices"])
def test_wgmma_waits_for_the_previous_kernel_under_pdl(late, seed, no_pdl_override, wgmma_ring):
    from glm5_fastpath.testing.pdl import late_producer, produce
    producer = late_producer()
    q, kv, idx = _gpu_inputs(4, 64, 2048, seed, s=4096)
    want = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma")
    torch.cuda.synchronize()
    src = {"q": q, "kv": kv, "indices": idx}[late]
    stale = {"q": lambda x: x.fill_(3.0), "kv": lambda x: x.fill_(-2.0), "indices": lambda x: x.fill_(-1)}[late]
    dst = torch.empty_like(src)
    args = {"q": q, "kv": kv, "indices": idx}
    args[late] = dst
    for _ in range(3):
        stale(dst)
        torch.cuda.synchronize()
        produce(producer, src, dst)
        got = sparse_mla_decode(args["q"], args["kv"], args["indices"], SCALE, pdl=True, kernel="wgmma")
        torch.cuda.synchronize()
        assert_equal(OP, got, want, context=f"wgmma, PDL after a late producer of {late}")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["mma", "wgmma"])
@pytest.mark.parametrize("t, k, splits", [(1, 2048, None), (3, 100, 2), (8, 2048, None), (16, 2048, 64), (64, 2048, None),
                                          (5, 1, 7)])
def test_warp_combine_matches_the_cta_combine_and_float64(tile, t, k, splits, seed, monkeypatch):
    """Both combine kernels over the same split kernel: each within the float64 tolerance, over poisoned outputs, and
    within fp32 reordering (then bf16 rounding) of each other."""
    q, kv, idx = _gpu_inputs(t, 64, k, seed + t + k)
    outs = {}
    for comb in SM.COMBINE_CHOICES:
        monkeypatch.setattr(SM, "COMBINE", comb)
        o = poison_(torch.empty(t, 64, DV, dtype=BF16, device="cuda"))
        lse = poison_(torch.empty(t, 64, device="cuda"))
        SM._launch(q, kv, idx, SCALE, o, lse, True, splits, kernel=tile)
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"combine={comb} {tile=} {t=} {k=} {splits=}")
        outs[comb] = (o, lse)
    assert_close(OP, outs["warp"][0], outs["cta"][0], tol=2e-3, context=f"warp vs cta combine {tile=} {t=}")
    assert torch.allclose(outs["warp"][1], outs["cta"][1], rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("t, k, splits", [(1, 2048, None), (2, 2048, None), (4, 2048, None), (8, 2048, None),
                                          (16, 2048, None), (32, 2048, None), (64, 2048, None), (3, 100, 4),
                                          (5, 2048, 16), (2, 2048, 64), (7, 1, 8)])
def test_wgmma_cluster_merge(t, k, splits, seed):
    """The in-cluster merge against float64 over poisoned outputs, against the partial round trip, repeated (same bits),
    and under graph replay; empty splits (K = 1 / 100 with 8 / 4 splits) included."""
    q, kv, idx = _gpu_inputs(t, 64, k, seed + 3 * t + k, q_std=3.0 if t % 2 else 0.7)
    o = poison_(torch.empty(t, 64, DV, dtype=BF16, device="cuda"))
    lse = poison_(torch.empty(t, 64, device="cuda"))
    SM._launch(q, kv, idx, SCALE, o, lse, True, splits, kernel="wgmma", cluster="auto")
    torch.cuda.synchronize()
    _check_vs_float64(o, lse, q, kv, idx, f"cluster merge {t=} {k=} {splits=}")
    ref = torch.empty_like(o)
    SM._launch(q, kv, idx, SCALE, ref, torch.empty_like(lse), True, splits, kernel="wgmma", cluster="off")
    again = torch.empty_like(o)
    SM._launch(q, kv, idx, SCALE, again, torch.empty_like(lse), True, splits, kernel="wgmma", cluster="auto")
    torch.cuda.synchronize()
    assert_close(OP, o, ref, tol=2e-3, context="cluster merge vs partial round trip")
    assert_equal(OP, again, o, context="cluster merge repeated")


# ---- the ping-pong tile (kernel="wgmma_pp", opt-in; written in session 25, first GPU run due) --------------------------

def test_pp_tile_constants_and_choice():
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    body = text[text.index("struct SparseMlaSplitPingPongTileT"):text.index("using SparseMlaSplitPingPongTile")]
    for name, value in (("kHeads", SM.WGMMA_HEAD_BLOCK), ("kBlock", SM.BLOCK), ("kDv", SM.D_V), ("kDqk", SM.D_QK),
                        ("kConsumerThreads", 256), ("kProducerRegs", 40), ("kConsumerRegs", 232)):
        assert f"static constexpr int {name} = {value};" in body, name
    assert f"using SparseMlaSplitPingPongTile = SparseMlaSplitPingPongTileT<{SM.PP_STAGES}>;" in text
    assert SM.PP_THREADS == 384 and 40 * 128 + 232 * 256 <= 168 * 384  # the setmaxnreg split fits the launch allocation
    assert SM.PP_SMEM <= 227 * 1024
    q, kv, idx = make_inputs(2, 64, 8, 50, 0)
    assert SM.resolve_kernel("wgmma_pp", 64, 8) == "wgmma_pp" and SM.resolve_kernel("auto", 64, 8) == "wgmma"
    with pytest.raises(SM.SparseMlaInputError, match="needs H to be a multiple of 64"):
        sparse_mla_decode(q[:, :32], kv, idx, SCALE, kernel="wgmma_pp")
    assert_equal(OP, sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma_pp"), sparse_mla_flat(q, kv, idx, SCALE, DV),
                 context="CPU: the reference")


def test_compile_pp_tile(nvcc_jit):
    """Compiled for sm_90a with no wgmma serialisation (ptxas C7514 / C7515 would make every S chain synchronous)."""
    ck = nvcc_jit(SM.SPEC)
    r = ck.resources()[SM.FUNCTION_SPLIT_PP]
    assert r.smem_bytes == 0 and r.registers <= 168, r
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, r
    assert "C7514" not in ck.log and "C7515" not in ck.log, ck.log


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 100, 33, 1])
@pytest.mark.parametrize("t", [1, 2, 3, 8, 16, 31, 64])
def test_pp_matches_float64_reference(t, k, seed, no_pdl_override):
    """The ping-pong tile over poisoned outputs and workspace at its split plan and at 1 / 3 / 7 splits: odd and even
    block counts per split (the virtual pad block), one block, empty splits (K = 1 / 33 with several splits)."""
    q, kv, idx = _gpu_inputs(t, 64, k, seed + 17 * t + k, q_std=0.7 if t % 2 else 3.0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for ns in sorted({SM.split_plan(t, 64, k, sms, 1, SM.WGMMA_HEAD_BLOCK, SM.wgmma_min_blocks(t)).num_splits, 1, 3, 7}):
        o = poison_(torch.empty(t, 64, DV, dtype=BF16, device="cuda"))
        lse = poison_(torch.empty(t, 64, device="cuda"))
        ws = (poison_(torch.empty(t, ns, 64, DV, device="cuda")), poison_(torch.empty(t, ns, 64, device="cuda")))
        SM._launch(q, kv, idx, SCALE, o, lse, True, ns, workspace=ws, kernel="wgmma_pp")
        torch.cuda.synchronize()
        _check_vs_float64(o, lse, q, kv, idx, f"wgmma_pp {t=} {k=} splits={ns}")
        ref = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma", num_splits=ns)
        torch.cuda.synchronize()
        assert_close(OP, o, ref, tol=2e-3, context=f"wgmma_pp vs wgmma {t=} {k=} splits={ns}")


@pytest.mark.gpu
@pytest.mark.parametrize("late", ["q", "kv", "indices"])
def test_pp_waits_for_the_previous_kernel_under_pdl(late, seed, no_pdl_override):
    from glm5_fastpath.testing.pdl import late_producer, produce
    producer = late_producer()
    q, kv, idx = _gpu_inputs(4, 64, 2048, seed, s=4096)
    want = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma_pp")
    torch.cuda.synchronize()
    src = {"q": q, "kv": kv, "indices": idx}[late]
    stale = {"q": lambda x: x.fill_(3.0), "kv": lambda x: x.fill_(-2.0), "indices": lambda x: x.fill_(-1)}[late]
    dst = torch.empty_like(src)
    args = {"q": q, "kv": kv, "indices": idx}
    args[late] = dst
    for _ in range(3):
        stale(dst)
        torch.cuda.synchronize()
        produce(producer, src, dst)
        got = sparse_mla_decode(args["q"], args["kv"], args["indices"], SCALE, pdl=True, kernel="wgmma_pp")
        torch.cuda.synchronize()
        assert_equal(OP, got, want, context=f"wgmma_pp, PDL after a late producer of {late}")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_pp_deterministic_graph_replay(t, seed):
    q, kv, idx = _gpu_inputs(t, 64, 2048, seed)
    SM.precompile()
    first = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma_pp")
    for i in range(5):
        assert_equal(OP, sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma_pp"), first, context=f"wgmma_pp repeat {i}")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sparse_mla_decode(q, kv, idx, SCALE, kernel="wgmma_pp")
    for i in range(20):
        poison_(out)
        g.replay()
        torch.cuda.synchronize()
        assert_equal(OP, out, first, context=f"wgmma_pp replay {i}")
