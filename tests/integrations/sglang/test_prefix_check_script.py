"""scripts/h200_prefix_route_check.py on CPU: the synthetic-weight overwrite puts the project's weights into
SGLang's parameter layouts (checked on the prefix fakes), and the PASS/FAIL table renders every outcome."""
import importlib.util
import types
from pathlib import Path

import torch

import prefix_fakes as F
from glm5_fastpath.weights import random_layer

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "h200_prefix_route_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("h200_prefix_route_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _param(shape, dtype):
    return torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)


def sglang_shaped_model(cfg, layers=2):
    """Fake attention modules plus the SGLang parameters the overwrite touches besides them."""
    out = []
    for i in range(layers):
        a = F.DeepseekV2AttentionMLA(cfg, layer_id=i, seed=7)
        for m, (n, k) in {"o_proj": (cfg.hidden_size, cfg.num_attention_heads * cfg.v_head_dim),
                          "kv_b_proj": (cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)}.items():
            setattr(a, m, types.SimpleNamespace(weight=_param((n, k), torch.float8_e4m3fn),
                                                weight_scale_inv=_param((-(-n // 128), -(-k // 128)), torch.float32)))
        for lin in (a.fused_qkv_a_proj_with_mqa, a.q_b_proj, a.indexer.wq_b):
            lin.weight, lin.weight_scale_inv = torch.zeros_like(lin.weight), torch.zeros_like(lin.weight_scale_inv)
        a.w_kc, a.w_vc = torch.zeros_like(a.w_kc), torch.zeros_like(a.w_vc)
        a.indexer.wk_weights_proj.weight = torch.zeros_like(a.indexer.wk_weights_proj.weight)
        norm = lambda: types.SimpleNamespace(weight=_param((cfg.hidden_size,), torch.bfloat16))  # noqa: E731
        out.append(types.SimpleNamespace(self_attn=a, input_layernorm=norm(), post_attention_layernorm=norm()))
    emb = types.SimpleNamespace(weight=_param((cfg.vocab_size, cfg.hidden_size), torch.bfloat16))
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=out, embed_tokens=emb))


def test_overwrite_puts_project_weights_in_sglang_layouts():
    mod = load_script()
    cfg = F.small_cfg()
    model = sglang_shaped_model(cfg)
    assert mod._overwrite_weights(model, cfg, seed=0) == 2
    for i, layer in enumerate(model.model.layers):
        w = random_layer(cfg, i, seed=0).attn
        a = layer.self_attn
        assert torch.equal(a.fused_qkv_a_proj_with_mqa.weight.view(torch.uint8), w.qkv_a.weight.view(torch.uint8))
        assert torch.equal(a.w_kc, w.w_kc) and torch.equal(a.w_vc, w.w_vc) and torch.equal(a.q_a_layernorm.weight, w.q_a_norm)
        d = cfg.index_head_dim
        assert torch.equal(a.indexer.wk_weights_proj.weight[:d], w.indexer.wk.dequant().to(torch.bfloat16))
        assert torch.equal(a.indexer.wk_weights_proj.weight[d:], w.indexer.weights_proj)
        assert torch.equal(layer.input_layernorm.weight, w.input_norm)
        assert torch.equal(a.indexer.k_norm.bias, w.indexer.k_norm_bias)
    assert 0.015 < model.model.embed_tokens.weight.float().std().item() < 0.025


def test_table_renders_every_outcome():
    mod = load_script()
    good = {"q_pe_rel_err": 1e-3, "k_pe_rel_err": 1e-3, "q_nope_out_rel_err": 2e-3, "k_nope_rel_err": 1e-3,
            "topk_overlap": 0.99, "topk_min_row_overlap": 0.97, "index_k_rel_err": 3e-2, "index_k_bytes_equal_frac": 0.8,
            "index_k_other_bytes_untouched": True, "mla_kv_rel_err": 1e-3}
    eager = {"phase": "eager", "fused_topk": True, "sglang_version": "0.5.14", "gpu": "H200", "mode": "full",
             "routes": {"0": "partial", "1": "partial"},
             "records": [dict(good, layer=0, route="partial", M=4, max_seq_len=3101, passed=True, failures=[])]}
    graph = {"phase": "graph", "fused_topk": True, "captured_calls": 6, "warmup_calls": 12,
             "executor_outcomes": ["partial:routed"],
             "steps": [{"B": 4, "step": 0, "graph": True, "graph_vs_eager": 0.0, "ours_vs_stock": 4e-3,
                        "argmax_agree": 1.0, "passed": True}]}
    table, ok = mod.render([eager, graph])
    assert ok and "ALL PASS" in table and "| 0 | partial | 4 | 3101 |" in table
    bad = dict(eager, records=[dict(good, layer=0, route="partial", M=4, passed=False, failures=["q_pe rel_err=1"]),
                               {"layer": 1, "route": "stock", "reason": "tp_heads", "passed": None}])
    table, ok = mod.render([bad, dict(graph, executor_outcomes=["stock:kv_pool"]), {"phase": "graph", "fused_topk": True,
                                                                                    "error": "boom"}])
    assert not ok and "FAIL: q_pe rel_err=1" in table and "FALLBACK: tp_heads" in table and "ERROR: boom" in table
    assert "some prefix calls fell back" in table
