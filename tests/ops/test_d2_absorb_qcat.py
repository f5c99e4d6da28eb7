"""D2's q_cat form (ops.d2_absorb.d2_absorb_qcat): q_cat = [q_lat | q_pe] and the latent-KV row into the scratch AND
SGLang's pool, against the plain D2 op (+ a concat and a second store) and the reference.

What is compared, and why each bar is where it is:
- q_cat[..., :kv_lora] must equal the plain op's q_lat bit for bit (the same tile code writes the same registers,
  only the head stride of the store differs), and q_cat[..., kv_lora:] must be q_pe's bits (a copy);
- both caches: target rows equal the plain op's rows bit for bit, every other row untouched (poisoned before, compared
  bytewise); a pool slot outside the pool is skipped;
- the q_pe copy reads D0's output after griddepcontrol.wait: a late producer writes q_pe under PDL.
CPU: argument validation naming the op, the fake implementation's shape and mutated arguments, the reference.
"""
from __future__ import annotations

import types

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops import d2_absorb as D
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.numerics import assert_equal, poison_

OP = "d2_absorb_kv_store_qcat"
BF16 = torch.bfloat16
GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")


def make_inputs(cfg, m, seed, device="cpu", pool_slots=None):
    g = torch.Generator().manual_seed(seed)
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    q_nope = (torch.randn(m, h, nope, generator=g) * 2.0).to(BF16)
    c_kv = torch.randn(m, kvl, generator=g).to(BF16)
    k_pe = (torch.randn(m, r, generator=g) * 3.0).to(BF16)
    q_pe = torch.randn(m, h, r, generator=g).to(BF16)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,), generator=g)
    kv_slots = torch.arange(m)
    scratch = torch.randn(m, kvl + r, generator=g).to(BF16)
    pool_slots = pool_slots or max(4 * m, 64)
    pool_loc = torch.randperm(pool_slots, generator=g)[:m]
    pool = torch.randn(pool_slots, kvl + r, generator=g).to(BF16)
    return [t.to(device) for t in (q_nope, c_kv, k_pe, q_pe, positions, kv_slots, scratch, pool_loc, pool)]


# ---- CPU ----------------------------------------------------------------------------------------------------

def test_reference_is_concat_and_two_stores(seed):
    from glm5_fastpath.weights import random_layer

    w = random_layer(SMALL, 1, seed).attn
    q_nope, c_kv, k_pe, q_pe, pos, slots, scratch, loc, pool = make_inputs(SMALL, 5, seed)
    s2, p2 = scratch.clone(), pool.clone()
    q_cat = P.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, s2, q_pe, loc, p2, SMALL)
    s3 = scratch.clone()
    q_lat = P.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, pos, slots, s3, SMALL)
    kvl = SMALL.kv_lora_rank
    assert q_cat.shape == (5, SMALL.num_attention_heads, SMALL.kv_cache_dim) and q_cat.is_contiguous()
    assert_equal(OP, q_cat[..., :kvl], q_lat, context="q_lat part")
    assert_equal(OP, q_cat[..., kvl:], q_pe, context="q_pe part")
    assert_equal(OP, s2, s3, context="scratch")
    want = pool.clone()
    want[loc] = s3[slots]
    assert_equal(OP, p2, want, context="pool: target rows = the scratch rows, the rest untouched")


def _args(m=3, cfg=GLM5, device="meta"):
    h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    e = lambda *s, dtype=BF16: torch.empty(*s, dtype=dtype, device=device)  # noqa: E731
    return dict(q_nope=e(m, h, nope), c_kv=e(m, kvl), k_pe=e(m, r), w_kc=e(h, nope, kvl), w_kc_scale=None,
                positions=e(m, dtype=torch.int64), out_cache_loc=e(m, dtype=torch.int64), kv_cache=e(m, kvl + r),
                q_pe=e(m, h, r), pool_loc=e(m, dtype=torch.int64), kv_pool=e(50, kvl + r),
                rope_theta=cfg.rope_theta)


@pytest.mark.parametrize("change, match", [
    (dict(q_pe=lambda a: a["q_pe"][:, :, :32].contiguous()), "q_pe must be"),
    (dict(pool_loc=lambda a: a["pool_loc"].to(torch.int32)), "pool_loc must be torch.int64"),
    (dict(kv_pool=lambda a: a["kv_pool"][:, :512].contiguous()), "kv_pool must be"),
    (dict(kv_pool=lambda a: a["kv_pool"].to(torch.float16)), "kv_pool must be torch.bfloat16"),
    (dict(pool_loc=lambda a: a["pool_loc"][:2]), r"pool_loc must be \[M=3\]"),
    (dict(c_kv=lambda a: a["c_kv"][:2]), "c_kv must be"),  # a base-op check, reported under this op's name
])
def test_bad_inputs_raise_naming_the_op(change, match):
    a = _args(device="cpu")
    for k, f in change.items():
        a[k] = f(a)
    with pytest.raises(ValueError, match=match) as e:
        D._check_qcat(**a)
    assert str(e.value).startswith("glm5_fastpath.d2_absorb_kv_store_qcat: ")


def test_qcat_builds_without_spills(nvcc_jit):
    """ptxas: 0 spills, at most 96 registers (two 288-thread CTAs per SM), as the plain builds."""
    for spec in (s for s in D.compile_check_specs() if s.name.endswith("_qcat")):
        res = nvcc_jit(spec).resources()[spec.name]
        assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, (spec.describe(), res)
        assert 0 < res.registers <= 96 and res.stack_bytes <= 64, (spec.describe(), res)


def test_fake_shape_and_mutated_arguments():
    a = _args()
    out = torch.ops.glm5_fastpath.d2_absorb_kv_store_qcat(*a.values())
    assert tuple(out.shape) == (3, 64, 576) and out.dtype == BF16
    schema = torch.ops.glm5_fastpath.d2_absorb_kv_store_qcat.default._schema
    written = [x.name for x in schema.arguments if x.alias_info is not None and x.alias_info.is_write]
    assert written == ["kv_cache", "kv_pool"], written


def test_qcat_build_is_its_own_cubin():
    plain, qc = D.config_for(192, 512, 64, 1), D.config_for(192, 512, 64, 1, qcat=True)
    assert qc.function == "glm5_d2_absorb_kv_store_qcat" and plain.function == "glm5_d2_absorb_kv_store"
    assert ("GLM5_D2_QCAT", "1") in qc.spec.defines and ("GLM5_D2_QCAT", "1") not in plain.spec.defines
    assert D.config_for(192, 512, 64, 1, w8=True, qcat=True).function == "glm5_d2_absorb_kv_store_w8_qcat"
    with pytest.raises(ValueError, match="multiple of 8"):
        D.config_for(192, 512, 36, 1, qcat=True)


# ---- GPU ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def glm5_attn():
    from glm5_fastpath.weights import random_layer
    return random_layer(GLM5, 3, 1234, device="cuda").attn


def _weights(attn, w8):
    """bf16 W_UK, or an FP8 form (random e4m3 rows, random per-row scales: the W8A16 build's inputs)."""
    if not w8:
        return types.SimpleNamespace(w_kc=attn.w_kc)
    h, nope, kvl = attn.w_kc.shape
    g = torch.Generator().manual_seed(5)
    w8_ = (torch.randn(h, nope, kvl, generator=g) * 2.0).to(torch.float8_e4m3fn).cuda()
    s = (torch.rand(h, nope, kvl // 128, generator=g) * 0.02 + 1e-3).cuda()
    return types.SimpleNamespace(w_kc=None, w_kc_fp8=w8_, w_kc_scale=s)


def check_against_plain(w, ins, q_cat, scratch_after, pool_after, scratch_before, pool_before, ctx):
    q_nope, c_kv, k_pe, q_pe, pos, slots, _, loc, _ = ins
    s_ref = scratch_before.clone()
    q_lat = D.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, pos, slots, s_ref, GLM5)
    torch.cuda.synchronize()
    kvl = GLM5.kv_lora_rank
    assert_equal(OP, q_cat[..., :kvl], q_lat, context=ctx + " q_lat part = the plain op's")
    assert_equal(OP, q_cat[..., kvl:], q_pe, context=ctx + " q_pe part = q_pe")
    assert_equal(OP, scratch_after.view(torch.int16), s_ref.view(torch.int16), context=ctx + " scratch rows")
    want = pool_before.clone()
    ok = (loc >= 0) & (loc < pool_before.shape[0])
    want[loc[ok]] = s_ref[slots[ok]]
    assert_equal(OP, pool_after.view(torch.int16), want.view(torch.int16), context=ctx + " pool rows (rest untouched)")


@pytest.mark.gpu
@pytest.mark.parametrize("w8", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 16, 33, 64, 256])
def test_matches_plain_op_bitwise(m, w8, seed, glm5_attn, no_pdl_override):
    w = _weights(glm5_attn, w8)
    ins = make_inputs(GLM5, m, seed + m, device="cuda")
    q_nope, c_kv, k_pe, q_pe, pos, slots, scratch, loc, pool = ins
    poison_(scratch)
    pool[loc] = float("nan")
    s0, p0 = scratch.clone(), pool.clone()
    q_cat = D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch, q_pe, loc, pool, GLM5)
    torch.cuda.synchronize()
    check_against_plain(w, ins, q_cat, scratch, pool, s0, p0, f"{m=} {w8=}")


@pytest.mark.gpu
def test_pool_overlapping_the_scratch_is_refused(seed, glm5_attn):
    q_nope, c_kv, k_pe, q_pe, pos, slots, scratch, loc, pool = make_inputs(GLM5, 3, seed, device="cuda")
    with pytest.raises(ValueError, match="kv_pool overlaps kv_cache"):
        D.d2_absorb_qcat(q_nope, c_kv, k_pe, _weights(glm5_attn, False), pos, slots, pool[:3], q_pe, loc, pool, GLM5)


@pytest.mark.gpu
def test_pool_slot_outside_the_pool_is_skipped(seed, glm5_attn):
    w = _weights(glm5_attn, False)
    ins = make_inputs(GLM5, 4, seed, device="cuda", pool_slots=16)
    q_nope, c_kv, k_pe, q_pe, pos, slots, scratch, loc, pool = ins
    loc[1], loc[2] = -1, 16
    s0, p0 = scratch.clone(), pool.clone()
    q_cat = D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch, q_pe, loc, pool, GLM5)
    torch.cuda.synchronize()
    check_against_plain(w, ins, q_cat, scratch, pool, s0, p0, "out-of-range pool slots")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_q_pe_from_a_late_producer_under_pdl(m, seed, glm5_attn, no_pdl_override):
    """q_pe's writer (D0's stand-in) spins ~50 us, then writes it; D2 launched with PDL right behind it copies the
    fresh q_pe only (the copy sits after griddepcontrol.wait)."""
    from glm5_fastpath.testing.pdl import late_producer, produce

    producer = late_producer()
    w = _weights(glm5_attn, False)
    ins = make_inputs(GLM5, m, seed, device="cuda")
    q_nope, c_kv, k_pe, q_true, pos, slots, scratch, loc, pool = ins
    q_pe = torch.full_like(q_true, 7.0)
    D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch.clone(), q_true, loc, pool.clone(), GLM5)  # load
    for _ in range(3):
        q_pe.fill_(7.0)
        s0, p0 = scratch.clone(), pool.clone()
        torch.cuda.synchronize()
        produce(producer, q_true, q_pe)
        q_cat = D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch, q_pe, loc, pool, GLM5, pdl=True)
        torch.cuda.synchronize()
        ins_true = [q_nope, c_kv, k_pe, q_true, pos, slots, None, loc, None]
        check_against_plain(w, ins_true, q_cat, scratch, pool, s0, p0, f"late q_pe {m=}")


@pytest.mark.gpu
def test_cuda_graph_replay(seed, glm5_attn):
    w = _weights(glm5_attn, False)
    ins = make_inputs(GLM5, 8, seed, device="cuda")
    q_nope, c_kv, k_pe, q_pe, pos, slots, scratch, loc, pool = ins
    D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch.clone(), q_pe, loc, pool.clone(), GLM5)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q_cat = D.d2_absorb_qcat(q_nope, c_kv, k_pe, w, pos, slots, scratch, q_pe, loc, pool, GLM5)
    for step in range(3):
        new = make_inputs(GLM5, 8, seed + 10 + step, device="cuda")
        for dst, src in zip((q_nope, c_kv, k_pe, q_pe, pos), new[:5]):
            dst.copy_(src)
        poison_(q_cat)
        s0, p0 = scratch.clone(), pool.clone()
        g.replay()
        torch.cuda.synchronize()
        check_against_plain(w, ins, q_cat, scratch, pool, s0, p0, f"replay {step}")
