"""`bench decode-step` on CPU: argument validation, --dry-run plan and memory estimate, the step floor, the
capture-safe shared math vs the reference, the JSON / markdown writer fed with fake timings; plus a GPU run."""
import json

import pytest
import torch

from glm5_fastpath import cost
from glm5_fastpath.bench import decode_step as ds
from glm5_fastpath.cli import build_parser, main
from glm5_fastpath.config import Glm5Config, small_config


def _args(*argv):
    return build_parser().parse_args(["bench", "decode-step", "--out", "/tmp/unused-decode-step", *argv])


# ---- arguments and plan ------------------------------------------------------------------------------------------


def test_registered_under_bench():
    sub = build_parser()._subparsers._group_actions[0].choices["bench"]  # noqa: SLF001
    assert "decode-step" in sub._subparsers._group_actions[0].choices  # noqa: SLF001


def test_default_plan_is_four_synthetic_layers(capsys):
    assert main(["bench", "decode-step", "--out", "/tmp/unused-decode-step", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4: 0 dense, 1 moe, 2 moe, 3 moe" in out
    assert "buckets:  [1, 8, 16, 32, 64, 128]" in out and "8192 per sequence" in out
    assert "N(0, 0.02), zero correction bias" in out
    assert "GPU memory estimate:" in out and "(fits)" in out and "MoE experts (checkpoint layout)" in out
    assert "CMP mode per bucket: 1: full" in out and "128: multistream" in out
    assert "rough run time" in out


def test_plan_options():
    p = ds.make_plan(_args("--synthetic-layers", "3", "--dense-layers", "0", "--buckets", "16,1", "--kv-len",
                           "100,4096", "--paths", "ours", "--cmp-mode", "serial", "--no-lm-head", "--preset", "glm5.2"))
    assert [lp.moe for lp in p.layers] == [True, True, True] and p.buckets == [1, 16] and p.paths == ["ours"]
    assert p.kv_lens(3) == [100, 4096, 100] and p.cmp_modes == {1: "serial", 16: "serial"} and not p.lm_head
    assert set(p.megamoe_configs) == {1, 16}
    assert p.memory["components_bytes"]["DeepGEMM transformed experts (upper bound)"] == 0  # no stock path
    p = ds.make_plan(_args("--synthetic-layers", "5", "--dense-layers", "1", "--preset", "glm5.2"))
    assert [lp.full_indexer for lp in p.layers] == [True, True, True, False, False]  # IndexShare: 0, 1, 2, 6, ...
    assert p.layers[3].kind == "moe/shared-indexer"


@pytest.mark.parametrize("argv, msg", [
    (["--model", "/x", "--synthetic-layers", "2"], "not both"),
    (["--synthetic-layers", "2", "--dense-layers", "3"], "--dense-layers"),
    (["--synthetic-layers", "0"], ">= 1"),
    (["--num-layers", "2"], "--num-layers is for --model"),
    (["--randomize-routers"], "--randomize-routers is for --model"),
    (["--buckets", "0,4"], "1..256"),
    (["--buckets", "512"], "1..256"),
    (["--buckets", "4,4"], "duplicates"),
    (["--buckets", "a"], "integers"),
    (["--kv-len", "0"], "--kv-len"),
    (["--paths", "ours,turbo"], "--paths"),
    (["--paths", "ours,ours"], "--paths"),
    (["--repeat", "0"], "--repeat"),
    (["--tol", "2"], "--tol"),
    (["--cmp-mode", "warp"], "--cmp-mode"),
])
def test_invalid_arguments(argv, msg, capsys):
    with pytest.raises(ValueError, match=msg):
        ds.make_plan(_args(*argv))
    assert main(["bench", "decode-step", "--out", "/tmp/unused-decode-step", "--dry-run", *argv]) == 2
    assert "error" in capsys.readouterr().err


def _full_dims_model(tmp_path, layers=5):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(Glm5Config.preset("glm5").replace(num_hidden_layers=layers).to_hf_dict()))
    return d


def test_model_dir_config_and_missing_weights(tmp_path, capsys):
    d = _full_dims_model(tmp_path)
    p = ds.make_plan(_args("--model", str(d), "--num-layers", "4", "--randomize-routers"))
    assert p.source == "model" and [lp.moe for lp in p.layers] == [False, False, False, True]
    with pytest.raises(ValueError, match="--num-layers 9"):
        ds.make_plan(_args("--model", str(d), "--num-layers", "9"))
    # the dry run checks the checkpoint's tensors (headers only): no shards here -> a clear error, exit 2
    assert main(["bench", "decode-step", "--out", str(tmp_path / "o"), "--model", str(d), "--dry-run"]) == 2
    assert "model.safetensors" in capsys.readouterr().err
    assert main(["bench", "decode-step", "--out", str(tmp_path / "o"), "--model", str(tmp_path / "nope"), "--dry-run"]) == 2
    small = tmp_path / "small"
    small.mkdir()
    (small / "config.json").write_text(json.dumps(small_config().to_hf_dict()))
    with pytest.raises(ValueError, match="not a full-dims GLM-5"):
        ds.make_plan(_args("--model", str(small)))


def test_no_cuda_and_pre_hopper_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "decode-step", "--out", "/tmp/unused-decode-step"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    assert ds.main(["--out", "/tmp/unused-decode-step"]) == 2
    err = capsys.readouterr().err
    assert "sm_90" in err and "A100" in err and "sm_80" in err


def test_memory_estimate_components_and_does_not_fit(capsys):
    cfg = Glm5Config.preset("glm5")
    lay = [ds.LayerPlan(0, False, True), ds.LayerPlan(1, True, True)]
    both = ds.estimate_memory(cfg, lay, [1, 128], [8192], ["ours", "stock"], True, prepare_copies=False)
    ours = ds.estimate_memory(cfg, lay, [1, 128], [8192], ["ours"], True, prepare_copies=True)
    c = both["components_bytes"]
    assert c["MoE experts (checkpoint layout)"] == pytest.approx(257 * cost.expert_bytes(cfg))
    assert 9.6e9 < c["MoE experts (checkpoint layout)"] < 9.8e9  # 257 x 37.76 MB
    assert c["MegaMoE prepared w13 copy"] == 0 and ours["components_bytes"]["MegaMoE prepared w13 copy"] > 6.4e9
    assert ours["components_bytes"]["DeepGEMM transformed experts (upper bound)"] == 0
    assert c["final norm + lm_head"] == pytest.approx(154880 * 6144 * 2 + 2 * 6144)
    assert c["KV + index-K caches"] == pytest.approx(2 * ((128 * 128 + 1) * (64 * 576 * 2 + 8448)))
    assert both["total_gib"] == pytest.approx(sum(c.values()) / 2**30) and both["fits"]
    assert main(["bench", "decode-step", "--out", "/tmp/unused-decode-step", "--dry-run", "--synthetic-layers", "12",
                 "--dense-layers", "1"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_cmp_mode_for_auto_table_and_explicit():
    from glm5_fastpath.selection import parse

    assert ds.cmp_mode_for(16, "auto") == "full" and ds.cmp_mode_for(17, "auto") == "multistream"
    assert ds.cmp_mode_for(64, "serial") == "serial"
    t = parse({"version": 1, "gpu": ["H200"], "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "stock",
                                                           "cmp_mode": "multistream_pdl_entry"}]})
    assert ds.cmp_mode_for(4, "auto", t) == "multistream_pdl_entry" and ds.cmp_mode_for(64, "auto", t) == "multistream"


# ---- floors --------------------------------------------------------------------------------------------------------


def test_step_floor_sums_layers_and_tail():
    cfg = Glm5Config.preset("glm5").replace(num_hidden_layers=2, first_k_dense_replace=1)
    lay = [ds.LayerPlan(0, False, True), ds.LayerPlan(1, True, True)]
    ids = torch.arange(8).view(1, 8)
    f = ds.step_floor(cfg, lay, 1, [8192], {1: ids}, True)
    moe = f["layers"][1]
    assert moe["mlp_bytes"] == pytest.approx(sum(c.bytes for c in cost.moe_costs(cfg, 1, routing=ids)))
    assert 9 * 37.7e6 < moe["mlp_bytes"] < 9 * 37.8e6 + 4e6  # 8 routed + the shared expert (+ the 3.1 MB router)
    assert f["layers"][0]["mlp_bytes"] == pytest.approx(sum(c.bytes for c in cost.dense_mlp_costs(cfg, 1)))
    lc = cost.layer_summary(cfg, 1, [8192], layer=1, routing=ids, fused_prefix=True)
    assert moe["bytes"] == pytest.approx(lc.bytes)
    assert f["tail_bytes"] == pytest.approx(154880 * 6144 * 2 + 6144 * 2 * 4 + 154880 * 2 + 6144 * 2)
    assert f["bytes"] == pytest.approx(sum(r["bytes"] for r in f["layers"]) + f["tail_bytes"])
    assert f["floor_us"] == pytest.approx(f["bytes"] / 4.27e12 * 1e6)
    # no routing given: the uniform-routing expectation (8 distinct at M=1 as well)
    assert ds.step_floor(cfg, lay, 1, [8192], {}, True)["bytes"] == pytest.approx(f["bytes"])
    # more tokens touch more experts; lm_head off drops 1.9 GB
    assert ds.step_floor(cfg, lay, 64, [8192] * 64, {}, False)["layers"][1]["mlp_bytes"] > 200 * 37.7e6
    assert ds.step_floor(cfg, lay, 1, [8192], {1: ids}, False)["tail_bytes"] < 1e6


# ---- the shared math (capture-safe versions) against the reference -------------------------------------------------


def test_sparse_mla_matches_reference():
    from glm5_fastpath.ref.attn_core import sparse_mla_decode

    cfg = small_config()
    g = torch.Generator().manual_seed(0)
    m, nh, r, rope, slots = 3, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, 40
    kv = torch.randn(slots, r + rope, generator=g).bfloat16()
    q_lat = torch.randn(m, nh, r, generator=g).bfloat16()
    q_pe = torch.randn(m, nh, rope, generator=g).bfloat16()
    top = torch.stack([torch.randperm(slots, generator=g)[:16] for _ in range(m)]).int()
    top[1, 5:] = -1
    want = sparse_mla_decode(q_lat, q_pe, kv, top, cfg).float()
    got = ds.sparse_mla(q_lat, q_pe, kv, top, cfg.softmax_scale).float()
    assert got.shape == want.shape
    assert (got - want).norm() / want.norm() < 2e-2


def test_route_topk_and_combine_match_reference():
    from glm5_fastpath.ref.moe import route

    cfg = small_config()
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, cfg.hidden_size, generator=g).bfloat16()
    gate = (0.02 * torch.randn(cfg.n_routed_experts, cfg.hidden_size, generator=g)).bfloat16()
    bias = torch.zeros(cfg.n_routed_experts)
    ids_ref, w_ref, logits = route(h, gate, bias, cfg)
    ids, w = ds.route_topk(logits, bias, cfg.num_experts_per_tok)
    assert ids.dtype == torch.int32 and torch.equal(ids, ids_ref) and torch.allclose(w, w_ref, atol=1e-6)
    y = ds.combine_shared(torch.ones(2, 4).bfloat16(), torch.full((2, 4), 0.5).bfloat16(), 2.5)
    assert torch.equal(y.float(), torch.full((2, 4), 3.0))
    gu = torch.randn(2, 8, generator=g).bfloat16()
    a = ds.silu_and_mul(gu)
    assert a.shape == (2, 4) and torch.allclose(a.float(), (torch.nn.functional.silu(gu[:, :4].float()) * gu[:, 4:].float()),
                                                atol=1e-2)


def test_overlap_and_compare_helpers():
    a = torch.tensor([[1, 2, 3, -1], [4, 5, 6, 7]], dtype=torch.int32)
    b = torch.tensor([[3, 2, 9, -1], [7, 6, 5, 4]], dtype=torch.int32)
    assert ds.set_overlap(a, b) == pytest.approx((2 / 3 + 1.0) / 2)
    assert ds.set_overlap(b, b) == 1.0
    x = torch.ones(4, 8)
    c = ds.compare(x * 1.01, x)
    assert c["rel_l2"] == pytest.approx(0.01, rel=1e-6) and c["max_rel"] == pytest.approx(0.01, rel=1e-6) and c["finite"]
    assert not ds.compare(x * float("nan"), x)["finite"]


# ---- report writer with fake timings ---------------------------------------------------------------------------------


def _fake_report(ms=(1, 16), started="t0"):
    cfg = Glm5Config.preset("glm5").replace(num_hidden_layers=2, first_k_dense_replace=1)
    lay = [ds.LayerPlan(0, False, True), ds.LayerPlan(1, True, True)]
    t = lambda us: {"median_us": us, "min_us": us * 0.99, "method": "cuda-graph"}  # noqa: E731
    rows = []
    for m in ms:
        ids = torch.arange(8).view(1, 8).repeat(m, 1)
        row = {"M": m, "cmp_mode": "full", "megamoe_config": "bn8_s6_g512_w4", "errors": {},
               "steps": {"ours": t(1000.0 + m), "stock": t(1500.0 + m)},
               "distinct_experts": {"ours": {1: 8}, "stock": {1: 8}}, "routing_from": "ours",
               "floor": ds.step_floor(cfg, lay, m, [8192] * m, {1: ids}, True),
               "pieces": {"ours": {"prefix[full]": t(50.0), "rest": t(3.0), "mlp[moe]": t(400.0)},
                          "stock": {"prefix[full]": t(120.0), "rest": t(6.0), "mlp[moe]": t(600.0),
                                    "e2_standin": t(80.0)},
                          "shared": {"core": {**t(60.0), "covers_2x_l2": False}, "mlp[dense]": t(90.0), "tail": t(460.0)}},
               "correctness": {"final_hidden": {"rel_l2": 0.012, "max_rel": 0.03, "finite": True}, "tol_rel_l2": 0.05,
                               "min_topk_overlap": 0.9, "logits_argmax_agree": 1.0, "min_topk_overlap_seen": 0.995,
                               "layers": [{"layer": 0, "topk_overlap": 1.0, "attn_out": {"rel_l2": 0.01},
                                           "mlp_out": {"rel_l2": 0.01}},
                                          {"layer": 1, "topk_overlap": 0.995, "expert_overlap": 0.98,
                                           "attn_out": {"rel_l2": 0.02}, "mlp_out": {"rel_l2": 0.03}}],
                               "passed": True, "failures": []}}
        rows.append(ds.derive_bucket(row, lay))
    meta = {"gpu": "NVIDIA H200", "date": "2026-11-30", "commit": "abc", "started": started, "model_desc": "synthetic 2",
            "layers": [{"index": 0, "kind": "dense"}, {"index": 1, "kind": "moe"}], "kv_desc": "8192", "lm_head": True,
            "deep_gemm": "0.1.3", "copy_bandwidth_tb_s": 4.2, "method": ds.METHOD, "notes": ["a note"],
            "labels": {"prefix": {"ours": "CMP", "stock": "stock seq"}, "core": {"shared": "torch core"}},
            "setup": {"k": 1}}
    return {"meta": meta, "buckets": rows, "skipped": [{"M": 128, "skipped": "time budget"}]}


def test_derive_speedups_floor_ratios_and_breakdown():
    r = _fake_report()["buckets"][1]
    d = r["derived"]
    assert d["speedup"] == pytest.approx(1516 / 1016)
    assert d["ours_over_floor"] == pytest.approx(1016 / r["floor"]["floor_us"])
    assert d["stock_adjusted_us"] == pytest.approx(1516 - 2 * (80 - 3))  # two indexer layers
    assert d["speedup_adjusted"] == pytest.approx((1516 - 154) / 1016)
    dense, moe = d["per_layer"]
    assert dense["ours"]["layer"] == pytest.approx(50 + 60 + 3 + 90) and dense["stock"]["layer"] == pytest.approx(120 + 60 + 6 + 90)
    assert moe["ours"]["layer"] == pytest.approx(50 + 60 + 3 + 400) and moe["stock"]["mlp"] == 600
    assert d["pieces_sum_us"]["ours"] == pytest.approx(203 + 513 + 460)
    assert d["shared_us"] == pytest.approx(2 * 60 + 90 + 460)
    assert d["speedup_excl_shared"] == pytest.approx((1516 - 670) / (1016 - 670))
    # the reference MoE fallback: no speedup claimed
    row = _fake_report()["buckets"][0]
    assert ds.derive_bucket(row, [ds.LayerPlan(0, False, True), ds.LayerPlan(1, True, True)], True)["derived"]["speedup"] is None


def test_writer_markdown_json_and_append(tmp_path):
    rep = _fake_report()
    ds.write_results(rep, tmp_path)
    j = json.loads((tmp_path / "decode_step.json").read_text())
    assert [b["M"] for b in j["buckets"]] == [1, 16] and j["buckets"][0]["derived"]["speedup"] > 1
    md = (tmp_path / "decode_step.md").read_text()
    assert "| 16 | full | bn8_s6_g512_w4 | 8 |" in md and "| 1.49 |" in md and "| 670.0 | 2.45 |" in md
    assert "## What runs where" in md and "| core | torch core | (same) |" in md
    assert "## Per-layer breakdown, M=16" in md and "**whole step (one graph)**" in md and "**1016.0**" in md
    assert "stock E2 stand-in" in md and "shared core" in md  # the core piece did not cover 2x L2: flagged
    assert "## Correctness" in md and "| 16 | 0.0120 | 0.0300 | 1.000 | 0.9950 | 0.980 | yes |" in md
    assert "a note" in md and "bucket 128: time budget" in md
    # --append keeps earlier buckets the new run did not measure, refuses another setup
    new = _fake_report(ms=(16, 64), started="t1")
    merged = ds.merge_existing(json.loads(json.dumps(new, default=str)), tmp_path)
    assert [b["M"] for b in merged["buckets"]] == [1, 16, 64] and merged["meta"]["merged_from"][0]["buckets"] == [1]
    other = _fake_report(ms=(2,))
    other["meta"]["setup"] = {"k": 2}
    with pytest.raises(ValueError, match="different model"):
        ds.merge_existing(json.loads(json.dumps(other, default=str)), tmp_path)


# ---- GPU ------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_two_layer_step_ours_vs_stock(tmp_path):
    """1 dense + 1 MoE synthetic layers at full dims, buckets 1 and 16: both paths run as whole-step graphs and
    agree (final hidden state within FP8 noise, indexer top-k overlap)."""
    out = tmp_path / "ds"
    rc = ds.main(["--synthetic-layers", "2", "--dense-layers", "1", "--buckets", "1,16", "--kv-len", "4096",
                  "--repeat", "3", "--out", str(out)])
    rep = json.loads((out / "decode_step.json").read_text())
    assert [b["M"] for b in rep["buckets"]] == [1, 16]
    for b in rep["buckets"]:
        assert b["steps"]["ours"].get("method") == "cuda-graph", b["steps"]["ours"]
        assert b["floor"]["floor_us"] > 0 and b["derived"]["ours_over_floor"] > 1.0
    if any("skipped" in b["steps"].get("stock", {}) for b in rep["buckets"]):
        pytest.skip(f"stock path skipped: {rep['buckets'][0]['steps']['stock']}")
    for b in rep["buckets"]:
        assert b["steps"]["stock"].get("median_us"), b["steps"]["stock"]
        c = b["correctness"]
        assert c["passed"], c
        assert c["layers"][0]["topk_overlap"] > 0.95
    assert rc == 0
