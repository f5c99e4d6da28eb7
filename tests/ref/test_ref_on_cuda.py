"""The references run on CUDA tensors too and agree with the CPU run (FP8 helpers, prefix, MoE)."""
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ref import fp8
from glm5_fastpath.ref.moe import moe_forward
from glm5_fastpath.ref.prefix import attention_prefix
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_topk_sets
from glm5_fastpath.weights import random_layer

pytestmark = pytest.mark.gpu


def test_fp8_helpers_bitwise_equal_on_cuda(seed):
    w = torch.randn(2624, 6144) * 0.02
    x = torch.randn(37, 6144) * 3
    w8, ws = fp8.quant_weight_block(w)
    w8c, wsc = fp8.quant_weight_block(w.cuda())
    assert_equal("quant_weight_block cuda", w8c, w8)
    assert_equal("weight scales cuda", wsc, ws)
    x8, xs = fp8.quant_act_per_token(x)
    x8c, xsc = fp8.quant_act_per_token(x.cuda())
    assert_equal("quant_act_per_token cuda", x8c, x8)
    assert_equal("act scales cuda", xsc, xs)
    assert_close("block_fp8_linear cuda", fp8.block_fp8_linear(x8c, xsc, w8c, wsc),
                 fp8.block_fp8_linear(x8, xs, w8, ws), kind="fp32")


@pytest.mark.parametrize("m,kv", [(1, 3000), (16, 2500)])
def test_prefix_and_moe_on_cuda_match_cpu(seed, m, kv):
    cfg = Glm5Config.preset("glm5")
    w = random_layer(cfg, 3, seed=seed)
    outs = {}
    for dev in ("cpu", "cuda"):
        s = make_decode_step(cfg, [kv + 17 * i for i in range(m)], seed=seed, device=dev)
        wd = random_layer(cfg, 3, seed=seed, device=dev) if dev == "cuda" else w
        o = attention_prefix(s.hidden, s.residual, s.positions, s.out_cache_loc, s.seq_lens, s.block_table,
                             wd.attn, cfg, s.kv_cache, s.index_k_cache)
        y = moe_forward(o.residual_out, wd.mlp, cfg)
        outs[dev] = (o, y)
    (oc, yc), (og, yg) = outs["cpu"], outs["cuda"]
    assert_close("q_lat cuda vs cpu", og.q_lat, oc.q_lat, kind="fp8_same_quant")
    assert_close("q_pe cuda vs cpu", og.q_pe, oc.q_pe, kind="fp8_same_quant")
    assert_equal("residual_out cuda vs cpu", og.residual_out.cpu(), oc.residual_out)
    assert_topk_sets("topk cuda vs cpu", og.topk_slots.cpu(), oc.topk_slots, min_overlap=0.99)
    assert_close("moe cuda vs cpu", yg, yc, kind="fp8_same_quant")
