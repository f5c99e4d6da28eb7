"""bench moe-layer's report (the GPU run itself: tests/moe/test_routed.py covers the kernels; the bench runs on the H200)."""
from glm5_fastpath.bench import moe_layer


def test_markdown_has_every_chain_and_the_differences():
    res = {"gpu": "NVIDIA H200", "date": "d", "commit": "c", "notes": {"stock_router": "r"},
           "rows": [{"M": 8, "router": "split-K", "config": "bn8", "experts_touched_mean": 57.6, "floor_us": 532.1,
                     "fused_us": 532.8, "separate_us": 529.9, "router_quant_us": 528.4, "separate_minus_fused_us": -2.9,
                     "separate_minus_router_quant_us": 1.5, "fused_equals_separate": True},
                    {"M": 16, "router": "split-K", "config": "bn16", "router_quant_error": "RuntimeError: x"}]}
    md = moe_layer.markdown(res)
    head = next(line for line in md.splitlines() if line.startswith("| M |"))
    row = next(line for line in md.splitlines() if line.startswith("| 8 |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    vals = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
    assert vals["router_quant us"] == "528.40" and vals["separate - router_quant us"] == "1.50"
    assert vals["fused == separate == router_quant"] == "True" and vals["stock us"] == "-"
    assert "M=16 router_quant_error: RuntimeError: x" in md  # a failing chain is reported, not dropped


def test_bitwise_equal_compares_fp8_as_bytes():
    import torch

    ids, w = torch.tensor([[1, 3]], dtype=torch.int32), torch.tensor([[0.25, 0.75]])
    x = torch.tensor([1.0, -0.0, 2.0]).to(torch.float8_e4m3fn)
    assert moe_layer._bitwise_equal((x, ids, w), (x.clone(), ids.clone(), w.clone()))
    assert not moe_layer._bitwise_equal((x, ids, w), (torch.tensor([1.0, 0.0, 2.0]).to(torch.float8_e4m3fn), ids, w))
    assert not moe_layer._bitwise_equal((x, ids, w), (x, ids, w + 1e-7))
