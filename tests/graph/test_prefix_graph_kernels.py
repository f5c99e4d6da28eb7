"""The op graph run with the kernels (glm5_fastpath.ops as the implementation namespace) equals the
reference run of the same graph, end to end through all nine ops (GPU)."""
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.graph.eager import run_eager
from glm5_fastpath.graph.prefix_graph import build_prefix_graph, op_impls, prefix_env
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.testing.numerics import assert_close, assert_topk_sets
from glm5_fastpath.weights import random_layer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("m", [1, 16, 64])
def test_kernel_graph_matches_reference_graph(seed, m):
    from glm5_fastpath import ops

    cfg = Glm5Config.preset("glm5")
    w = random_layer(cfg, 3, seed=seed, device="cuda")
    graph = build_prefix_graph(cfg)
    lens = [3000 + 97 * i for i in range(m)]
    outs = {}
    for name, impls in (("ref", None), ("kernels", op_impls(cfg, ops))):
        s = make_decode_step(cfg, lens, seed=seed, device="cuda")
        env = prefix_env(graph, hidden=s.hidden, residual=s.residual, positions=s.positions,
                         out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table, w=w.attn,
                         kv_cache=s.kv_cache, index_k_cache=s.index_k_cache)
        outs[name] = (run_eager(graph, env, impls=impls), s)
    (r, rs), (k, ks) = outs["ref"], outs["kernels"]
    ctx = f"M={m}"
    assert_close("graph q_lat", k["q_lat"], r["q_lat"], kind="fp8_same_quant", context=ctx)
    assert_close("graph q_pe", k["q_pe"], r["q_pe"], kind="fp8_same_quant", context=ctx)
    assert_close("graph residual_out", k["residual_out"], r["residual_out"], kind="fp32", context=ctx)
    loc = rs.out_cache_loc
    assert_close("graph kv_cache rows", ks.kv_cache[loc], rs.kv_cache[loc], kind="fp8_same_quant", context=ctx)
    assert_close("graph head_w", k["head_w"], r["head_w"], kind="fp8_same_quant", context=ctx)
    # top-k over logits that differ by rounding: the selected sets agree up to near-ties
    assert_topk_sets("graph topk_slots", k["topk_slots"], r["topk_slots"], min_overlap=0.98)
    assert torch.equal((k["topk_slots"] < 0).sum(1), (r["topk_slots"] < 0).sum(1))
