"""D2 W8A16 (glm5_fastpath.d2_absorb_kv_store_w8): W_UK as e4m3 + per-row fp32 scales, bitwise the bf16 op.

The W8 kernel rebuilds bf16_rn(fp32(e4m3) * s) in shared memory and then runs the bf16 kernel's MMA and
epilogue code, so the bar is bit equality with the bf16 op (glm5_fastpath.d2_absorb_kv_store) run on
ref.fp8.dequant_w_kc(w_kc8, w_kc_scale): q_lat and every kv_cache row, for all M of the decode range
(the bf16 op itself is checked against the reference in test_d2_absorb.py).

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings. The CPU tests check argument
validation (errors name the W8 op), the fake implementation, the entry point's dispatch (W8 when the
weights carry w_kc_fp8 and no w_kc), the specs / precompile listing, the claim that the kernel's
e4m3 -> f16 -> fp32 path is exact (so its conversion is dequant_w_kc's), a Python mirror of the
kernel's copy / conversion layout (every swizzled bf16 chunk written once, where the bf16 copies put
it, conflict-free), and (where nvcc exists) that the W8 builds compile without spills.
"""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops import d2_absorb as D
from glm5_fastpath.ops.d2_absorb import config_for, d2_absorb_and_kv_store, uses_w8
from glm5_fastpath.ref.fp8 import dequant_w_kc, w_kc_fp8_from_kv_b
from glm5_fastpath.testing.numerics import assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "d2_absorb_kv_store_w8"
OP_FULL = "glm5_fastpath.d2_absorb_kv_store_w8"
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]
GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")


# ---- helpers ------------------------------------------------------------------------------------------

def make_inputs(cfg: Glm5Config, m: int, seed: int, device: str = "cuda", num_slots: int | None = None,
                idx_dtype=torch.int64):
    """q_nope, c_kv, k_pe, positions, out_cache_loc, kv_cache (as test_d2_absorb.make_inputs)."""
    g = torch.Generator().manual_seed(seed)
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    q_nope = (torch.randn(m, h, nope, generator=g) * 2.0).to(BF16)
    q_nope[:, :, ::37] *= 8.0  # a few large channels
    c_kv = torch.randn(m, kvl, generator=g).to(BF16)
    k_pe = (torch.randn(m, r, generator=g) * 3.0).to(BF16)
    num_slots = num_slots or max(4 * m, 64)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,), generator=g)
    if m >= 2:
        positions[0] = 0
        positions[1] = cfg.max_position_embeddings - 1
    out_cache_loc = torch.randperm(num_slots, generator=g)[:m]
    kv_cache = torch.randn(num_slots, kvl + r, generator=g).to(BF16)
    ts = [q_nope, c_kv, k_pe, positions.to(idx_dtype), out_cache_loc.to(idx_dtype), kv_cache]
    return [t.to(device) for t in ts]


def _random_e4m3(shape, g: torch.Generator) -> torch.Tensor:
    """Uniformly random e4m3 bit patterns (normals, subnormals, +-0; never NaN)."""
    b = torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
    b[(b & 0x7F) == 0x7F] = 0x7E  # 0x7f / 0xff are NaN in e4m3fn
    return b.view(FP8)


def _random_scales(shape, g: torch.Generator) -> torch.Tensor:
    """fp32 scales with full random mantissas over 2^-14 .. 2^-4 (the products need real rounding to bf16)."""
    mant = 1.0 + torch.rand(shape, generator=g, dtype=torch.float32)
    return torch.ldexp(mant, torch.randint(-14, -4, shape, generator=g)).float()


def make_w8(cfg: Glm5Config, seed: int, device: str = "cuda", from_kv_b: bool = False):
    """(w_kc8 [heads, nope, kv_lora] e4m3, w_kc_scale [heads, nope, kv_lora/128] fp32).
    from_kv_b: through ref.fp8.w_kc_fp8_from_kv_b on a random FP8 kv_b_proj (128-row scale blocks, as a
    checkpoint); else random per-row scales (every row its own scale: the kernel's row -> scale mapping)."""
    g = torch.Generator().manual_seed(seed)
    h, nope, kvl, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    if from_kv_b:
        rows = h * (nope + v)
        kv_b8 = _random_e4m3((rows, kvl), g)
        kv_b_scale = _random_scales(((rows + 127) // 128, kvl // 128), g)
        w8, s = w_kc_fp8_from_kv_b(kv_b8, kv_b_scale, h, nope)
    else:
        w8, s = _random_e4m3((h, nope, kvl), g), _random_scales((h, nope, kvl // 128), g)
    return w8.contiguous().to(device), s.contiguous().to(device)


def w8_weights(w8: torch.Tensor, s: torch.Tensor) -> types.SimpleNamespace:
    """AttnWeights-like: no bf16 w_kc, the FP8 form set (the entry point's W8 path)."""
    return types.SimpleNamespace(w_kc=None, w_kc_fp8=w8, w_kc_scale=s)


def poison_rows_(kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    kv_cache[slots.long()] = float("nan")


def _poison_next_alloc(m: int, cfg: Glm5Config) -> None:
    """Leave a NaN-filled block of q_lat's size in the caching allocator: the op's torch.empty for q_lat
    usually gets it back, so an element the kernel fails to write shows up as NaN (best effort; the graph
    test poisons its static q_lat explicitly)."""
    t = torch.empty(m, cfg.num_attention_heads, cfg.kv_lora_rank, dtype=BF16, device="cuda")
    poison_(t)
    del t


def assert_cache_bitwise(got: torch.Tensor, want: torch.Tensor, ctx: str) -> None:
    a, b = got.cpu().view(torch.int16), want.cpu().view(torch.int16)
    neq = (a != b).any(dim=1)
    assert not neq.any(), f"{OP} [{ctx}]: kv_cache rows {neq.nonzero().flatten()[:8].tolist()} differ from the bf16 op's"


def run_pair(cfg, w8, s, m, seed, ctx, idx_dtype=torch.int64, pdl=True):
    """The W8 op (through the entry point) and the bf16 op on dequant_w_kc(w8, s), each on a poisoned clone of
    the same cache: q_lat and the caches must be bitwise equal."""
    q, c, k, pos, loc, cache = make_inputs(cfg, m, seed, idx_dtype=idx_dtype)
    poison_rows_(cache, loc)
    cache8, cache16 = cache.clone(), cache.clone()
    w_kc = dequant_w_kc(w8, s)
    _poison_next_alloc(m, cfg)
    q8 = d2_absorb_and_kv_store(q, c, k, w8_weights(w8, s), pos, loc, cache8, cfg, pdl=pdl)
    torch.cuda.synchronize()
    assert_no_poison(OP, q8, names=["q_lat"])
    q16 = d2_absorb_and_kv_store(q, c, k, types.SimpleNamespace(w_kc=w_kc), pos, loc, cache16, cfg, pdl=pdl)
    torch.cuda.synchronize()
    assert_equal(OP, q8, q16, context=ctx + " q_lat vs the bf16 op")
    assert_no_poison(OP, cache8[loc.long()], names=["kv_cache target rows"])
    assert_cache_bitwise(cache8, cache16, ctx)
    return q8, cache8


# ---- CPU: numerics and layout of the conversion ------------------------------------------------------------

def test_e4m3_to_f16_to_f32_is_exact_so_the_conversion_is_dequant_w_kc():
    """The kernel converts e4m3 -> f16 (cvt.rn.f16x2.e4m3x2) -> fp32, then __fmul_rn and bf16 RNE: for every
    e4m3 value and a spread of scales that is ref.fp8.dequant_w_kc bit for bit."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # NaN codes -> 0: every other e4m3 value once, two 128-column blocks
    e4 = codes.view(FP8)
    assert torch.equal(e4.to(torch.float16).float(), e4.float())  # exact through f16
    g = torch.Generator().manual_seed(0)
    scales = torch.cat([_random_scales((59,), g), torch.tensor([1.0, 2.0 ** -20, 3.0e-3, 448.0, 2.0 ** 100])])
    w8 = e4.view(1, 1, 256).expand(len(scales), 1, 256).contiguous()
    s = torch.stack([scales, scales.flip(0)], -1).view(-1, 1, 2).contiguous()
    kernel_path = (w8.to(torch.float16).float() * s.repeat_interleave(128, -1)).to(BF16)
    assert_equal(OP, kernel_path, dequant_w_kc(w8, s), context="f16 path vs dequant_w_kc")


def _swz(k: int) -> int:
    return (((k >> 3) & 3) << 1) | (k & 1)


@pytest.mark.parametrize("nope", [64, 192])
def test_conversion_layout_emulation(nope):
    """Mirror of D2AbsorbTile<..., kW8>: issue_weight_copies_w8 (thread tid, K block kb: e4m3 row kb*32 + tid/8,
    16-byte chunk tid%8, and that row's scale into slot (kb, tid)) + convert_block_w8 (the same thread's chunk ->
    bf16 chunks 2c, 2c+1 at (chunk ^ swz(row)), the upper one first for c >= 4) rebuilds exactly the smem image
    issue_weight_copies makes from dequant_w_kc (so the unchanged ldmatrix code reads the same bits), each
    16-byte slot written once, each 8-thread phase of the staging load and of both stores conflict-free."""
    g = torch.Generator().manual_seed(nope)
    w8 = _random_e4m3((nope, 128), g)  # one head, one 128-column tile
    s = _random_scales((nope, 1), g)
    w = dequant_w_kc(w8.view(1, nope, 128), s.view(1, nope, 1))[0].view(torch.int16)
    want = torch.full((nope, 16, 8), -1, dtype=torch.int32)  # issue_weight_copies: chunk ch of row k at ch ^ swz(k)
    for k in range(nope):
        for ch in range(16):
            want[k, ch ^ _swz(k)] = w[k, ch * 8:ch * 8 + 8].to(torch.int32)
    got = torch.full_like(want, -1)
    writes = torch.zeros(nope, 16, dtype=torch.int32)
    for kb in range(nope // 32):
        stores = {0: [], 1: []}
        loads = []
        for tid in range(256):
            row, c = kb * 32 + (tid >> 3), tid & 7
            scale = s[row, 0]  # the slot (kb, tid) holds the scale of the row this thread converts
            loads.append((row * 128 + c * 16) // 16)
            vals = (w8[row, 16 * c:16 * c + 16].float() * scale).to(BF16).view(torch.int16).to(torch.int32)
            up = c >> 2
            chunks = [(2 * c + up, vals[8 * up:8 * up + 8]), (2 * c + 1 - up, vals[8 * (1 - up):8 * (1 - up) + 8])]
            for i, (ch, v) in enumerate(chunks):
                pos = ch ^ _swz(row)
                got[row, pos] = v
                writes[row, pos] += 1
                stores[i].append((row * 256 + (pos << 4)) // 16)
        for tid0 in range(0, 256, 8):  # 16-byte accesses: 8-thread phases, 8 bank groups of 16 bytes
            assert len({a % 8 for a in loads[tid0:tid0 + 8]}) == 8
            for i in (0, 1):
                assert len({a % 8 for a in stores[i][tid0:tid0 + 8]}) == 8, (kb, tid0, i)
    assert torch.equal(writes, torch.ones_like(writes))
    assert torch.equal(got, want)


# ---- CPU: specs, precompile listing --------------------------------------------------------------------

def test_specs_and_smem():
    for n, k, r in ((192, 512, 64), (64, 128, 32)):
        for m in (1, 256):
            c16, c8 = config_for(n, k, r, m), config_for(n, k, r, m, w8=True)
            assert c8 == dataclasses.replace(c16, w8=True) and not c16.w8
            assert c16.spec.name == D.FUNCTION and c8.spec.name == D.FUNCTION_W8
            assert c8.spec.source == c16.spec.source == D.SOURCE
            assert "GLM5_D2_W8" not in dict(c16.spec.defines)  # the bf16 build's defines are those of before
            assert dict(c8.spec.defines) == {**dict(c16.spec.defines), "GLM5_D2_W8": "1"}
            # + the e4m3 tile (128 B per row) + the scale slots (nope/32 K blocks x 256 threads x 4 B)
            assert c8.smem_bytes == c16.smem_bytes + n * 128 + (n // 32) * 256 * 4
    assert config_for(192, 512, 64, 256, w8=True).smem_bytes == 100352 <= 113 * 1024  # two CTAs per SM
    early = dataclasses.replace(config_for(192, 512, 64, 16, w8=True), wait_at=0).spec
    assert dict(early.defines)["GLM5_PDL_WAIT_AT"] == "0" and dict(early.defines)["GLM5_D2_W8"] == "1"


def test_compile_check_specs_and_precompile_cover_w8(monkeypatch):
    from glm5_fastpath import ops
    specs = D.compile_check_specs()
    w8 = [s for s in specs if s.name == D.FUNCTION_W8]
    qcat = [s for s in specs if s.name.endswith("_qcat")]
    assert len(w8) == 4 and len(specs) == 12  # both dims x both M variants, bf16 and W8; + the q_cat form's 4
    assert sorted(s.name for s in qcat) == [D.FUNCTION + "_qcat"] * 2 + [D.FUNCTION_W8 + "_qcat"] * 2
    assert {(dict(s.defines)["GLM5_D2_NOPE"], dict(s.defines)["GLM5_D2_MT"]) for s in w8} == \
        {("192", "1"), ("192", "2"), ("64", "1"), ("64", "2")}
    assert all(s in ops.compile_check_specs() for s in w8)
    seen = []
    monkeypatch.setattr(D, "_kernel", lambda cfg, dev: seen.append(cfg))
    monkeypatch.setattr(D, "_inv_freq_on", lambda dev, r, theta: None)
    monkeypatch.delenv("GLM5_FASTPATH_D2_WEIGHTS", raising=False)
    D.precompile("cuda:0")  # W8 is opt-in: by default only the bf16 builds load
    assert sorted((c.mt, c.w8) for c in seen) == [(1, False), (2, False)]
    for want in ("fp8", "auto"):
        seen.clear()
        monkeypatch.setenv("GLM5_FASTPATH_D2_WEIGHTS", want)
        D.precompile("cuda:0")
        assert sorted((c.mt, c.w8) for c in seen) == [(1, False), (1, True), (2, False), (2, True)]
    seen.clear()
    D.precompile("cuda:0", w8=(False,))
    assert not any(c.w8 for c in seen) and len(seen) == 2


def test_w8_builds_without_spills(nvcc_jit):
    """ptxas: 0 spills; at most 96 registers (two 288-thread CTAs per SM under __launch_bounds__(288, 2));
    the only stack is the 40-byte frame of the double-precision trig slow path, as in the bf16 build."""
    for spec in (s for s in D.compile_check_specs() if s.name == D.FUNCTION_W8):
        res = nvcc_jit(spec).resources()[D.FUNCTION_W8]
        assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, (spec.describe(), res)
        assert 0 < res.registers <= 96 and res.stack_bytes <= 64, (spec.describe(), res)


# ---- CPU: validation, fake implementation, dispatch ------------------------------------------------------

def _cpu_args(m=3, cfg=SMALL):
    q, c, k, pos, loc, cache = make_inputs(cfg, m, 0, device="cpu")
    w8, s = make_w8(cfg, 1, device="cpu")
    return [q, c, k, w8_weights(w8, s), pos, loc, cache, cfg]


def _set_w(a, **kw):
    a[3] = types.SimpleNamespace(**{**vars(a[3]), **kw})


@pytest.mark.parametrize("mutate, match", [
    (lambda a: _set_w(a, w_kc_fp8=a[3].w_kc_fp8.view(torch.uint8)), "w_kc8 must be torch.float8_e4m3fn"),
    (lambda a: _set_w(a, w_kc_fp8=a[3].w_kc_fp8.float().to(BF16)), "w_kc8 must be torch.float8_e4m3fn"),
    (lambda a: _set_w(a, w_kc_fp8=a[3].w_kc_fp8[0]), "w_kc8 must be 3-D"),
    (lambda a: _set_w(a, w_kc_fp8=a[3].w_kc_fp8.transpose(0, 1).contiguous().transpose(0, 1)),
     "w_kc8 must be contiguous"),
    (lambda a: _set_w(a, w_kc_fp8=a[3].w_kc_fp8[:2].contiguous()), r"w_kc8 must be \[heads=4, nope=64"),
    (lambda a: _set_w(a, w_kc_scale=None), "w_kc_scale must be a torch.Tensor, got NoneType"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale.double()), "w_kc_scale must be torch.float32"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale.to(BF16)), "w_kc_scale must be torch.float32"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale[0]), "w_kc_scale must be 3-D"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale.repeat(1, 1, 2)), r"w_kc_scale must be \[heads=4, nope=64, "
                                                                       r"kv_lora/128=1\]"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale[:, :32].contiguous()), r"w_kc_scale must be \[heads"),
    (lambda a: _set_w(a, w_kc_scale=torch.zeros(64, 4, 2).transpose(0, 1)[:, :, :1]), "w_kc_scale must be contiguous"),
    (lambda a: _set_w(a, w_kc_scale=a[3].w_kc_scale.to("meta")), "all tensors must be on one device"),
    (lambda a: a.__setitem__(0, a[0].float()), "q_nope must be torch.bfloat16"),
    (lambda a: a.__setitem__(1, a[1][:2].contiguous()), "c_kv must be"),
    (lambda a: a.__setitem__(5, a[5].int()), "same dtype"),
    (lambda a: a.__setitem__(6, a[6].float()), "kv_cache must be torch.bfloat16"),
    (lambda a: a.__setitem__(7, GLM5), "do not match the config"),
    (lambda a: None, "CUDA device"),
])
def test_bad_inputs_raise_naming_the_w8_op(mutate, match):
    a = _cpu_args()
    mutate(a)
    with pytest.raises(ValueError, match=match) as ei:
        d2_absorb_and_kv_store(*a)
    assert OP_FULL in str(ei.value)


def test_too_many_tokens_bad_dims_and_wait_codes():
    a = _cpu_args(m=257)
    with pytest.raises(ValueError, match=f"{OP_FULL}: M=257 tokens exceeds the supported maximum of 256"):
        d2_absorb_and_kv_store(*a)
    a = _cpu_args()
    with pytest.raises(ValueError, match=f"{OP_FULL}: pdl_wait='early'"):
        d2_absorb_and_kv_store(*a, pdl_wait="early")
    q, c, k, w, pos, loc, cache, _ = _cpu_args()
    op = torch.ops.glm5_fastpath.d2_absorb_kv_store_w8
    with pytest.raises(ValueError, match=f"{OP_FULL}: pdl_wait_at=3"):
        op(q, c, k, w.w_kc_fp8, w.w_kc_scale, pos, loc, cache, 1e4, True, 3)
    with pytest.raises(ValueError, match=f"{OP_FULL}: rope_theta"):
        op(q, c, k, w.w_kc_fp8, w.w_kc_scale, pos, loc, cache, float("inf"), True)
    # kv_lora 192: not a multiple of 128 (the scale blocks and the kernel's tiles)
    args = [torch.zeros(2, 4, 64, dtype=BF16), torch.zeros(2, 192, dtype=BF16), torch.zeros(2, 32, dtype=BF16),
            torch.zeros(4, 64, 192, dtype=torch.uint8).view(FP8), torch.ones(4, 64, 2),
            torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.zeros(8, 224, dtype=BF16), 1e4]
    with pytest.raises(ValueError, match=f"{OP_FULL}: kv_lora_rank=192 is not supported"):
        op(*args, True)


def test_fake_shapes_and_schema():
    meta = dict(device="meta")
    q = torch.empty(5, 64, 192, dtype=BF16, **meta)
    out = torch.ops.glm5_fastpath.d2_absorb_kv_store_w8(
        q, torch.empty(5, 512, dtype=BF16, **meta), torch.empty(5, 64, dtype=BF16, **meta),
        torch.empty(64, 192, 512, dtype=FP8, **meta), torch.empty(64, 192, 4, dtype=torch.float32, **meta),
        torch.empty(5, dtype=torch.long, **meta), torch.empty(5, dtype=torch.long, **meta),
        torch.empty(99, 576, dtype=BF16, **meta), GLM5.rope_theta, True)
    assert tuple(out.shape) == (5, 64, 512) and out.dtype == BF16
    schema = torch.ops.glm5_fastpath.d2_absorb_kv_store_w8.default._schema
    written = [x.name for x in schema.arguments if x.alias_info is not None and x.alias_info.is_write]
    assert written == ["kv_cache"], written
    assert [x.name for x in schema.arguments] == ["q_nope", "c_kv", "k_pe", "w_kc8", "w_kc_scale", "positions",
                                                  "out_cache_loc", "kv_cache", "rope_theta", "pdl", "pdl_wait_at"]
    assert "Int pdl_wait_at=2" in str(schema)


def test_entry_point_dispatch(monkeypatch):
    """W8 iff w.w_kc is None and w.w_kc_fp8 is not None; its arguments are forwarded as they are."""
    calls = []
    ns = torch.ops.glm5_fastpath
    monkeypatch.setattr(ns, "d2_absorb_kv_store_w8", lambda *a: calls.append(("w8", a)) or "w8")
    monkeypatch.setattr(ns, "d2_absorb_kv_store", lambda *a: calls.append(("bf16", a)) or "bf16")
    q, c, k, w, pos, loc, cache, cfg = _cpu_args()
    assert d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, cfg, pdl=False, pdl_wait="entry") == "w8"
    (name, args), = calls
    assert name == "w8" and args[3] is w.w_kc_fp8 and args[4] is w.w_kc_scale and args[7] is cache
    assert args[8:] == (float(cfg.rope_theta), False, 0)
    w_kc = dequant_w_kc(w.w_kc_fp8, w.w_kc_scale)
    for ww in (types.SimpleNamespace(w_kc=w_kc),  # no FP8 fields at all
               types.SimpleNamespace(w_kc=w_kc, w_kc_fp8=w.w_kc_fp8, w_kc_scale=w.w_kc_scale),  # both: bf16 wins
               types.SimpleNamespace(w_kc=w_kc, w_kc_fp8=None, w_kc_scale=None)):
        calls.clear()
        assert not uses_w8(ww)
        assert d2_absorb_and_kv_store(q, c, k, ww, pos, loc, cache, cfg) == "bf16"
        assert calls[0][0] == "bf16" and calls[0][1][3] is w_kc
    assert uses_w8(w) and not uses_w8(types.SimpleNamespace(w_kc=None, w_kc_fp8=None))
    # neither form: the bf16 path's error (names the bf16 entry point)
    with pytest.raises(ValueError, match="glm5_fastpath.d2_absorb_and_kv_store: w_kc must be a torch.Tensor"):
        d2_absorb_and_kv_store(q, c, k, types.SimpleNamespace(w_kc=None, w_kc_fp8=None), pos, loc, cache, cfg)


def test_entry_point_dispatch_on_meta_tensors():
    """The real ops on meta tensors (their fake implementations): both paths give q_lat's shape."""
    q, c, k, w, pos, loc, cache, cfg = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in _cpu_args()]
    w = w8_weights(w.w_kc_fp8.to("meta"), w.w_kc_scale.to("meta"))
    out = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, cfg)
    assert out.device.type == "meta" and tuple(out.shape) == (3, 4, 128) and out.dtype == BF16


# ---- GPU: bitwise equal to the bf16 op ------------------------------------------------------------------

@pytest.fixture(scope="module")
def glm5_w8():
    return make_w8(GLM5, 1234)


@pytest.fixture(scope="module")
def small_w8():
    return make_w8(SMALL, 99)


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_bitwise_equal_to_bf16_op_glm5(m, seed, glm5_w8, no_pdl_override):
    run_pair(GLM5, *glm5_w8, m, seed + m, f"glm5 {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_bitwise_equal_to_bf16_op_small_preset(m, seed, small_w8):
    run_pair(SMALL, *small_w8, m, seed + m, f"small {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_bitwise_equal_from_checkpoint_kv_b(m, seed):
    """W_UK from a random FP8 kv_b_proj through ref.fp8.w_kc_fp8_from_kv_b (per-head row offsets 448h)."""
    for cfg in (GLM5, SMALL):
        w8, s = make_w8(cfg, seed, from_kv_b=True)
        run_pair(cfg, w8, s, m, seed + m, f"kv_b {cfg.num_attention_heads} heads {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 33, 200])
def test_int32_indices_and_pdl_off(m, seed, glm5_w8, small_w8):
    run_pair(GLM5, *glm5_w8, m, seed, f"glm5 int32 pdl off {m=}", idx_dtype=torch.int32, pdl=False)
    run_pair(SMALL, *small_w8, m, seed, f"small int32 {m=}", idx_dtype=torch.int32)


@pytest.mark.gpu
def test_entry_point_paths_agree(seed):
    """AttnWeights-like object with both forms: the bf16 path runs; with w_kc=None the W8 path; same bits."""
    w8, s = make_w8(GLM5, seed + 7)
    q, c, k, pos, loc, cache = make_inputs(GLM5, 16, seed)
    both = types.SimpleNamespace(w_kc=dequant_w_kc(w8, s), w_kc_fp8=w8, w_kc_scale=s)
    only8 = types.SimpleNamespace(**{**vars(both), "w_kc": None})
    c2 = cache.clone()
    a = d2_absorb_and_kv_store(q, c, k, both, pos, loc, cache, GLM5)
    b = d2_absorb_and_kv_store(q, c, k, only8, pos, loc, c2, GLM5)
    torch.cuda.synchronize()
    assert_equal(OP, b, a, context="W8 path vs bf16 path")
    assert_cache_bitwise(c2, cache, "W8 path vs bf16 path")


@pytest.mark.gpu
def test_out_of_range_slot_is_skipped_and_empty_batch(seed, glm5_w8):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 4, seed, num_slots=64)
    w = w8_weights(*glm5_w8)
    loc[2], loc[3] = 64, -1
    c8, c16 = cache.clone(), cache.clone()
    a = d2_absorb_and_kv_store(q, c, k, w, pos, loc, c8, GLM5)
    b = d2_absorb_and_kv_store(q, c, k, types.SimpleNamespace(w_kc=dequant_w_kc(*glm5_w8)), pos, loc, c16, GLM5)
    torch.cuda.synchronize()
    assert_equal(OP, a, b, context="q_lat with skipped slots")
    assert_cache_bitwise(c8, c16, "skipped slots")
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[loc[:2].long().cpu()] = False
    assert torch.equal(c8.cpu()[untouched].view(torch.int16), cache.cpu()[untouched].view(torch.int16))
    empty = make_inputs(GLM5, 0, seed)
    out = d2_absorb_and_kv_store(*empty[:3], w, *empty[3:], GLM5)
    assert tuple(out.shape) == (0, 64, 512)


@pytest.mark.gpu
def test_gpu_error_cases(glm5_w8):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 4, 0)
    w8, s = glm5_w8
    buf = torch.empty(w8.numel() + 16, dtype=torch.uint8, device="cuda")
    mis = buf[1:1 + w8.numel()].view(FP8).view(w8.shape)
    with pytest.raises(ValueError, match=f"{OP_FULL}: w_kc8 data must be 16-byte aligned"):
        d2_absorb_and_kv_store(q, c, k, w8_weights(mis, s), pos, loc, cache, GLM5)
    sbuf = torch.empty(s.numel() + 1, dtype=torch.float32, device="cuda")
    s_off = sbuf[1:].view(s.shape)  # 4-byte aligned, not 16: fine for the scales (scalar loads)
    s_off.copy_(s)
    d2_absorb_and_kv_store(q, c, k, w8_weights(w8, s_off), pos, loc, cache.clone(), GLM5)
    with pytest.raises(ValueError, match=f"{OP_FULL}: all tensors must be on one device"):
        d2_absorb_and_kv_store(q, c, k, w8_weights(w8, s.cpu()), pos, loc, cache, GLM5)
    with pytest.raises(ValueError, match=f"{OP_FULL}: kv_cache overlaps input c_kv"):
        d2_absorb_and_kv_store(q, cache.view(-1)[: 4 * 512].view(4, 512), k, w8_weights(w8, s), pos, loc, cache, GLM5)


# ---- GPU: PDL, CUDA graphs, torch.compile ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_waits_for_the_late_producer_under_pdl(m, seed, glm5_w8, no_pdl_override):
    """The producer (q_nope's writer) spins ~50 us, then writes q_nope; the W8 kernel launched with PDL right
    behind it streams its e4m3 tile and scales early but must read only the fresh q_nope."""
    producer = late_producer()
    q_true, c, k, pos, loc, cache = make_inputs(GLM5, m, seed)
    w = w8_weights(*glm5_w8)
    want_cache = cache.clone()
    poison_rows_(want_cache, loc)
    want = d2_absorb_and_kv_store(q_true, c, k, types.SimpleNamespace(w_kc=dequant_w_kc(*glm5_w8)), pos, loc,
                                  want_cache, GLM5, pdl=False)
    d2_absorb_and_kv_store(q_true, c, k, w, pos, loc, cache.clone(), GLM5)  # compile + load first
    q = torch.full_like(q_true, 7.0)
    for _ in range(3):
        q.fill_(7.0)
        poison_rows_(cache, loc)
        torch.cuda.synchronize()
        produce(producer, q_true, q)
        _poison_next_alloc(m, GLM5)
        q_lat = d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, GLM5, pdl=True)
        torch.cuda.synchronize()
        assert_equal(OP, q_lat, want, context=f"PDL after producer {m=}")
        assert_cache_bitwise(cache, want_cache, f"PDL after producer {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 100])
def test_cuda_graph_capture_and_replay(m, seed, glm5_w8, no_pdl_override):
    producer = late_producer()
    w = w8_weights(*glm5_w8)
    w16 = types.SimpleNamespace(w_kc=dequant_w_kc(*glm5_w8))
    q_src, c, k, pos, loc, cache = make_inputs(GLM5, m, seed, num_slots=4 * 256)
    static_q = torch.empty_like(q_src)
    d2_absorb_and_kv_store(q_src, c, k, w, pos, loc, cache.clone(), GLM5)  # warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, q_src, static_q)  # producer -> D2 W8 with a PDL edge
        q_lat = d2_absorb_and_kv_store(static_q, c, k, w, pos, loc, cache, GLM5, pdl=True)
    for step in range(3):
        nq, nc, nk, npos, nloc, _ = make_inputs(GLM5, m, seed + 100 + step, num_slots=4 * 256)
        for dst, src in ((q_src, nq), (c, nc), (k, nk), (pos, npos), (loc, nloc)):
            dst.copy_(src)
        poison_rows_(cache, loc)
        want_cache = cache.clone()
        poison_(q_lat)
        static_q.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        want = d2_absorb_and_kv_store(nq, nc, nk, w16, npos, nloc, want_cache, GLM5, pdl=False)
        torch.cuda.synchronize()
        assert_equal(OP, q_lat, want, context=f"graph replay {step} {m=}")
        assert_cache_bitwise(cache, want_cache, f"graph replay {step} {m=}")


@pytest.mark.gpu
def test_torch_compile_fullgraph_and_opcheck(seed, glm5_w8):
    q, c, k, pos, loc, cache = make_inputs(GLM5, 8, seed)
    w8, s = glm5_w8
    theta = float(GLM5.rope_theta)

    def f(q, c, k, pos, loc, cache):
        return torch.ops.glm5_fastpath.d2_absorb_kv_store_w8(q, c, k, w8, s, pos, loc, cache, theta, True).float() * 2.0

    cache2 = cache.clone()
    want = f(q, c, k, pos, loc, cache)
    got = torch.compile(f, fullgraph=True)(q, c, k, pos, loc, cache2)
    torch.cuda.synchronize()
    assert_equal(OP, got, want, context="torch.compile q_lat")
    assert_equal(OP, cache2, cache, context="torch.compile kv_cache (mutation kept)")
    # test_schema is left out: its SchemaCheckMode compares every input before / after with a mul, which torch 2.11
    # does not implement for float8_e4m3fn on CUDA (H200, session 24 c6: "mul_cuda" not implemented). What it would
    # check for the inputs the schema marks read-only is checked here instead: they are bitwise unchanged.
    before = [t.clone() for t in (q, c, k, w8, s, pos, loc)]
    torch.ops.glm5_fastpath.d2_absorb_kv_store_w8(q, c, k, w8, s, pos, loc, cache, theta, True)
    torch.cuda.synchronize()
    for name, t0, t1 in zip(("q_nope", "c_kv", "k_pe", "w_kc8", "w_kc_scale", "positions", "out_cache_loc"),
                            before, (q, c, k, w8, s, pos, loc)):
        assert torch.equal(t0.view(torch.uint8), t1.view(torch.uint8)), f"{OP} wrote its read-only input {name}"
    torch.library.opcheck(torch.ops.glm5_fastpath.d2_absorb_kv_store_w8.default,
                          (q, c, k, w8, s, pos, loc, cache, theta, True), test_utils=("test_faketensor",))


@pytest.mark.gpu
def test_kernel_resources_report():
    from glm5_fastpath.jit import get_kernel
    for m in (1, 256):
        kern = get_kernel(config_for(192, 512, 64, m, w8=True).spec)
        assert kern.local_bytes <= 64, kern
        assert kern.param_sizes is None or kern.param_sizes == (8,) * 11 + (4, 4, 4), kern.param_sizes
        assert 0 < kern.num_regs <= 112 and kern.max_threads >= 288, kern  # two CTAs per SM
