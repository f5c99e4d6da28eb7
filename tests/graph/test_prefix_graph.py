"""The prefix op graph: def-use equals spec section 3.2, validation, the article's tile plan, tile
write coverage, and the eager executor equals attention_prefix bitwise."""
from __future__ import annotations

import os

import pytest
import torch

from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import (INDEXER_OPS, GraphError, OpDef, OpGraph, PrefixTiling, ShapeContext, TensorDef,
                                 Tile, build_prefix_graph, prefix_env, prefix_graph_for_layer, run_eager,
                                 write_coverage)
from glm5_fastpath.ref import fp8
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.numerics import assert_close, assert_equal
from glm5_fastpath.weights import random_layer

BF16 = torch.bfloat16
PAGE = 64
GLM5 = Glm5Config.preset("glm5")
SMALL = small_config()

# Spec 3.2 true data dependencies in article op names: #3<-#1 (A0->B0); #6<-#1 (A0->C0 head gate,
# A0->B1 wk); #7<-#4 and #12<-#4 (B0->D1, B0->D0); #8<-#6 (C0->D1); #13<-#12 (D0->D2);
# #14/#15<-#3/#5 (B0->D2: c_kv, k_pe); #10<-#8,#9 (D1->E1, B1->E1 via the index-K cache); #11<-#10.
EXPECTED_EDGES = {
    ("A0", "B0"): {"x_fp8", "x_scale"},
    ("A0", "C0"): {"x_bf16"},
    ("A0", "B1"): {"x_fp8", "x_scale"},
    ("B0", "D1"): {"q_lora_fp8", "q_lora_scale"},
    ("C0", "D1"): {"w_raw"},
    ("B0", "D0"): {"q_lora_fp8", "q_lora_scale"},
    ("D0", "D2"): {"q_nope"},
    ("B0", "D2"): {"c_kv", "k_pe"},
    ("D1", "E1"): {"index_q_fp8", "head_w"},
    ("B1", "E1"): {"index_k_cache_written"},
    ("E1", "E2"): {"logits"},
}
ARTICLE_M16 = {"A0": 16, "B0": 84, "C0": 48, "B1": 8, "D1": 128, "D0": 128, "D2": 256, "E1": 64}


def edge_map(g: OpGraph) -> dict[tuple[str, str], set[str]]:
    return {(e.src, e.dst): set(e.tensors) for e in g.edges()}


def test_edges_are_spec_data_dependencies():
    g = build_prefix_graph(GLM5)
    assert edge_map(g) == EXPECTED_EDGES
    order = g.topo_order()
    assert sorted(order) == sorted(["A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"])
    for (src, dst) in EXPECTED_EDGES:
        assert order.index(src) < order.index(dst)
    assert g.producer("index_k_cache_written") == "B1" and g.consumers("index_k_cache_written") == ["E1"]
    assert g.producer("kv_cache_written") == "D2" and g.tensors["kv_cache_written"].inplace_of == "kv_cache"
    assert g.producer("hidden") is None and set(g.consumers("positions")) == {"B1", "D1", "D0", "D2"}


def test_branches_and_independence():
    g = build_prefix_graph(GLM5)
    assert g.branches("A0") == ["B0", "C0", "B1"]  # the article's independent branches after A0
    assert g.branches("B0") == ["D1", "D0"]  # D2 also reads B0 but follows D0
    assert g.forks() == {"A0": ["B0", "C0", "B1"], "B0": ["D1", "D0"]}
    assert g.independent("B1", "B0") and g.independent("C0", "D0") and g.independent("E1", "D2")
    assert g.independent("E2", "D0")  # SGLang overlaps #10/#11 with #12
    assert not g.independent("A0", "E2") and not g.independent("D0", "D2") and not g.independent("B1", "E2")


def test_bf16_indexer_k_variant_reads_x_bf16():
    g = build_prefix_graph(GLM5, indexer_k_gemm="bf16")
    assert edge_map(g)[("A0", "B1")] == {"x_bf16"}
    with pytest.raises(GraphError, match="indexer_k_gemm"):
        build_prefix_graph(GLM5, indexer_k_gemm="int8")


def test_shared_layer_drops_indexer_ops():
    cfg = Glm5Config.preset("glm5.2")
    g = prefix_graph_for_layer(cfg, 3)  # 3 is shared on GLM-5.2 (full: 0, 1, 2, 6, 10, ...)
    assert not cfg.is_full_indexer_layer(3)
    assert g.topo_order() == ["A0", "B0", "D0", "D2"]
    assert not set(INDEXER_OPS) & set(g.ops)
    assert edge_map(g) == {k: v for k, v in EXPECTED_EDGES.items() if not set(k) & set(INDEXER_OPS)}
    assert g.tensors["topk_slots"].kind == "input"  # the last full layer's top-k, supplied by the caller
    assert not any(t.startswith("w.indexer") or "index" in t for t in g.tensors)
    assert "seq_lens" not in g.tensors and "block_table" not in g.tensors
    assert prefix_graph_for_layer(cfg, 6).topo_order() == build_prefix_graph(cfg).topo_order()


# ---- validate() ---------------------------------------------------------------------------------------------

def _toy_op(name, ins, outs):
    return OpDef(name, tuple(ins), tuple(outs), ref=lambda i: {}, tiles=lambda ctx: [])


def _toy_tensors(*names, kind="intermediate"):
    return [TensorDef(n, ("M",), torch.float32, kind) for n in names]


def test_validate_catches_cycle():
    g = OpGraph([_toy_op("X", ["a", "c"], ["b"]), _toy_op("Y", ["b"], ["c"])],
                _toy_tensors("a", kind="input") + _toy_tensors("b", "c"))
    with pytest.raises(GraphError, match="cycle"):
        g.validate()


def test_validate_catches_missing_producer():
    g = build_prefix_graph(GLM5)
    broken = g.without(["C0"])  # D1 still reads w_raw, now produced by nobody
    with pytest.raises(GraphError, match=r"w_raw has no producer \(read by \['D1'\]\)"):
        broken.validate()
    undefined = OpGraph([_toy_op("X", ["nope"], ["b"])], _toy_tensors("b"))
    with pytest.raises(GraphError, match="undefined tensor nope"):
        undefined.validate()


def test_validate_catches_doubly_produced_tensor():
    g = build_prefix_graph(GLM5)
    dup = OpGraph(list(g.ops.values()) + [_toy_op("Z", ["x_bf16"], ["q_lora"])], g.tensors.values())
    with pytest.raises(GraphError, match=r"q_lora is produced by several ops \['B0', 'Z'\]"):
        dup.validate()
    writes_input = OpGraph(list(g.ops.values()) + [_toy_op("Z", ["x_bf16"], ["hidden"])], g.tensors.values())
    with pytest.raises(GraphError, match="input tensor hidden is supplied by the caller"):
        writes_input.validate()


def test_validate_inplace_writer_reads_old_version():
    t = _toy_tensors("x", kind="input") + [TensorDef("cache", ("n",), torch.float32, "cache"),
                                           TensorDef("cache_w", ("n",), torch.float32, "cache", inplace_of="cache")]
    with pytest.raises(GraphError, match="does not take it as input"):
        OpGraph([_toy_op("W", ["x"], ["cache_w"])], t).validate()
    OpGraph([_toy_op("W", ["x", "cache"], ["cache_w"])], t).validate()


# ---- tiles ---------------------------------------------------------------------------------------------------

def test_article_tile_counts_m16_shared_kv():
    g = build_prefix_graph(GLM5, tiling=PrefixTiling(b1_split_k=8))  # the article's B1 split (our default: 4)
    assert build_prefix_graph(GLM5).tile_counts(ShapeContext.shared_kv(16, 8192))["B1"] == 4
    counts = g.tile_counts(ShapeContext.shared_kv(16, 8192))
    assert {k: v for k, v in counts.items() if k != "E2"} == ARTICLE_M16
    assert sum(ARTICLE_M16.values()) == 732  # "合计732条tile task"
    assert counts["E2"] == 16


def test_tile_counts_independent_sequences_and_other_m():
    g = build_prefix_graph(GLM5)
    counts = g.tile_counts(ShapeContext.independent([8192] * 16))
    assert counts["E1"] == 16 * 16  # one Q block per token x 512-token KV splits
    counts = g.tile_counts(ShapeContext.independent([100, 513, 1024, 1025]))
    assert counts["E1"] == 1 + 2 + 2 + 3
    counts = g.tile_counts(ShapeContext.independent([5000] * 100))  # two M blocks of 64
    assert counts["A0"] == 100 and counts["B0"] == 2 * 21 * 4 and counts["D2"] == 2 * 256
    tiles = g.tiles(ShapeContext.shared_kv(16, 8192))
    assert {t.coords for t in tiles["E1"]} == {(0, qb, s) for qb in range(4) for s in range(16)}
    assert {(t.coords[1], t.coords[2]) for t in tiles["C0"]} == {(o, i) for o in range(12) for i in range(4)}
    # tiling parameters move the counts as documented
    g2 = build_prefix_graph(GLM5, tiling=PrefixTiling(b0_split_k=2, e1_kv_split=1024, d1_split_k=1))
    c2 = g2.tile_counts(ShapeContext.shared_kv(16, 8192))
    assert (c2["B0"], c2["E1"], c2["D1"]) == (42, 32, 32)
    with pytest.raises(GraphError, match="multiples of 128"):
        PrefixTiling(block_n=96)


CONTEXTS = {
    "shared16": ShapeContext.shared_kv(16, 8192),
    "indep37": ShapeContext.independent([1 + 97 * i for i in range(37)]),
    "mixed": ShapeContext((300, 301, 302, 70, 1, 4097), (0, 0, 0, 1, 2, 3)),
    "m1": ShapeContext.independent([65]),
    "m100": ShapeContext.independent([129] * 100),
}


@pytest.mark.parametrize("ctx_name", list(CONTEXTS))
@pytest.mark.parametrize("cfg", [GLM5, SMALL], ids=["glm5", "small"])
def test_tile_writes_cover_each_output_exactly_once(cfg, ctx_name):
    g = build_prefix_graph(cfg)
    ctx = CONTEXTS[ctx_name]
    for op in g.topo_order():
        for t, cov in write_coverage(g, op, ctx).items():
            ones = torch.ones_like(cov)
            assert_equal(f"{op} tile coverage of {t}", cov, ones, context=ctx_name)


@pytest.mark.parametrize("cfg", [GLM5, SMALL], ids=["glm5", "small"])
def test_tile_reads_are_inputs_and_in_bounds(cfg):
    g = build_prefix_graph(cfg)
    ctx = CONTEXTS["mixed"]
    dims = {**ctx.dims(), "max_pages": -(-ctx.max_ctx // PAGE)}
    for op, tiles in g.tiles(ctx).items():
        for tile in tiles:
            assert isinstance(tile, Tile) and tile.op == op and len(tile.coords) == len(g.ops[op].tile_axes)
            for t, region in tile.reads.items():
                assert t in g.ops[op].inputs, f"{op} tile {tile.index} reads undeclared {t}"
                shape = g.tensors[t].resolve(dims)
                assert len(region) == len(shape) and all(0 <= a < b <= n for (a, b), n in zip(region, shape)), \
                    f"{op} tile {tile.index} reads {t}{region} outside {shape}"
        assert [t.index for t in tiles] == list(range(len(tiles)))


def test_write_coverage_catches_overlap_and_gaps():
    g = build_prefix_graph(SMALL)
    a0 = g.ops["A0"]
    ctx = ShapeContext.independent([10, 20])
    doubled = OpDef("A0", a0.inputs, a0.outputs, a0.ref, lambda c: a0.tiles(c) + a0.tiles(c)[:1])
    gap = OpDef("A0", a0.inputs, a0.outputs, a0.ref, lambda c: a0.tiles(c)[1:])
    for bad, want in ((doubled, 2.0), (gap, 0.0)):
        gg = OpGraph([bad], g.without([o for o in g.ops if o != "A0"]).tensors.values())
        cov = write_coverage(gg, "A0", ctx)["x_bf16"]
        assert float(cov[0].max() if want == 2.0 else cov[0].min()) == want


# ---- eager executor vs attention_prefix ----------------------------------------------------------------------

_SEED = int(os.environ.get("GLM5_FASTPATH_TEST_SEED", torch.seed() % (2**31)))
_WEIGHTS: dict[str, tuple] = {}


def weights(name: str):
    if name not in _WEIGHTS:
        cfg = {"glm5": GLM5, "small": SMALL,
               "small_shared": small_config(index_topk_freq=4, index_skip_topk_offset=3)}[name]
        lay = 3 if name == "small_shared" else cfg.first_k_dense_replace
        print(f"weights seed={_SEED}")
        _WEIGHTS[name] = (cfg, random_layer(cfg, lay, seed=_SEED).attn, lay)
    return _WEIGHTS[name]


def decode_step(cfg: Glm5Config, m: int, ctx_lo: int, ctx_hi: int):
    """M independent sequences on shuffled pages; the new tokens' index-K slots poisoned."""
    lens = [s + (s % PAGE == 0) for s in torch.randint(ctx_lo, ctx_hi, (m,)).tolist()]
    pages = [-(-s // PAGE) for s in lens]
    num_pages = sum(pages) + 3
    perm = torch.randperm(num_pages)
    table = torch.full((m, max(pages) + 1), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at:at + n].int()
        at += n
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    positions = (seq_lens - 1).long()
    slots = torch.tensor([int(table[i, (s - 1) // PAGE]) * PAGE + (s - 1) % PAGE for i, s in enumerate(lens)])
    idx_cache = fp8.new_index_k_cache(num_pages, cfg.index_head_dim)
    k8, s = fp8.quant_per_row(torch.randn(num_pages * PAGE, cfg.index_head_dim).to(BF16))
    fp8.index_k_cache_store(idx_cache, torch.arange(num_pages * PAGE), k8, s)
    fp8.index_k_cache_store(idx_cache, slots, torch.full((m, cfg.index_head_dim), float("nan")).to(fp8.FP8),
                            torch.full((m,), float("nan")))
    h = cfg.hidden_size
    return dict(hidden=torch.randn(m, h).to(BF16), residual=(3 * torch.randn(m, h)).to(BF16), positions=positions,
                out_cache_loc=slots, seq_lens=seq_lens, block_table=table,
                kv_cache=torch.randn(num_pages * PAGE, cfg.kv_cache_dim).to(BF16), index_k_cache=idx_cache)


def _clone_caches(step):
    return {**step, "kv_cache": step["kv_cache"].clone(), "index_k_cache": step["index_k_cache"].clone()}


@pytest.mark.parametrize("name,m,gemm", [("small", 1, "fp8"), ("small", 37, "fp8"), ("small", 16, "bf16"),
                                         pytest.param("glm5", 3, "fp8", marks=pytest.mark.slow)])
def test_eager_graph_equals_attention_prefix(name, m, gemm, seed):
    cfg, w, lay = weights(name)
    step = decode_step(cfg, m, cfg.index_topk // 2, cfg.index_topk + 200)
    direct_step = _clone_caches(step)
    direct = P.attention_prefix(**direct_step, w=w, cfg=cfg, layer=lay, indexer_k_gemm=gemm)

    g = build_prefix_graph(cfg, indexer_k_gemm=gemm)
    env = run_eager(g, prefix_env(g, w=w, **step))
    assert set(direct.tensors) <= set(env)
    for t in g.produced_tensors():
        if g.tensors[t].inplace_of is None:
            assert_equal(f"eager vs attention_prefix: {t}", env[t], direct.tensors[t])
    assert env["kv_cache_written"] is step["kv_cache"] and env["index_k_cache_written"] is step["index_k_cache"]
    assert_equal("eager kv_cache", step["kv_cache"], direct_step["kv_cache"])
    assert_equal("eager index_k_cache", step["index_k_cache"], direct_step["index_k_cache"])
    own = (step["seq_lens"].long() - 1)[:, None]  # E1 saw B1's write of the new tokens (poisoned before)
    assert_close("eager logits at the new tokens", env["logits"].gather(1, own),
                 direct.tensors["logits"].gather(1, own), kind="fp32")


@pytest.mark.parametrize("name,m", [("small", 1), ("small", 37), pytest.param("glm5", 3, marks=pytest.mark.slow)])
def test_rotated_graph_equals_attention_prefix(name, m, seed):
    """indexer_rotate: B1 / D1 with rotate=True (SGLang 0.5.14's index-K format); same tensors, edges and tiles."""
    cfg, w, lay = weights(name)
    step = decode_step(cfg, m, cfg.index_topk // 2, cfg.index_topk + 200)
    direct_step = _clone_caches(step)
    direct = P.attention_prefix(**direct_step, w=w, cfg=cfg, layer=lay, indexer_rotate=True)
    g = build_prefix_graph(cfg, indexer_rotate=True)
    plain = build_prefix_graph(cfg)
    assert g.name == "glm5_prefix[full,rotated]" and plain.name == "glm5_prefix[full]"
    assert edge_map(g) == edge_map(plain) and set(g.tensors) == set(plain.tensors)
    assert "Hadamard" in g.ops["B1"].doc and "Hadamard" in g.ops["D1"].doc and "Hadamard" not in plain.ops["B1"].doc
    env = run_eager(g, prefix_env(g, w=w, **step))
    for t in g.produced_tensors():
        if g.tensors[t].inplace_of is None:
            assert_equal(f"rotated eager vs attention_prefix: {t}", env[t], direct.tensors[t])
    assert_equal("rotated eager index_k_cache", step["index_k_cache"], direct_step["index_k_cache"])
    unrot = P.attention_prefix(**_clone_caches(step), w=w, cfg=cfg, layer=lay)
    assert not torch.equal(direct.tensors["index_k_fp8"].view(torch.uint8), unrot.tensors["index_k_fp8"].view(torch.uint8))


def test_rotate_flag_reaches_only_b1_d1_and_only_when_on():
    """The default graph calls the ops without `rotate` (namespaces without the argument keep working); the rotated
    one passes rotate=True to B1 and D1 only."""
    calls = {}

    class Spy:
        def __getattr__(self, name):
            def f(*a, **k):
                calls.setdefault(name, []).append(k.get("rotate", "absent"))
                raise StopIteration
            return f

    for rotate in (False, True):
        calls.clear()
        g = build_prefix_graph(SMALL, impl=Spy(), indexer_rotate=rotate)
        for op in ("B1", "D1", "B0", "E1"):
            with pytest.raises(StopIteration):
                g.ops[op].ref({k: None for k in g.ops[op].inputs})
        want = True if rotate else "absent"
        assert calls["b1_indexer_k"] == [want] and calls["d1_indexer_q"] == [want]
        assert calls["b0_qkv_a"] == ["absent"] and calls["e1_indexer_logits"] == ["absent"]
    with pytest.raises(GraphError, match="indexer_rotate"):
        build_prefix_graph(SMALL, indexer_rotate=1)
    with pytest.raises(GraphError, match="power-of-two"):
        build_prefix_graph(small_config(index_head_dim=48), indexer_rotate=True)


def test_eager_shared_layer_equals_attention_prefix(seed):
    cfg, w, lay = weights("small_shared")
    step = decode_step(cfg, 5, 10, 200)
    prev = torch.randint(0, 1000, (5, cfg.index_topk), dtype=torch.int32)
    direct_step = _clone_caches(step)
    direct = P.attention_prefix(**direct_step, w=w, cfg=cfg, prev_topk=prev, layer=lay)
    g = prefix_graph_for_layer(cfg, lay)
    assert g.topo_order() == ["A0", "B0", "D0", "D2"]
    idx_before = step["index_k_cache"].clone()
    env = run_eager(g, prefix_env(g, w=w, prev_topk=prev, **step))
    for t in ("q_lat", "q_pe", "residual_out", "topk_slots"):
        assert_equal(f"shared eager {t}", env[t], direct.tensors[t])
    assert env["topk_slots"] is prev
    assert_equal("shared eager kv_cache", step["kv_cache"], direct_step["kv_cache"])
    assert_equal("shared eager leaves index-K cache", step["index_k_cache"], idx_before)


def test_eager_rejects_missing_inputs_and_undeclared_reads(seed):
    cfg, w, _ = weights("small")
    g = build_prefix_graph(cfg)
    step = decode_step(cfg, 2, 10, 100)
    env = prefix_env(g, w=w, **step)
    del env["w.q_b.weight"]
    with pytest.raises(GraphError, match=r"caller must supply \['w.q_b.weight'\]"):
        run_eager(g, env)
    # an op that forgets to declare a weight it needs cannot see it
    d0 = g.ops["D0"]
    sneaky = OpDef("D0", tuple(t for t in d0.inputs if t != "w.q_b.scale_inv"), d0.outputs, d0.ref, d0.tiles)
    g2 = OpGraph([sneaky if o.name == "D0" else o for o in g.ops.values()], g.tensors.values()).validate()
    with pytest.raises((KeyError, AttributeError, TypeError)):
        run_eager(g2, prefix_env(g2, w=w, **decode_step(cfg, 2, 10, 100)))


# ---- d2_weights="fp8": W_UK in the checkpoint's FP8 form (session 24) -------------------------------------------

@pytest.mark.parametrize("name,m", [("small", 1), ("small", 37), pytest.param("glm5", 3, marks=pytest.mark.slow)])
def test_fp8_w_kc_graph_equals_bf16_graph_bitwise(name, m, seed):
    """The FP8 form of W_UK (weights.assemble_layer, from the FP8 kv_b) dequantizes to the bf16 w_kc bit for bit, so
    the graph built with d2_weights="fp8" gives the same q_lat and caches as the default one."""
    cfg, w, _ = weights(name)
    assert w.w_kc_fp8 is not None and w.w_kc_fp8.dtype == fp8.FP8 and w.w_kc_scale.dtype == torch.float32
    assert_equal("dequant_w_kc(w_kc_fp8, w_kc_scale) vs w_kc", fp8.dequant_w_kc(w.w_kc_fp8, w.w_kc_scale).view(torch.int16),
                 w.w_kc.view(torch.int16))
    step = decode_step(cfg, m, cfg.index_topk // 2, cfg.index_topk + 200)
    other = _clone_caches(step)
    g8, g16 = build_prefix_graph(cfg, d2_weights="fp8"), build_prefix_graph(cfg)
    assert g8.name.endswith(",d2fp8]") and edge_map(g8) == edge_map(g16)
    assert {"w.w_kc_fp8", "w.w_kc_scale"} <= set(g8.ops["D2"].inputs) and "w.w_kc" not in g8.tensors
    e8, e16 = run_eager(g8, prefix_env(g8, w=w, **step)), run_eager(g16, prefix_env(g16, w=w, **other))
    for t in g16.produced_tensors():
        if g16.tensors[t].inplace_of is None:
            assert_equal(f"d2 fp8 graph vs bf16 graph: {t}", e8[t], e16[t])
    assert_equal("d2 fp8 graph kv_cache", step["kv_cache"], other["kv_cache"])


def test_fp8_w_kc_tiles_read_both_tensors_in_bounds():
    g = build_prefix_graph(GLM5, d2_weights="fp8")
    ctx = CONTEXTS["mixed"]
    dims = {**ctx.dims(), "max_pages": -(-ctx.max_ctx // PAGE)}
    tiles = g.tiles(ctx)["D2"]
    for tile in tiles:
        assert {"w.w_kc_fp8", "w.w_kc_scale"} <= set(tile.reads) and "w.w_kc" not in tile.reads
        for t in ("w.w_kc_fp8", "w.w_kc_scale"):
            shape = g.tensors[t].resolve(dims)
            assert all(0 <= a < b <= n for (a, b), n in zip(tile.reads[t], shape))
    with pytest.raises(GraphError, match="d2_weights"):
        build_prefix_graph(GLM5, d2_weights="int4")


def test_w_kc_fp8_from_kv_b_scale_rows_follow_each_heads_offset():
    """GLM-5's heads start at kv_b row 448h, i.e. half-way into a 128-row scale block for odd h: each W_UK row takes
    the scale of ITS kv_b row."""
    heads, nope, v, kvl = 3, 192, 256, 256
    kv_b8 = torch.randn(heads * (nope + v), kvl).to(fp8.FP8)
    nb = -(-heads * (nope + v) // 128)  # 1344 rows: 11 blocks, the last one partial
    s = torch.arange(1, 1 + nb * (kvl // 128), dtype=torch.float32).view(nb, kvl // 128)
    w8, ws = fp8.w_kc_fp8_from_kv_b(kv_b8, s, heads, nope)
    assert w8.shape == (heads, nope, kvl) and ws.shape == (heads, nope, kvl // 128)
    for h, k in [(0, 0), (0, 191), (1, 0), (1, 63), (1, 64), (2, 191)]:
        row = h * (nope + v) + k
        assert torch.equal(ws[h, k], s[row // 128]) and torch.equal(w8[h, k].view(torch.uint8), kv_b8[row].view(torch.uint8))
    with pytest.raises(ValueError, match="scales"):
        fp8.w_kc_fp8_from_kv_b(kv_b8, s[:-1], heads, nope)
    with pytest.raises(ValueError, match="scales"):
        fp8.dequant_w_kc(w8, ws[..., :0])
