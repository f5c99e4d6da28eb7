"""E2 top-k + page-table translation: the custom op against the reference and a CPU emulation.

CPU tests (no GPU) check the kernel's ALGORITHM: `emulate_row` below re-implements
csrc/attn_pre/e2_topk.cuh step by step in numpy (the order-preserving key with -0 -> +0 and
NaN -> lowest, the 11/11/10-bit radix rounds with the kernel's thread-to-bin layout and crossing
search, the early stop, the per-chunk packed compaction scan with its offsets and early break),
and is checked on many random rows (ties, -inf, equal values, seq_len < k, = k, k+1, multi-chunk
rows) against a plain sort-based definition and against glm5_fastpath.ref.prefix.e2_topk.

GPU tests (marked gpu) compare the kernel
- bit for bit with the emulation (the output ORDER is deterministic: two runs of ascending position,
  keys above the radix prefix where the search stopped, then the taken ones inside it),
- as sets with the reference (min_overlap=1.0: the tie rule is the reference's, lower position
  wins, so the sets are equal even with many ties), plus explicit checks: no poison left, exact -1
  count, no duplicate slots, every selected logit >= every unselected live logit.
"""
from __future__ import annotations

import ctypes
import importlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_fastpath.ref.prefix import e2_topk as ref_e2_topk
from glm5_fastpath.testing.numerics import assert_equal, assert_no_poison, assert_topk_sets, poison_

e2mod = importlib.import_module("glm5_fastpath.ops.e2_topk")
e2_topk = e2mod.e2_topk
OP = "e2_topk"
PAGE = 64
TOPK = 2048
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]
LENGTHS = [1, 100, 2047, 2048, 2049, 8191, 8192 + 37, 40000, 8192, 5000]
CUH = Path(__file__).resolve().parents[2] / "csrc" / "attn_pre" / "e2_topk.cuh"


# ---- the emulation of the kernel (numpy) --------------------------------------------------------------

ROUNDS = ((2048, 21, 0xFFE00000), (2048, 10, 0xFFFFFC00), (1024, 0, 0xFFFFFFFF))  # (bins, shift, mask after)


def order_keys(x: np.ndarray) -> np.ndarray:
    """E2TopkTile::to_key on float32 values -> uint32 keys."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    k = b ^ np.where(b >> 31 != 0, np.uint32(0xFFFFFFFF), np.uint32(0x80000000)).astype(np.uint32)
    k[(b & 0x7FFFFFFF) > 0x7F800000] = 0
    return k.astype(np.uint32)


def _radix_round(keys: np.ndarray, mask: int, prefix: int, k_rem: int, bins: int, shift: int, threads: int):
    part = (keys & np.uint32(mask)) == np.uint32(prefix)
    digits = ((keys[part] >> np.uint32(shift)) & np.uint32(bins - 1)).astype(np.int64)
    hist = np.bincount(digits, minlength=bins).astype(np.int64)
    B = bins // threads
    # thread t, item j owns bin bins-1-t*B-j
    h = hist[bins - 1 - (np.arange(threads)[:, None] * B + np.arange(B)[None, :])]
    v = h.sum(1)
    excl = np.cumsum(v) - v
    win = np.nonzero((excl < k_rem) & (k_rem <= excl + v))[0]
    assert len(win) == 1, f"crossing found in {len(win)} threads"
    t = int(win[0])
    acc = int(excl[t])
    for j in range(B):
        if acc + int(h[t, j]) >= k_rem:
            return bins - 1 - t * B - j, acc, int(h[t, j])
        acc += int(h[t, j])
    raise AssertionError("unreachable: crossing thread has no crossing bin")


def emulate_row(logits_row: np.ndarray, seq_len: int, bt_row: np.ndarray, topk: int, *, threads: int = 1024,
                items: int = 8, stats: dict | None = None) -> np.ndarray:
    """The kernel's output for one row (int32 [topk])."""
    width = logits_row.shape[0]
    lim = min(width, len(bt_row) * PAGE)
    L = max(0, min(int(seq_len), lim))
    bt = np.asarray(bt_row, dtype=np.int64)

    def slots(pos):
        return (bt[pos // PAGE] * PAGE + pos % PAGE).astype(np.int64).astype(np.uint32).view(np.int32)

    out = np.full(topk, np.iinfo(np.int32).min, dtype=np.int32)  # poison: every entry must be written
    if L <= topk:
        out[:] = -1
        out[:L] = slots(np.arange(L))
        return out
    keys = order_keys(logits_row[:L])
    mask, prefix, k_rem, rounds = 0, 0, topk, 0
    for bins, shift, mask_after in ROUNDS:
        bin_, above, cnt = _radix_round(keys, mask, prefix, k_rem, bins, shift, threads)
        rounds += 1
        prefix |= bin_ << shift
        mask = mask_after
        k_rem -= above
        if cnt == k_rem:
            break
    n_gt = topk - k_rem
    chunk = threads * items
    n_chunks = -(-L // chunk) if L > chunk else 1
    g_base = e_base = 0
    mk_all = keys & np.uint32(mask)
    for c in range(n_chunks):
        pos = c * chunk + np.arange(chunk)
        live = pos < L
        mk = np.zeros(chunk, dtype=np.uint32)
        mk[live] = mk_all[pos[live]]
        gt = (live & (mk > np.uint32(prefix))).reshape(threads, items)
        eq = (live & (mk == np.uint32(prefix))).reshape(threads, items)
        packed = (gt.sum(1) | (eq.sum(1) << 16)).astype(np.int64)
        off = np.cumsum(packed) - packed
        total = int(packed.sum())
        assert total < 2**31 and int(gt.sum()) < 65536
        # per thread: offset from the packed scan, plus the running count inside the thread
        go = g_base + (off & 0xFFFF)[:, None] + np.cumsum(gt, 1) - gt
        eo = e_base + (off >> 16)[:, None] + np.cumsum(eq, 1) - eq
        p = pos.reshape(threads, items)
        out[go[gt]] = slots(p[gt])
        take = eq & (eo < k_rem)
        out[n_gt + eo[take]] = slots(p[take])
        g_base += total & 0xFFFF
        e_base += total >> 16
        if g_base >= n_gt and e_base >= k_rem:
            break
    if stats is not None:
        stats["rounds"] = rounds
        stats["ties_cut"] = int(((mk_all == np.uint32(prefix)).sum())) > k_rem
    return out


def emulate(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
            **kw) -> torch.Tensor:
    lg = logits.detach().cpu().float().numpy()
    sl = seq_lens.detach().cpu().numpy()
    bt = block_table.detach().cpu().numpy()
    return torch.from_numpy(np.stack([emulate_row(lg[i], int(sl[i]), bt[i], topk, **kw) for i in range(lg.shape[0])])
                            if lg.shape[0] else np.zeros((0, topk), np.int32))


def assert_same_selection(emu: np.ndarray, want: np.ndarray, ctx: str) -> None:
    """Same slots (as a multiset, -1 padding included, so also the same count); padding last in both."""
    assert np.array_equal(np.sort(emu), np.sort(want)), f"{ctx}: selected sets differ"
    n = int((want != -1).sum())
    assert (emu[:n] != -1).all() and (emu[n:] == -1).all(), f"{ctx}: -1 padding not last"


def definition_row(logits_row: np.ndarray, seq_len: int, bt_row: np.ndarray, topk: int) -> np.ndarray:
    """The contract, written directly (sort-based): the topk largest, ties at the k-th value to the lower
    positions; -0 == +0, NaN lowest. (Listed as values above the k-th, then the ties; the kernel's order
    differs where it stopped at a radix bin, so compare as sets.)"""
    width = logits_row.shape[0]
    L = max(0, min(int(seq_len), width, len(bt_row) * PAGE))
    bt = np.asarray(bt_row, dtype=np.int64)
    out = np.full(topk, -1, dtype=np.int64)
    if L <= topk:
        pos = np.arange(L)
    else:
        x = logits_row[:L].astype(np.float64)
        x = np.where(np.isnan(x), -np.inf, x)
        rank_key = np.where(np.isnan(logits_row[:L]), 0, 1)  # NaN below -inf
        order = np.lexsort((np.arange(L), -x, -rank_key))  # by (non-NaN first, value desc, position asc)
        kth = order[topk - 1]
        above = (rank_key > rank_key[kth]) | ((rank_key == rank_key[kth]) & (x > x[kth]))
        tie = (rank_key == rank_key[kth]) & (x == x[kth])
        tie_pos = np.nonzero(tie)[0][: topk - int(above.sum())]
        pos = np.concatenate([np.nonzero(above)[0], tie_pos])
    out[: len(pos)] = bt[pos // PAGE] * PAGE + pos % PAGE
    return out.astype(np.int32)


# ---- input makers ---------------------------------------------------------------------------------------

def make_block_table(seq_lens: list[int], g: torch.Generator, extra_cols: int = 1, dtype=torch.int32) -> torch.Tensor:
    """Shuffled physical pages, -1 in unused columns."""
    pages = [-(-max(L, 1) // PAGE) for L in seq_lens]
    perm = torch.randperm(sum(pages) + 5, generator=g) + 3
    bt = torch.full((len(seq_lens), max(pages) + extra_cols), -1, dtype=torch.int64)
    at = 0
    for i, n in enumerate(pages):
        bt[i, :n] = perm[at:at + n]
        at += n
    return bt.to(dtype)


def make_logits(seq_lens: list[int], width: int, g: torch.Generator, kind: str = "randn") -> torch.Tensor:
    m = len(seq_lens)
    if kind == "randn":
        x = torch.randn(m, width, generator=g)
    elif kind == "indexer":  # positive, clustered like ReLU-weighted sums (few exponent bins)
        x = torch.relu(torch.randn(m, width, generator=g)) * 3.0 + 10.0
    elif kind == "bf16":
        x = torch.randn(m, width, generator=g).to(torch.bfloat16).float()
    elif kind == "few":
        x = torch.randint(0, 4, (m, width), generator=g).float() - 1.0
    elif kind == "const":
        x = torch.full((m, width), 0.5)
    elif kind == "special":  # -inf at live positions, signed zeros, huge values
        x = torch.randn(m, width, generator=g).to(torch.bfloat16).float()
        r = torch.rand(m, width, generator=g)
        x[r < 0.3] = float("-inf")
        x[(r >= 0.3) & (r < 0.4)] = 0.0
        x[(r >= 0.4) & (r < 0.5)] = -0.0
        x[(r >= 0.5) & (r < 0.51)] = float("inf")
        x[(r >= 0.51) & (r < 0.52)] = -3.0e38
    else:
        raise ValueError(kind)
    for i, L in enumerate(seq_lens):
        x[i, L:] = float("-inf")
    return x.contiguous()


# ---- CPU: the algorithm ------------------------------------------------------------------------------

def test_kernel_source_uses_the_emulated_rounds():
    """Drift guard: the round widths/shifts and masks emulated here are the ones in the .cuh."""
    src = CUH.read_text()
    for bins, shift, mask in ROUNDS:
        assert f"radix_round<{bins}, {shift}>" in src, (bins, shift)
        assert f"mask = {mask:#010x}u;" in src, hex(mask)
    assert "(b == 0x80000000u) ? 0u : b" in src and "> 0x7f800000u) ? 0u : k" in src


def test_order_keys_preserve_float_order():
    v = np.array([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 3e38, np.inf], dtype=np.float32)
    k = order_keys(v)
    assert list(np.argsort(k, kind="stable")) == list(range(len(v)))
    assert k[4] == k[5]  # -0 == +0
    nan = np.array([np.nan, -np.nan], dtype=np.float32)
    nan2 = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001], dtype=np.uint32).view(np.float32)
    assert (order_keys(nan) == 0).all() and (order_keys(nan2) == 0).all()
    assert order_keys(np.array([-np.inf], np.float32))[0] > 0


_ALGO_CASES = [
    # (seq_len, topk, kind)
    (2049, 2048, "randn"), (2048, 2048, "randn"), (2047, 2048, "randn"), (1, 2048, "randn"), (0, 2048, "randn"),
    (8192, 2048, "indexer"), (8192, 2048, "bf16"), (8192, 2048, "few"), (8192, 2048, "const"),
    (8192, 2048, "special"), (5000, 2048, "few"), (8191, 1, "few"), (8191, 1, "randn"), (3000, 2999, "few"),
]


@pytest.mark.parametrize("threads, items", [(1024, 8), (128, 4), (512, 16)])
@pytest.mark.parametrize("case", range(len(_ALGO_CASES)))
def test_emulation_matches_definition_and_reference(case, threads, items):
    L, topk, kind = _ALGO_CASES[case]
    g = torch.Generator().manual_seed(1000 + case)
    width = max(L, 1) + 13
    lens = [L]
    logits = make_logits(lens, width, g, kind)
    bt = make_block_table([width], g)
    stats = {}
    emu = emulate_row(logits[0].numpy(), L, bt[0].numpy(), topk, threads=threads, items=items, stats=stats)
    want = definition_row(logits[0].numpy(), L, bt[0].numpy(), topk)
    assert_same_selection(emu, want, f"{case=} {threads=} {items=}")
    ref = ref_e2_topk(logits, torch.tensor(lens, dtype=torch.int32), bt, topk)
    assert_topk_sets(OP, torch.from_numpy(emu)[None], ref, min_overlap=1.0)


def test_emulation_random_sweep():
    """Many random rows, small chunks so most rows take the multi-chunk path; all kinds of ties."""
    rng = np.random.default_rng(7)
    kinds = ["randn", "indexer", "bf16", "few", "const", "special"]
    n_rounds, n_cut = set(), 0
    for it in range(150):
        kind = kinds[it % len(kinds)]
        topk = int(rng.choice([1, 2, 7, 64, 100, 257, 1000]))
        L = int(rng.choice([topk - 1, topk, topk + 1, topk + int(rng.integers(2, 3000))]))
        L = max(L, 0)
        width = L + int(rng.integers(0, 70))
        g = torch.Generator().manual_seed(it)
        logits = make_logits([L], max(width, 1), g, kind)
        if kind == "few" and it % 4 == 0:  # values that differ only in the low mantissa bits (round 3)
            logits[0, :L] = torch.tensor(1.0).view(torch.int32).add(
                torch.randint(0, 3, (L,), generator=g, dtype=torch.int32)).view(torch.float32)
        bt = make_block_table([max(width, 1)], g, extra_cols=int(rng.integers(0, 3)))
        stats = {}
        emu = emulate_row(logits[0].numpy(), L, bt[0].numpy(), topk, threads=128, items=4, stats=stats)
        want = definition_row(logits[0].numpy(), L, bt[0].numpy(), topk)
        assert_same_selection(emu, want, f"{it=} {kind=} {L=} {topk=}")
        if L > topk:
            n_rounds.add(stats["rounds"])
            n_cut += stats["ties_cut"]
            ref = ref_e2_topk(logits[:, :max(width, 1)], torch.tensor([L]), bt, topk)
            assert_topk_sets(OP, torch.from_numpy(emu)[None], ref, min_overlap=1.0)
    assert n_rounds == {1, 2, 3}, f"the sweep must stop after each of the rounds, got {n_rounds}"
    assert n_cut > 10, "the sweep must cut ties at the threshold"


def test_emulation_nan_ranks_lowest():
    x = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0, np.nan], dtype=np.float32)
    bt = np.arange(1)
    out = emulate_row(x, 6, bt, 4, threads=128, items=4)
    assert out.tolist() == [1, 3, 4, 0]  # 1.0, -inf, 2.0 above the k-th (NaN), then the first NaN
    assert_same_selection(out, definition_row(x, 6, bt, 4), "nan")


def test_emulation_clamps_seq_len():
    g = torch.Generator().manual_seed(3)
    x = make_logits([300], 300, g)[0].numpy()
    bt = make_block_table([300], g)[0].numpy()  # 5 pages + 1 spare col -> capacity 384
    assert np.array_equal(emulate_row(x, 10**6, bt, 100), emulate_row(x, 300, bt, 100))
    assert (emulate_row(x, -5, bt, 100) == -1).all()
    assert np.array_equal(emulate_row(x, 300, bt[:2], 100), emulate_row(x, 128, bt[:2], 100))


# ---- CPU: validation and fake ---------------------------------------------------------------------------

def _cpu_inputs(m=3, w=300, topk=16):
    return torch.zeros(m, w), torch.full((m,), w, dtype=torch.int32), torch.zeros(m, 5, dtype=torch.int32), topk


@pytest.mark.parametrize("mutate, match", [
    (lambda l, s, b, k: (l.double(), s, b, k), "logits must be torch.float32"),
    (lambda l, s, b, k: (l[None], s, b, k), "logits must be 2-D"),
    (lambda l, s, b, k: (torch.zeros(300, 3).t(), s, b, k), "unit column stride"),
    (lambda l, s, b, k: (l, s.float(), b, k), "seq_lens must be torch.int32 or torch.int64"),
    (lambda l, s, b, k: (l, s[:2], b, k), "seq_lens has 2 entries"),
    (lambda l, s, b, k: (l, torch.zeros(6, dtype=torch.int32)[::2], b, k), "seq_lens must be contiguous"),
    (lambda l, s, b, k: (l, s, b.to(torch.int16), k), "block_table must be"),
    (lambda l, s, b, k: (l, s, b[:2], k), "block_table has 2 rows"),
    (lambda l, s, b, k: (l, s, torch.zeros(5, 3, dtype=torch.int32).t(), k), "block_table must have unit column"),
    (lambda l, s, b, k: (l, s, b, 0), "topk must be"),
    (lambda l, s, b, k: (l, s, b, 2.0), "topk must be"),
    (lambda l, s, b, k: (l, s, b, True), "topk must be"),
    (lambda l, s, b, k: (l, s, b, k), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(mutate, match):
    args = mutate(*_cpu_inputs())
    with pytest.raises(ValueError, match=match) as ei:
        e2_topk(*args)
    assert "glm5_fastpath.e2_topk" in str(ei.value)


def test_bad_out():
    lg, s, b, k = _cpu_inputs()
    for out in (torch.zeros(3, k, dtype=torch.int64), torch.zeros(3, k + 1, dtype=torch.int32),
                torch.zeros(k, 3, dtype=torch.int32).t()):
        with pytest.raises(ValueError, match="out must be a contiguous int32"):
            e2_topk(lg, s, b, k, out=out)


def test_fake_shapes_and_compile():
    lg = torch.empty(5, 9000, device="meta")
    s = torch.empty(5, dtype=torch.int64, device="meta")
    b = torch.empty(5, 141, dtype=torch.int32, device="meta")
    o = torch.ops.glm5_fastpath.e2_topk(lg, s, b, 2048, True)
    assert tuple(o.shape) == (5, 2048) and o.dtype == torch.int32

    def f(lg, s, b):
        return e2_topk(lg, s, b, 2048)
    o = torch.compile(f, backend="aot_eager", fullgraph=True)(lg, s, b)
    assert tuple(o.shape) == (5, 2048) and o.dtype == torch.int32


def test_compile_check_specs():
    specs = e2mod.compile_check_specs()
    assert specs[0].source == "attn_pre/e2_topk.cu" and dict(specs[0].defines)["GLM5_E2_THREADS"] == "1024"


# ---- GPU ----------------------------------------------------------------------------------------------

def check_against_all(logits, seq_lens, block_table, topk, out, ctx: str, *, ref: bool = True) -> None:
    """Kernel output vs emulation (bit for bit), vs the reference (sets), and the contract's invariants."""
    o = out.cpu()
    assert_no_poison(OP, o, names=["topk_slots"])
    emu = emulate(logits, seq_lens, block_table, topk)
    assert_equal(OP, o, emu, context=ctx + " vs emulation")
    lg = logits.cpu()
    lens = seq_lens.cpu().long().clamp(min=0, max=min(lg.shape[1], block_table.shape[1] * PAGE))
    if ref and not torch.isnan(lg).any():
        r = ref_e2_topk(lg, lens, block_table.cpu(), topk)
        assert_topk_sets(OP, o, r, min_overlap=1.0)
    bt = block_table.cpu().long()
    for i in range(o.shape[0]):
        L = int(lens[i])
        row = o[i]
        n_valid = min(L, topk)
        assert int((row == -1).sum()) == topk - n_valid, f"{ctx} row {i}: wrong -1 count"
        assert (row[:n_valid] != -1).all() and (row[n_valid:] == -1).all(), f"{ctx} row {i}: -1 not last"
        assert len(set(row[:n_valid].tolist())) == n_valid, f"{ctx} row {i}: duplicate slots"
        if L > topk and not torch.isnan(lg[i, :L]).any():
            # slot -> logical position, then: min selected >= max unselected
            pos = torch.arange(L)
            slot_of = bt[i, pos // PAGE] * PAGE + pos % PAGE
            sel = torch.isin(slot_of, row.long())
            assert int(sel.sum()) == topk
            v = lg[i, :L]
            assert float(v[sel].min()) >= float(v[~sel].max()), f"{ctx} row {i}: a larger logit was left out"


def _case(m: int, seed: int, kind: str = "indexer", topk: int = TOPK, lens: list[int] | None = None,
          idx_dtype=torch.int32, pad_cols: int = 0):
    g = torch.Generator().manual_seed(seed)
    if lens is None:
        rot = seed % len(LENGTHS)
        lens = [LENGTHS[(rot + i) % len(LENGTHS)] for i in range(m)]
    width = max(lens)
    logits = make_logits(lens, width, g, kind)
    bt = make_block_table(lens, g, dtype=idx_dtype)
    seq = torch.tensor(lens, dtype=idx_dtype)
    if pad_cols:  # strided view (row stride width + pad_cols), made on the device so .cuda() keeps the strides
        big = torch.full((m, width + pad_cols), 12345.0, device="cuda")
        big[:, :width] = logits.cuda()
        return big[:, :width], seq.cuda(), bt.cuda(), topk
    return logits.cuda(), seq.cuda(), bt.cuda(), topk


@pytest.fixture
def no_pdl_override(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_DISABLE_PDL", raising=False)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["indexer", "bf16"])
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_into_poisoned_output(m, kind, seed, no_pdl_override):
    logits, seq, bt, k = _case(m, seed + m, kind)
    out = poison_(torch.empty(m, k, dtype=torch.int32, device="cuda"))
    res = e2_topk(logits, seq, bt, k, out=out)
    torch.cuda.synchronize()
    assert res is out
    check_against_all(logits, seq, bt, k, out, f"{m=} {kind=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["few", "const", "special", "randn"])
@pytest.mark.parametrize("m", [3, 16, 64])
def test_ties_and_special_values(m, kind, seed):
    logits, seq, bt, k = _case(m, seed + 3 * m, kind)
    out = e2_topk(logits, seq, bt, k)
    torch.cuda.synchronize()
    check_against_all(logits, seq, bt, k, out, f"{m=} {kind=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [1, 7, 100, 2048, 8192, 9000])
def test_other_topk(topk, seed):
    lens = [1, 100, 2047, 2049, 8191, 8192, 8193, 9001, 20000]
    logits, seq, bt, k = _case(len(lens), seed + topk, "bf16", topk=topk, lens=lens)
    out = e2_topk(logits, seq, bt, k)
    torch.cuda.synchronize()
    check_against_all(logits, seq, bt, k, out, f"{topk=}")


@pytest.mark.gpu
def test_long_rows(seed):
    lens = [131072, 131072 - 5, 70000, 8192 * 3 + 1]
    for kind in ("indexer", "few"):
        logits, seq, bt, k = _case(len(lens), seed, kind, lens=lens)
        out = e2_topk(logits, seq, bt, k)
        torch.cuda.synchronize()
        check_against_all(logits, seq, bt, k, out, f"long rows {kind=}")


@pytest.mark.gpu
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pad_cols", [0, 1, 4, 61])
def test_index_dtypes_and_strided_logits(idx_dtype, pad_cols, seed):
    """int64 seq_lens / block_table; logits as a view with a padded row stride (odd strides make
    rows 4-byte aligned only: the kernel falls back to scalar loads)."""
    logits, seq, bt, k = _case(8, seed, "bf16", idx_dtype=idx_dtype, pad_cols=pad_cols)
    assert logits.stride(0) == logits.shape[1] + pad_cols
    out = e2_topk(logits, seq, bt, k)
    # mixed: seq_lens int64 with block_table int32 and vice versa
    other = torch.int64 if idx_dtype == torch.int32 else torch.int32
    out2 = e2_topk(logits, seq.to(other), bt, k)
    torch.cuda.synchronize()
    check_against_all(logits, seq, bt, k, out, f"{idx_dtype=} {pad_cols=}")
    assert_equal(OP, out2, out, context="seq_lens dtype does not change the result")


@pytest.mark.gpu
def test_seq_len_clamped_and_odd_block_tables(seed):
    """seq_lens beyond the logits width / block-table capacity are clamped, negative ones give all -1."""
    g = torch.Generator().manual_seed(seed)
    logits = make_logits([9000] * 5, 9000, g, "bf16")
    bt = make_block_table([9000] * 5, g)[:, :100].contiguous()  # capacity 6400 tokens < width 9000
    seq = torch.tensor([10**9, 9000, 6401, -7, 0], dtype=torch.int32)
    logits, seq, bt = logits.cuda(), seq.cuda(), bt.cuda()
    out = e2_topk(logits, seq, bt, TOPK)
    torch.cuda.synchronize()
    emu = emulate(logits, seq, bt, TOPK)
    assert_equal(OP, out.cpu(), emu, context="clamped seq_lens")
    assert (out[3:] == -1).all()
    check_against_all(logits, seq.clamp(0, 6400), bt, TOPK, out, "clamped")


@pytest.mark.gpu
def test_deterministic_and_pdl_off(seed):
    logits, seq, bt, k = _case(64, seed, "few")
    a = e2_topk(logits, seq, bt, k)
    b = e2_topk(logits, seq, bt, k)
    c = e2_topk(logits, seq, bt, k, pdl=False)
    torch.cuda.synchronize()
    assert_equal(OP, a, b, context="run twice")
    assert_equal(OP, a, c, context="pdl on vs off")


@pytest.mark.gpu
def test_alternative_config_512x16(seed):
    logits, seq, bt, k = _case(31, seed, "few")
    out = poison_(torch.empty(31, k, dtype=torch.int32, device="cuda"))
    e2mod._launch(logits, seq, bt, k, out, True, e2mod.ALT_CONFIGS[0])
    torch.cuda.synchronize()
    check_against_all(logits, seq, bt, k, out, "512x16")


@pytest.mark.gpu
def test_empty_batch_and_gpu_errors():
    logits, seq, bt, k = _case(2, 0, "randn")
    assert tuple(e2_topk(logits[:0], seq[:0], bt[:0], k).shape) == (0, k)
    with pytest.raises(ValueError, match="one device"):
        e2_topk(logits, seq.cpu(), bt, k)
    with pytest.raises(ValueError, match="overlaps input logits"):
        e2_topk(logits, seq, bt, 16, out=_overlapping_out(logits))
    importlib.import_module("glm5_fastpath.ops._device")._capability_ok.clear()
    orig = torch.cuda.get_device_capability
    try:
        torch.cuda.get_device_capability = lambda *a, **kw: (8, 0)
        with pytest.raises(RuntimeError, match="Hopper"):
            e2_topk(logits, seq, bt, k)
    finally:
        torch.cuda.get_device_capability = orig
        importlib.import_module("glm5_fastpath.ops._device")._capability_ok.clear()


def _overlapping_out(logits: torch.Tensor) -> torch.Tensor:
    """A contiguous int32 [2, 16] view into the logits storage."""
    return logits.view(torch.int32).view(-1)[:32].view(2, 16)


# ---- PDL ------------------------------------------------------------------------------------------------

PDL_TEST_KERNELS = r"""
#include "common/pdl.cuh"
// Lets its dependents launch at once, spins spin_ns, then copies src -> dst (16-byte vectors).
extern "C" __global__ void e2_pdl_spin_then_copy(const uint4* src, uint4* dst, long long n_vec,
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
PRODUCER_CTAS = 8


def _producer():
    from glm5_fastpath.jit import KernelSpec, get_kernel
    return get_kernel(KernelSpec("e2_pdl_test_kernels", code=PDL_TEST_KERNELS, functions=("e2_pdl_spin_then_copy",)),
                      "e2_pdl_spin_then_copy")


def _produce(producer, src: torch.Tensor, dst: torch.Tensor) -> None:
    assert src.is_contiguous() and dst.is_contiguous() and (src.numel() * src.element_size()) % 16 == 0
    producer.launch((PRODUCER_CTAS, 1, 1), (256, 1, 1),
                    [src, dst, ctypes.c_int64(src.numel() * src.element_size() // 16), ctypes.c_uint64(SPIN_NS)],
                    pdl=False)


def _stale_like(logits: torch.Tensor) -> torch.Tensor:
    """What the consumer would see without waiting: a row of large constants that WOULD change the top-k."""
    return torch.full_like(logits, 1.0e30)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_e2_waits_for_the_previous_kernel_under_pdl(m, seed, no_pdl_override):
    producer = _producer()
    lens = [8192 if i % 3 else 40000 for i in range(m)] if m > 1 else [8192]
    logits_true, seq, bt, k = _case(m, seed, "indexer", lens=lens)
    width = logits_true.shape[1]
    if width % 4:
        pytest.skip("producer copies 16-byte vectors")
    logits = _stale_like(logits_true)
    e2_topk(logits_true, seq, bt, k)  # compile + load outside the timed sequence
    want = emulate(logits_true, seq, bt, k)
    for _ in range(3):
        logits.fill_(1.0e30)
        out = poison_(torch.empty(m, k, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        _produce(producer, logits_true, logits)
        e2_topk(logits, seq, bt, k, out=out, pdl=True)
        torch.cuda.synchronize()
        assert_equal(OP, out.cpu(), want, context=f"PDL after producer {m=}")


# ---- CUDA graphs --------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 3])
def test_cuda_graph_capture_and_replay(m, seed, no_pdl_override):
    producer = _producer()
    lens = [8192] * m
    src, seq, bt, k = _case(m, seed, "indexer", lens=lens)
    static_logits = torch.empty_like(src)
    out = poison_(torch.empty(m, k, dtype=torch.int32, device="cuda"))
    e2_topk(src, seq, bt, k)  # warm up (compile/load) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _produce(producer, src, static_logits)  # producer -> E2 with a PDL edge
        e2_topk(static_logits, seq, bt, k, out=out, pdl=True)
        func = e2_topk(static_logits, seq, bt, k)  # graph-pool output
    for step in range(3):
        new, _, _, _ = _case(m, seed + 100 + step, ["indexer", "few", "bf16"][step], lens=lens)
        src.copy_(new)
        poison_(out)
        static_logits.fill_(1.0e30)
        g.replay()
        torch.cuda.synchronize()
        check_against_all(new, seq, bt, k, out, f"graph replay {step} {m=}")
        assert_equal(OP, func, out, context="functional op in the graph")


# ---- speed (a gross-regression guard; the target is <= 3 us at M=16, L=8192) ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m, L", [(16, 8192), (1, 8192), (64, 8192), (256, 8192), (16, 65536)])
def test_speed_in_cuda_graph(m, L, seed):
    logits, seq, bt, k = _case(m, seed, "indexer", lens=[L] * m)
    out = torch.empty(m, k, dtype=torch.int32, device="cuda")
    e2_topk(logits, seq, bt, k, out=out)
    torch.cuda.synchronize()
    n = 20
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            e2_topk(logits, seq, bt, k, out=out)
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        t0.record()
        g.replay()
        t1.record()
        torch.cuda.synchronize()
        times.append(t0.elapsed_time(t1) * 1000 / n)
    us = sorted(times)[len(times) // 2]
    print(f"e2_topk M={m} L={L}: {us:.2f} us per call (graph of {n}, PDL on)")
    bound = 10.0 * max(1, L // 8192) * max(1, m // 132 + 1)
    assert us < bound, f"e2_topk M={m} L={L}: {us:.2f} us per call, gross regression bound {bound} us (target 3 us at M=16)"
