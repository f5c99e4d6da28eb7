"""E1 paged FP8 indexer logits: the custom op against glm5_fastpath.ref.prefix.e1_indexer_logits.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings; the CPU tests check argument
validation, the split planner, the fake (meta) implementation, the PDL wait-point switch
(pdl_wait= / pdl_wait_at, GLM5_PDL_WAIT_AT), the kernel's fragment index math (a Python emulation)
and, when nvcc is present, that every variant (and every wait point) compiles without spills.

What is compared, and why the bar is where it is:
- Both sides start from the SAME fp8 q / k bytes and fp32 scales / head weights. Every fp8 x fp8
  product is exact in fp32 (4-bit significands); the kernel sums the 128 products with fp32
  tensor-core accumulation (e4m3 -> f16 is exact), the reference with an fp32 einsum, and the 32
  ReLU'd heads in another order. Only summation order and the tensor core's accumulation rounding
  separate them: ~1e-7 relative, so the live logits are judged with tol=1e-5 (the project's fp32
  bar, 200x tighter than kind "fp8_same_quant" = 2e-2, which would also pass a kernel with a
  wrong scale on a few heads).
- Columns at or past seq_len must be exactly -inf; outputs start poisoned (NaN), so an unwritten
  column fails; slots of the last page past seq_len hold NaN bytes, so a leak of them fails.
- The kernel is deterministic and its per-token arithmetic does not depend on the split: outputs
  must be bitwise equal across runs, splits, PDL on/off, the metadata-before-wait flag and the
  PDL wait point.
- Out-of-bounds writes: outputs may sit inside a larger poisoned buffer whose guard bytes must
  come back untouched.
The reference runs on the GPU (fp32 matmul precision "highest", i.e. no TF32).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import random

import numpy as np
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops.e1_indexer_logits import (CTAS_PER_SM, MAX_PAGES_PER_SPLIT, config_for, e1_indexer_logits,
                                                 floor_us, grid_for, page_bytes, plan_pages_per_split)
from glm5_fastpath.ref.fp8 import FP8, quant_per_row
from glm5_fastpath.ref.prefix import e1_indexer_logits as ref_e1
from glm5_fastpath.testing.numerics import assert_close, assert_equal, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "e1_indexer_logits"
TOL = 1e-5
PAGE = 64
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 127, 128, 256, 263, 300]
# lengths around page boundaries, long rows not a multiple of 64, and tiny ones
LEN_POOL = [1, 63, 64, 65, 2047, 8191, 129, 4000, 200, 1000, 6001, 7, 128, 3333, 127, 8190]

GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")
WAIT_POINTS = ("entry", "after_prologue", "after_prefetch")


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


# ---- CPU: validation, planning, fake implementation ------------------------------------------------

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


def test_host_max_ctx_checks_seq_lens():
    q, w, c, s, b = _cpu_args()
    with pytest.raises(ValueError, match="negative entry"):
        e1_indexer_logits(q, w, c, torch.tensor([1, -2, 3], dtype=torch.int32), b, GLM5)
    with pytest.raises(ValueError, match="exceeds the block table capacity"):
        e1_indexer_logits(q, w, c, torch.tensor([1, 257, 3], dtype=torch.int32), b, GLM5)
    with pytest.raises(ValueError, match="CUDA device"):  # valid: gets as far as the launch
        e1_indexer_logits(q, w, c, s, b, GLM5)


def test_plan_pages_per_split():
    sms = 132
    assert plan_pages_per_split(16, 8192, sms) == 4      # 2048 pages over 528 CTA slots: one wave of 512
    assert plan_pages_per_split(64, 8192, sms) == 16     # 512 CTAs of 16 pages
    assert plan_pages_per_split(256, 8192, sms) == 16    # capped: 2048 CTAs in waves
    assert plan_pages_per_split(1, 8192, sms) == 1       # 128 CTAs of one page
    assert plan_pages_per_split(1, 10, sms) == 1
    assert plan_pages_per_split(0, 0, sms) == 1
    assert plan_pages_per_split(600, 100, sms) == 2      # never more pages than a row has
    assert plan_pages_per_split(16, 8192, sms, 7) == 7
    for bad in (0, 17, True, 2.0):
        with pytest.raises(ValueError, match="pages_per_split"):
            plan_pages_per_split(16, 8192, sms, bad)
    assert grid_for(16, 8192, 4) == (32, 16, 1)
    assert grid_for(3, 8191, 4) == (32, 3, 1)
    assert grid_for(3, 8193, 4) == (33, 3, 1)
    # every plan fills the machine: at least one CTA per SM slot target unless the batch is tiny
    for m in (16, 64, 256):
        pps = plan_pages_per_split(m, 8192, sms)
        ctas = grid_for(m, 8192, pps)[0] * m
        assert ctas >= sms * CTAS_PER_SM * 0.9 or pps == MAX_PAGES_PER_SPLIT, (m, pps, ctas)


def test_smem_and_floor():
    # mirrors E1IndexerLogitsTile::kSmemBytes: 4 stages x 8448 + 16 x 64 x 4 + 16 x 4 (+pad) + 4 x 8
    assert config_for(32, 128).smem_bytes == 37984
    assert config_for(4, 64).smem_bytes == 4 * 4352 + 4096 + 64 + 32
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


# ---- CPU: the PDL wait-point switch (pdl_wait= / pdl_wait_at / GLM5_PDL_WAIT_AT) -------------------------

def _meta_args(m=5):
    meta = dict(device="meta")
    return (torch.empty(m, 32, 128, dtype=FP8, **meta), torch.empty(m, 32, **meta),
            torch.empty(9, 8448, dtype=torch.uint8, **meta), torch.empty(m, dtype=torch.int32, **meta),
            torch.empty(m, 3, dtype=torch.int32, **meta))


def test_pdl_wait_entry_point_and_schemas():
    p = inspect.signature(e1_indexer_logits).parameters["pdl_wait"]
    assert p.default is None and p.kind == inspect.Parameter.KEYWORD_ONLY
    for name in ("e1_indexer_logits", "e1_indexer_logits_out"):
        schema = str(getattr(torch.ops.glm5_fastpath, name).default._schema)
        assert "Int pdl_wait_at=2" in schema, schema
    args = _meta_args()
    for wait in (None,) + WAIT_POINTS:  # every point gets through the entry point to the fake impls
        for mbw in (True, False):
            got = e1_indexer_logits(*args, GLM5, max_ctx=150, pdl_wait=wait, meta_before_wait=mbw)
            assert tuple(got.shape) == (5, 150)
            out = torch.empty(5, 192, device="meta")
            assert e1_indexer_logits(*args, GLM5, out=out, pdl_wait=wait, meta_before_wait=mbw) is out


@pytest.mark.parametrize("bad", ["early", "ENTRY", "native", 0, 2, True, 1.0])
def test_bad_pdl_wait_raises_naming_the_op(bad):
    with pytest.raises(ValueError, match=rf"glm5_fastpath.e1_indexer_logits: pdl_wait={bad!r}"):
        e1_indexer_logits(*_meta_args(), GLM5, max_ctx=150, pdl_wait=bad)
    # validated before anything else (like every op's entry point): even with no tensors at all
    with pytest.raises(ValueError, match=rf"e1_indexer_logits.*pdl_wait={bad!r}"):
        e1_indexer_logits(None, None, None, None, None, None, pdl_wait=bad)


@pytest.mark.parametrize("code", [0, 1, 2])
def test_fake_impls_take_every_wait_code(code):
    args = _meta_args()
    out = torch.ops.glm5_fastpath.e1_indexer_logits(*args, 150, 0, True, True, code)
    assert tuple(out.shape) == (5, 150) and out.dtype == torch.float32
    torch.ops.glm5_fastpath.e1_indexer_logits_out(*args, torch.empty(5, 192, device="meta"), 0, True, False, code)


@pytest.mark.parametrize("bad", [3, -1, 7])
def test_fake_impls_reject_a_bad_wait_code(bad):
    args = _meta_args()
    with pytest.raises(ValueError, match=f"e1_indexer_logits.*pdl_wait_at={bad}"):
        torch.ops.glm5_fastpath.e1_indexer_logits(*args, 150, 0, True, True, bad)
    with pytest.raises(ValueError, match=f"e1_indexer_logits.*pdl_wait_at={bad}"):
        torch.ops.glm5_fastpath.e1_indexer_logits_out(*args, torch.empty(5, 192, device="meta"), 0, True, True, bad)


@pytest.mark.parametrize("heads, dim", [(32, 128), (4, 64)])
def test_specs_carry_the_wait_define_only_when_not_native(heads, dim):
    native = config_for(heads, dim)
    assert native.wait_at == 2
    assert dict(native.spec.defines) == {"GLM5_E1_HEADS": str(heads), "GLM5_E1_DIM": str(dim), "GLM5_E1_STAGES": "4",
                                         "GLM5_E1_MAX_PAGES": str(MAX_PAGES_PER_SPLIT), "GLM5_E1_THREADS": "128"}
    assert dataclasses.replace(native, wait_at=2).spec == native.spec  # native: the default cubin, same cache key
    for code in (0, 1):
        c = dataclasses.replace(native, wait_at=code)
        d = dict(c.spec.defines)
        assert d.pop("GLM5_PDL_WAIT_AT") == str(code)
        assert d == dict(native.spec.defines)
        assert c.spec.source == native.spec.source and c.spec.functions == native.spec.functions
        assert c.smem_bytes == native.smem_bytes


@pytest.mark.parametrize("heads, dim", [(32, 128), (4, 64), (20, 128), (17, 64), (1, 128)])
def test_fragment_index_math_emulation(heads, dim):
    """A numpy emulation of the kernel's lane -> (head, token, dim) mapping (csrc/attn_pre/
    e1_indexer_logits.cuh: 16-byte chunks c*64 + t*16, f16 pairs 2s / 2s+1 per m16n8k16 step, PTX
    fragment layouts, epilogue shuffles) reproduces the plain formula for one page."""
    rng = np.random.default_rng(heads * dim)
    q = rng.integers(-8, 8, size=(heads, dim)).astype(np.float64)
    k = rng.integers(-8, 8, size=(PAGE, dim)).astype(np.float64)
    sk = rng.random(PAGE) + 0.5
    w = rng.standard_normal(heads)
    want = (np.maximum(q @ k.T, 0) * w[:, None]).sum(0) * sk
    mtiles, chunks, steps = (heads + 15) // 16, dim // 64, dim // 16

    def pairs(row, t):  # the lane's 16-byte chunks, as f16 pairs
        return np.concatenate([row[c * 64 + t * 16: c * 64 + t * 16 + 16] for c in range(chunks)]).reshape(-1, 2)

    zero = np.zeros((chunks * 8, 2))
    got = np.full(PAGE, np.nan)
    for warp in range(4):
        for j in range(2):
            base = warp * 16 + j * 8
            acc = np.zeros((32, mtiles, 4))
            for s in range(steps):
                for mt in range(mtiles):
                    a = np.full((16, 16), np.nan)
                    bm = np.full((16, 8), np.nan)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        h0, h1 = g + 16 * mt, g + 8 + 16 * mt
                        q0 = pairs(q[h0], t) if h0 < heads else zero
                        q1 = pairs(q[h1], t) if h1 < heads else zero
                        a[g, 2 * t:2 * t + 2], a[g + 8, 2 * t:2 * t + 2] = q0[2 * s], q1[2 * s]
                        a[g, 2 * t + 8:2 * t + 10], a[g + 8, 2 * t + 8:2 * t + 10] = q0[2 * s + 1], q1[2 * s + 1]
                        kp = pairs(k[base + g], t)
                        bm[2 * t:2 * t + 2, g], bm[2 * t + 8:2 * t + 10, g] = kp[2 * s], kp[2 * s + 1]
                    d = a @ bm  # every fragment slot filled exactly once, else NaN spreads
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        acc[lane, mt] += (d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1])
            wl = lambda lane, r: w[(lane >> 2) + 8 * r] if (lane >> 2) + 8 * r < heads else 0.0  # noqa: E731
            p = np.zeros((32, 2))
            for lane in range(32):
                for mt in range(mtiles):
                    x = np.maximum(acc[lane, mt], 0)
                    p[lane] += (wl(lane, 2 * mt) * x[0] + wl(lane, 2 * mt + 1) * x[2],
                                wl(lane, 2 * mt) * x[1] + wl(lane, 2 * mt + 1) * x[3])
            for off in (4, 8, 16):
                p = p + p[np.arange(32) ^ off]
            for t in range(4):
                got[base + 2 * t: base + 2 * t + 2] = p[t] * sk[base + 2 * t: base + 2 * t + 2]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9 * np.abs(want).max())


try:
    from glm5_fastpath.jit import compile_kernel, find_nvcc
    find_nvcc()
    _HAVE_NVCC = True
except Exception:  # noqa: BLE001 - NvccNotFoundError or a broken toolkit: skip the compile test
    _HAVE_NVCC = False


@pytest.mark.skipif(not _HAVE_NVCC, reason="nvcc not found (compile tests need the CUDA toolkit)")
@pytest.mark.parametrize("wait_at", [2, 1, 0])
@pytest.mark.parametrize("heads, dim", [(32, 128), (4, 64), (20, 128)])
def test_compiles_for_sm90a_without_spills(heads, dim, wait_at, monkeypatch, tmp_path):
    from glm5_fastpath.jit import env
    for name in env.VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLM5_FASTPATH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GLM5_FASTPATH_PTXAS_VERBOSE", "1")
    ck = compile_kernel(dataclasses.replace(config_for(heads, dim), wait_at=wait_at).spec, "sm_90a")
    r = ck.resources()["glm5_e1_indexer_logits"]
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, r
    # <= 128 registers keeps >= 4 CTAs of 128 threads per SM (the planner's CTAS_PER_SM)
    assert 0 < r.registers <= 128, r


# ---- GPU --------------------------------------------------------------------------------------------

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
    """Diagnostic for the mma.sync fragment / K-permutation mapping: row m's q is one-hot
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
def test_deterministic_across_runs_splits_and_flags(seed, no_pdl_override):
    lens = [8191, 65, 1, 4097, 2048, 3000, 64, 129]
    case = Case(GLM5, lens, seed)
    base = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192)
    outs = {"again": e1_indexer_logits(*case.args(), GLM5, max_ctx=8192)}
    for pps in (1, 2, 3, 5, MAX_PAGES_PER_SPLIT):
        outs[f"{pps=}"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, pages_per_split=pps)
    outs["pdl off"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, pdl=False)
    outs["meta after wait"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, meta_before_wait=False)
    for wait in WAIT_POINTS:  # the GLM5_PDL_WAIT_AT cubins: bitwise the native one
        for mbw in (True, False):
            outs[f"pdl_wait={wait} {mbw=}"] = e1_indexer_logits(*case.args(), GLM5, max_ctx=8192, pdl_wait=wait,
                                                                meta_before_wait=mbw)
    torch.cuda.synchronize()
    check(base, reference(case, 8192), lens, "base")
    for name, o in outs.items():
        assert_equal(OP, o, base, context=name)


@pytest.mark.gpu
@pytest.mark.parametrize("lens_kind", ["ones_263", "zeros_and_ones_300", "all_zero_but_one", "many_short_1000"])
def test_tiny_and_empty_rows(lens_kind, seed, no_pdl_override):
    """ctx = 1 everywhere (one live token per row, many all -inf splits), empty rows (seq_len 0)
    among short ones, and M = 1000 short rows."""
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
    """Rows of 100k tokens (1563 pages: the 4-stage ring wraps several times per split, and the
    grid has ~130 splits per row) next to tiny ones."""
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


@pytest.mark.gpu
@pytest.mark.parametrize("meta_before_wait", [True, False])
@pytest.mark.parametrize("written", ["q_fp8", "head_w", "index_k_cache"])
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_e1_waits_for_the_previous_kernel_under_pdl(written, m, meta_before_wait, seed, no_pdl_override,
                                                    pdl_wait=None):
    """The producer spins ~50 us, then writes one input; E1, launched right after it with PDL
    (reading metadata and L2-prefetching pages before its wait, or not), must see the new values."""
    producer = late_producer()
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
    e1_indexer_logits(*args, GLM5, max_ctx=width, pdl_wait=pdl_wait)  # compile + load outside the timed sequence
    for _ in range(3):
        stale.view(torch.uint8).zero_()
        out = poison_(torch.empty(m, width, device="cuda"))
        torch.cuda.synchronize()
        produce(producer, true_args[idx], stale)
        e1_indexer_logits(*args, GLM5, out=out, pdl=True, meta_before_wait=meta_before_wait, pdl_wait=pdl_wait)
        torch.cuda.synchronize()
        check(out, ref, lens, f"PDL after a producer writing {written}, {m=}, {meta_before_wait=}, {pdl_wait=}")


@pytest.mark.gpu
@pytest.mark.parametrize("pdl_wait", ["entry", "after_prologue"])
@pytest.mark.parametrize("written", ["q_fp8", "head_w", "index_k_cache"])
def test_early_wait_points_still_wait_for_the_previous_kernel(written, pdl_wait, seed, no_pdl_override):
    """The GLM5_PDL_WAIT_AT=0 / 1 cubins (the CMP benchmark's PDL decomposition) keep the ordering."""
    test_e1_waits_for_the_previous_kernel_under_pdl(written, 16, True, seed, None, pdl_wait=pdl_wait)


# ---- CUDA graphs ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 16])
def test_cuda_graph_capture_and_replay_with_changing_lengths(m, seed, no_pdl_override):
    producer = late_producer()
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
        produce(producer, q_src, static_q)  # producer -> E1 with a PDL edge
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
    (how the benchmark times it): a launch's early CTAs read the block table and L2-prefetch while
    the previous one still streams, and its writes wait for the previous one to finish. Replayed twice, outputs
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
    torch.library.opcheck(torch.ops.glm5_fastpath.e1_indexer_logits.default, (*args, 192, 0, True, True, 1),
                          test_utils=("test_faketensor",))
    for op, want in ((torch.ops.glm5_fastpath.e1_indexer_logits.default, []),
                     (torch.ops.glm5_fastpath.e1_indexer_logits_out.default, ["logits"])):
        written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert written == want, (op, written)


@pytest.mark.gpu
def test_kernel_resources_report():
    """No local memory (spills), the parameter layout check is active, >= 4 CTAs fit per SM."""
    from glm5_fastpath.jit import get_kernel
    k = get_kernel(config_for(32, 128).spec)
    assert k.local_bytes == 0, k
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4), k.param_sizes
    assert 0 < k.num_regs <= 128 and k.max_threads >= 128, k
