"""PDL wait-point switch (GLM5_PDL_WAIT_AT, csrc/common/pdl.cuh) as the ops' pdl_wait=: CPU checks of the
entry points, op schemas, kernel specs and the CMP wait-point resolution; on the GPU every wait point
gives bitwise the native outputs for every prefix op at M=16 (B0 in both modes)."""
import dataclasses
import importlib
import inspect
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from glm5_fastpath import ops
from glm5_fastpath.attn_pre.cmp import MODES
from glm5_fastpath.attn_pre.cmp.modes import OP_FUNCTIONS, WAIT_POINTS, resolve_wait_points, wait_support
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import build_prefix_graph
from glm5_fastpath.ops._device import PDL_WAIT_POINTS, weights_hint_defines

A0 = importlib.import_module("glm5_fastpath.ops.add_rmsnorm_quant")
C0 = importlib.import_module("glm5_fastpath.ops.c0_head_gate")
D2 = importlib.import_module("glm5_fastpath.ops.d2_absorb")
E1 = importlib.import_module("glm5_fastpath.ops.e1_indexer_logits")
E2 = importlib.import_module("glm5_fastpath.ops.e2_topk")
F = importlib.import_module("glm5_fastpath.ops.fp8_gemm")

ORDER = build_prefix_graph(small_config()).topo_order()
DEFINE = "GLM5_PDL_WAIT_AT"
# the name each entry point's error carries
ERR_NAME = {"A0": "add_rmsnorm_quant", "B0": "b0_qkv_a", "C0": "c0_head_gate", "B1": "b1_indexer_k",
            "D1": "d1_indexer_q", "D0": "d0_q_b", "D2": "d2_absorb_and_kv_store", "E1": "e1_indexer_logits",
            "E2": "e2_topk"}
OPS_WITH_WAIT = ("add_rmsnorm_quant", "add_rmsnorm_quant_out", "fp8_gemm_skinny", "fp8_qkv_a", "b0_row_norms",
                 "fp8_q_b_rope", "fp8_indexer_q", "fp8_indexer_k", "c0_head_gate", "d2_absorb_kv_store",
                 "e1_indexer_logits", "e1_indexer_logits_out", "e2_topk", "e2_topk_out")


def test_wait_point_names_match_the_cmp_modes():
    assert tuple(PDL_WAIT_POINTS) == WAIT_POINTS
    assert list(PDL_WAIT_POINTS.values()) == [0, 1, 2]


@pytest.mark.parametrize("op", list(OP_FUNCTIONS))
def test_every_entry_point_accepts_pdl_wait(op):
    fn = getattr(ops, OP_FUNCTIONS[op])
    p = inspect.signature(fn).parameters["pdl_wait"]
    assert p.default is None and p.kind == inspect.Parameter.KEYWORD_ONLY
    assert op in {o for o, pts in wait_support(ops, [op]).items() if pts == frozenset(WAIT_POINTS)}


@pytest.mark.parametrize("op", list(OP_FUNCTIONS))
@pytest.mark.parametrize("bad", ["early", "ENTRY", 0, True])
def test_bad_pdl_wait_raises_naming_the_op(op, bad):
    fn = getattr(ops, OP_FUNCTIONS[op])
    n_pos = sum(1 for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
    with pytest.raises(ValueError, match=f"{ERR_NAME[op]}.*pdl_wait={bad!r}"):
        fn(*[None] * n_pos, pdl_wait=bad)


@pytest.mark.parametrize("name", OPS_WITH_WAIT)
def test_op_schemas_carry_the_wait_point_with_the_native_default(name):
    schema = str(getattr(torch.ops.glm5_fastpath, name).default._schema)
    assert "Int pdl_wait_at=2" in schema, schema  # SymInt


def test_op_rejects_a_bad_wait_code():
    x = torch.empty(3, 512, dtype=torch.bfloat16, device="meta")
    w = torch.empty(4, 512, dtype=torch.bfloat16, device="meta")
    assert torch.ops.glm5_fastpath.c0_head_gate(x, w, True, 0).shape == (3, 4)  # fake impl
    with pytest.raises(ValueError, match="c0_head_gate.*pdl_wait_at=3"):
        torch.ops.glm5_fastpath.c0_head_gate(x, w, True, 3)


def _native_and_waits(spec_of):
    """spec_of(wait_at) -> KernelSpec; checks the define is present exactly for the non-native points."""
    native = spec_of(2)
    assert DEFINE not in dict(native.defines)
    for code in (0, 1):
        s = spec_of(code)
        assert dict(s.defines)[DEFINE] == str(code)
        assert {k: v for k, v in s.defines if k != DEFINE} == dict(native.defines)
        assert s.source == native.source and s.functions == native.functions
    return native


def test_specs_carry_the_define_and_defaults_are_unchanged():
    a0 = A0.config_for(6144)
    assert _native_and_waits(lambda w: dataclasses.replace(a0, wait_at=w).spec) == a0.spec
    assert dict(a0.spec.defines) == {"GLM5_A0_HIDDEN": "6144", "GLM5_A0_CLUSTER": "8"}
    c0 = C0.config_for(6144, 32, 16)
    assert _native_and_waits(lambda w: dataclasses.replace(c0, wait_at=w).spec) == c0.spec
    assert set(dict(c0.spec.defines)) == {"GLM5_C0_HIDDEN", "GLM5_C0_HEADS", "GLM5_C0_NT", "GLM5_C0_CLUSTER"}
    d2 = D2.config_for(192, 512, 64, 16)
    assert _native_and_waits(lambda w: dataclasses.replace(d2, wait_at=w).spec) == d2.spec
    hint = set(dict(weights_hint_defines(16)))  # evict-first weights at M <= 16 (GLM5_FASTPATH_W_EVICT_FIRST=auto)
    assert set(dict(d2.spec.defines)) == {"GLM5_D2_NOPE", "GLM5_D2_KV_LORA", "GLM5_D2_ROPE", "GLM5_D2_MT",
                                          "GLM5_D2_NT"} | hint
    e1 = E1.config_for(32, 128)
    assert _native_and_waits(lambda w: dataclasses.replace(e1, wait_at=w).spec) == e1.spec
    assert set(dict(e1.spec.defines)) == {"GLM5_E1_HEADS", "GLM5_E1_DIM", "GLM5_E1_STAGES", "GLM5_E1_MAX_PAGES",
                                          "GLM5_E1_THREADS"}
    e2 = E2.DEFAULT_CONFIG
    assert _native_and_waits(lambda w: dataclasses.replace(e2, wait_at=w).spec) == e2.spec
    assert set(dict(e2.spec.defines)) == {"GLM5_E2_THREADS", "GLM5_E2_ITEMS"}
    for impl in F.IMPLS:
        for epi in F.EPI_NAMES:
            c = F.config_for(16, *{0: (2624, 6144), 1: (2624, 6144), 2: (16384, 2048), 3: (4096, 2048),
                                   4: (128, 6144)}[epi], epi, impl=impl)
            assert _native_and_waits(c.spec) == c.spec() == F.kernel_spec(
                c.tm, c.stages, epi, c.minb, c.diag, c.impl, c.pipe, c.reduce if c.splits > 1 else "global",
                hints=weights_hint_defines(16))
    assert F.kernel_spec(16, 6, F.EPI_PLAIN).defines == (("GLM5_SKINNY_EPI", "0"), ("GLM5_SKINNY_STAGES", "6"),
                                                          ("GLM5_SKINNY_TM", "16"))
    assert _native_and_waits(lambda w: F.row_norms_spec(2048, 512, 64, w)) == F.row_norms_spec(2048, 512, 64)
    with pytest.raises(ValueError, match="pdl_wait_at=5"):
        F.kernel_spec(16, 6, F.EPI_PLAIN, wait_at=5)


def test_resolve_entry_and_prologue_modes_with_the_kernels():
    sup = wait_support(ops, ORDER)
    assert all(sup[o] == frozenset(WAIT_POINTS) for o in ORDER)
    entry = resolve_wait_points(MODES["multistream_pdl_entry"], ORDER, sup)
    for op in ORDER:
        want = {"pdl_wait": "entry", "meta_before_wait": True} if op == "E1" else {"pdl_wait": "entry"}
        assert dict(entry[op].kwargs) == want and entry[op].realized == "entry", op
    pro = resolve_wait_points(MODES["multistream_pdl_prologue"], ORDER, sup)
    for op in ORDER:
        if op == "E2":  # its native point
            want = {}
        elif op == "E1":
            want = {"pdl_wait": "after_prologue", "meta_before_wait": True}
        else:
            want = {"pdl_wait": "after_prologue"}
        assert dict(pro[op].kwargs) == want and pro[op].realized == "after_prologue", op
    full = resolve_wait_points(MODES["full"], ORDER, sup)
    assert all("pdl_wait" not in full[o].kwargs for o in ORDER)


# ---- GPU: every wait point == native, bitwise -------------------------------------------------------------

CFG = Glm5Config.preset("glm5")
M = 16
OUTS_SKIP = ("kv_cache", "index_k_cache")  # compared separately (written in place)


def _bound(wait, b0_mode):
    from glm5_fastpath.attn_pre.cmp.executor import BoundOps

    kw = {fn: {"pdl": True, "pdl_wait": wait} for fn in OP_FUNCTIONS.values()}
    kw["b0_qkv_a"]["mode"] = b0_mode
    return BoundOps(ops, kw)


def _warm_specs(dev) -> None:
    """Compile every variant (native and early waits) M=16 launches, in parallel (the tests then only load them)."""
    from glm5_fastpath.jit import compile_kernel

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cc = torch.cuda.get_device_capability(dev)
    c = CFG
    specs = []
    for w in (0, 1, 2):
        specs += [dataclasses.replace(A0.config_for(c.hidden_size), wait_at=w).spec,
                  dataclasses.replace(C0.config_for(c.hidden_size, c.index_n_heads, M), wait_at=w).spec,
                  dataclasses.replace(D2.config_for(c.qk_nope_head_dim, c.kv_lora_rank, c.qk_rope_head_dim, M),
                                      wait_at=w).spec,
                  dataclasses.replace(E1.config_for(c.index_n_heads, c.index_head_dim), wait_at=w).spec,
                  dataclasses.replace(E2.SINGLE_CHUNK_CONFIG, wait_at=w).spec,
                  dataclasses.replace(E2.DEFAULT_CONFIG, wait_at=w).spec,
                  F.row_norms_spec(c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim, w)]
        for epi, n, k in F._glm_shapes(c) + [(F.EPI_PLAIN, c.qkv_a_out, c.hidden_size)]:
            specs.append(F.config_for(M, n, k, epi, sms, F.env_impl(epi), cc).spec(w))
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda s: compile_kernel(s, device=dev), set(specs)))


@pytest.fixture(scope="module")
def prefix_inputs():
    from glm5_fastpath.testing.decode_step import make_decode_step
    from glm5_fastpath.weights import random_layer

    _warm_specs(torch.device("cuda", torch.cuda.current_device()))
    layer = random_layer(CFG, 3, seed=11, device="cuda")
    s = make_decode_step(CFG, [257 + (i * 523) % 3000 for i in range(M)], seed=5, device="cuda")
    return layer, s


def _run(layer, s, wait, b0_mode):
    from glm5_fastpath.graph import prefix_env, run_eager

    g = build_prefix_graph(CFG, impl=_bound(wait, b0_mode))
    kv, ik = s.kv_cache.clone(), s.index_k_cache.clone()
    env = prefix_env(g, w=layer.attn, hidden=s.hidden, residual=s.residual, positions=s.positions,
                     out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table,
                     kv_cache=kv, index_k_cache=ik)
    out = run_eager(g, env)
    torch.cuda.synchronize()
    return {n: t for n, t in out.items() if n in g.produced_tensors()}, kv, ik


@pytest.mark.gpu
@pytest.mark.parametrize("b0_mode", F.B0_MODES)
def test_every_wait_point_is_bitwise_native(prefix_inputs, b0_mode):
    from glm5_fastpath.testing.numerics import assert_equal

    layer, s = prefix_inputs
    ref, kv0, ik0 = _run(layer, s, None, b0_mode)
    for wait in WAIT_POINTS:
        out, kv, ik = _run(layer, s, wait, b0_mode)
        assert set(out) == set(ref)
        for n in ref:
            assert_equal(f"pdl_wait={wait} {n}", out[n], ref[n], context=f"M={M} b0_mode={b0_mode}")
        assert_equal(f"pdl_wait={wait} kv_cache", kv, kv0)
        assert_equal(f"pdl_wait={wait} index_k_cache", ik, ik0)
