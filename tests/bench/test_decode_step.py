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
    assert "check:    teacher-forced per layer, each piece rel L2 <= 0.03" in out and "expert overlap >= 0.9" in out


def test_plan_options():
    p = ds.make_plan(_args("--synthetic-layers", "3", "--dense-layers", "0", "--buckets", "16,1", "--kv-len",
                           "100,4096", "--paths", "ours", "--cmp-mode", "serial", "--no-lm-head", "--preset", "glm5.2"))
    assert [lp.moe for lp in p.layers] == [True, True, True] and p.buckets == [1, 16] and p.paths == ["ours"]
    assert p.kv_lens(3) == [100, 4096, 100] and p.cmp_modes == {1: "serial", 16: "serial"} and not p.lm_head
    assert set(p.megamoe_configs) == {1, 16}
    assert (p.tol, p.min_topk_overlap, p.min_expert_overlap) == (0.03, 0.9, 0.9)  # per-piece, teacher-forced
    p2 = ds.make_plan(_args("--tol", "0.05", "--min-expert-overlap", "0.8"))
    assert (p2.tol, p2.min_expert_overlap) == (0.05, 0.8)
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
    (["--min-expert-overlap", "1.5"], "--min-expert-overlap"),
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


def _cmp(x):
    return {"rel_l2": x, "max_rel": 2 * x, "finite": True}


def _fake_correctness():
    rows = [{"layer": 0, "kind": "dense",
             "prefix": {"q_lat": _cmp(0.003), "q_pe": _cmp(0.004), "residual_out": _cmp(0.0), "kv_entry": _cmp(0.001),
                        "index_k_entry": _cmp(0.015)}, "topk_overlap": 0.987, "core": _cmp(0.004),
             "rest": {"x": _cmp(0.0), "residual": _cmp(0.0), "x_fp8": _cmp(0.002)}, "mlp": _cmp(0.0),
             "layer_out": {"hidden": _cmp(0.02), "residual": _cmp(0.0)},
             "stock_rerun": {"max_rel_l2": 0.0, "topk_overlap": 1.0},
             "caches": {"stock_writes_current": True, "ours_writes_current": True, "restored": True}},
            {"layer": 1, "kind": "moe",
             "prefix": {"q_lat": _cmp(0.003), "q_pe": _cmp(0.004), "residual_out": _cmp(0.0), "kv_entry": _cmp(0.001),
                        "index_k_entry": _cmp(0.016)}, "topk_overlap": 0.981, "core": _cmp(0.005),
             "rest": {"x": _cmp(0.0), "residual": _cmp(0.0), "x_fp8": _cmp(0.002)}, "mlp": _cmp(0.041),
             "expert_overlap": 0.992, "layer_out": {"hidden": _cmp(0.045), "residual": _cmp(0.0)},
             "stock_rerun": {"max_rel_l2": 0.0, "topk_overlap": 1.0},
             "caches": {"stock_writes_current": True, "ours_writes_current": True, "restored": True}}]
    e2e = {"final_hidden": {"rel_l2": 0.088, "max_rel": 0.128, "finite": True}, "logits_argmax_agree": 0.75,
           "min_topk_overlap_seen": 0.9376, "mean_expert_overlap": 0.969, "note": ds.E2E_NOTE,
           "layers": [{"layer": 0, "topk_overlap": 0.987, "attn_out": _cmp(0.11), "mlp_out": _cmp(0.03)},
                      {"layer": 1, "topk_overlap": 0.968, "expert_overlap": 0.977, "attn_out": _cmp(0.18),
                       "mlp_out": _cmp(0.15)}]}
    return ds.summarize_teacher_forced(rows, 0.03, 0.9, 0.9, e2e)


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
               "correctness": _fake_correctness()}
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
    # the teacher-forced check: summary per bucket, per-layer table, failures; the end-to-end drift as information
    assert "## Correctness: teacher-forced per layer" in md
    assert "| 16 | 0.0160 | 0.0050 | 0.0020 | 0.0410 | 0.0450 | 0.9810 | 0.9920 | exact | ok | NO (1 failure, below) |" in md
    assert ("| 16 | 1 | moe | 0.0030 | 0.0040 | 0.0000 | 0.0010 | 0.0160 | 0.0050 | 0.0020 | 0.0410 | 0.0450 | 0.9810 | "
            "0.9920 | FAIL: mlp: rel L2 0.0410 > tol 0.03 |") in md
    assert "| 16 | 0 | dense | 0.0030 |" in md and "| ok |" in md
    assert "- M=16 layer 1 mlp: rel L2 0.0410 > tol 0.03" in md and "Pass (per layer, identical inputs)" in md
    assert "### End-to-end drift (information, not a pass criterion)" in md and ds.E2E_NOTE in md
    assert "| 16 | 0.0880 | 0.1280 | 0.750 | 0.9376 | 0.977 |" in md
    assert "- M=16: 0: 0.9870 / - / 0.1100 / 0.0300; 1: 0.9680 / 0.977 / 0.1800 / 0.1500" in md
    assert "| FAIL |" in md.split("## What runs where")[0]  # the main table's check column
    assert "a note" in md and "bucket 128: time budget" in md
    # --append keeps earlier buckets the new run did not measure, refuses another setup
    new = _fake_report(ms=(16, 64), started="t1")
    merged = ds.merge_existing(json.loads(json.dumps(new, default=str)), tmp_path)
    assert [b["M"] for b in merged["buckets"]] == [1, 16, 64] and merged["meta"]["merged_from"][0]["buckets"] == [1]
    # a bucket merged from a run before the teacher-forced check (its correctness: the end-to-end check) renders
    legacy = dict(merged["buckets"][0])
    legacy["correctness"] = {"final_hidden": {"rel_l2": 0.0276, "max_rel": 0.0276, "finite": True}, "tol_rel_l2": 0.05,
                             "logits_argmax_agree": 1.0, "min_topk_overlap_seen": 0.9585, "passed": True, "failures": [],
                             "layers": [{"layer": 0, "topk_overlap": 1.0, "attn_out": _cmp(0.0038), "mlp_out": _cmp(0.0197)}]}
    merged["buckets"][0] = legacy
    md = ds.render_markdown(merged)
    assert "| 1 | 0.0276 | 0.0276 | 1.000 | 0.9585 | - |" in md and "M=[1]: merged from a run before" in md
    assert "| 16 | 0.0160 |" in md and "| 1 | 0.0030 |" not in md
    other = _fake_report(ms=(2,))
    other["meta"]["setup"] = {"k": 2}
    with pytest.raises(ValueError, match="different model"):
        ds.merge_existing(json.loads(json.dumps(other, default=str)), tmp_path)


# ---- the teacher-forced check on CPU: StepBench with the kernels faked by reference math ----------------------------

SMALL = small_config(num_hidden_layers=2, first_k_dense_replace=1)  # layer 0 dense, layer 1 MoE; both full indexer
LENS = [70, 130, 5, 200]  # rows 0, 1, 3 select 64 of more tokens; row 2 takes all 5
M = len(LENS)


@pytest.fixture(scope="module")
def small_weights():
    from glm5_fastpath.weights import random_layer

    return [random_layer(SMALL, i, seed=5) for i in range(SMALL.num_hidden_layers)]


class _FakeSP:
    """bench.stock_prefix.StockPrefix's building blocks in reference math; scales MN-major like the stock quant's."""

    dg = "reference"

    def __init__(self):
        from glm5_fastpath.ref import prefix as P

        self._c = {"add_rmsnorm": lambda h, r, w, eps: P.a0_add_rmsnorm_quant(h, r, w, eps)[:2]}

    def _quant(self, x):
        from glm5_fastpath.ref.fp8 import quant_act_per_token

        q, s = quant_act_per_token(x)
        return q, s.t().contiguous().t()

    def _gemm(self, x8, xs, w, n):
        from glm5_fastpath.ref.fp8 import block_fp8_linear

        return block_fp8_linear(x8, xs, w[0], w[1]).to(torch.bfloat16)


class _FakeChain:
    """attn_pre.cmp.bench.StockChain: the reference prefix graph, run eagerly on the bound step."""

    def __init__(self, cfg):
        from glm5_fastpath.graph import build_prefix_graph

        self.graph, self.calls = build_prefix_graph(cfg), 0

    def bind(self, st, j):
        return {"w": st.w, "s": st.step}

    def enqueue(self, d):
        from glm5_fastpath.graph import prefix_env, run_eager

        s = d["s"]
        out = run_eager(self.graph, prefix_env(self.graph, hidden=s.hidden, residual=s.residual, positions=s.positions,
                                               out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens,
                                               block_table=s.block_table, w=d["w"], kv_cache=s.kv_cache,
                                               index_k_cache=s.index_k_cache))
        self.calls += 1
        return out["residual_out"], out["q_pe"], out["q_lat"], out["topk_slots"]


def _moe_fp8(x8, xs, ids, wts, experts, cfg, shared: bool):
    """ref.moe's MoE on pre-quantized tokens: fp32 sum over slots (routed, then the shared expert at weight 1/rsf)
    of bf16(weight * expert FC2 accumulator); without the x rsf of the combine."""
    from glm5_fastpath.ref.moe import _ffn_acc

    m, h = x8.shape
    ids, wts = ids.long(), wts.float()
    if shared:
        ids = torch.cat([ids, torch.full((m, 1), cfg.n_routed_experts)], 1)
        wts = torch.cat([wts, torch.full((m, 1), 1.0 / cfg.routed_scaling_factor)], 1)
    slots = torch.zeros(m, ids.shape[1], h, dtype=torch.bfloat16)
    for e in torch.unique(ids).tolist():  # as ref.moe.moe_slot_outputs: each expert once on all of its tokens
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13, w2 = experts.get(e)
        acc = _ffn_acc("fake", x8[tok], xs[tok].contiguous(), w13, w2)
        slots[tok, slot] = (acc * wts[tok, slot].unsqueeze(1)).to(torch.bfloat16)
    acc = torch.zeros(m, h)
    for j in range(ids.shape[1]):
        acc = acc + slots[:, j].float()
    return acc


class _Inject:
    """A prefix op namespace: the reference with some functions replaced."""

    def __init__(self, base, **over):
        self._base, self._over = base, over

    def __getattr__(self, name):
        if name in self._over:
            return self._over[name]
        return getattr(self._base, name)


def _cpu_bench(monkeypatch, weights, *, impl=None, a0=None, route=None, mega=None):
    """A StepBench on the CPU: our prefix = the CMP executor over `impl` (default the reference), our A0 / router /
    MegaMoE and the stock prefix / MoE = reference math (each replaceable to inject an error)."""
    from glm5_fastpath import ops
    from glm5_fastpath.moe import megamoe as MM
    from glm5_fastpath.ref import prefix as P
    from glm5_fastpath.ref.moe import route as ref_route
    from glm5_fastpath.testing.decode_step import make_decode_step

    cfg = SMALL
    plan = ds.Plan(cfg=cfg, source="synthetic", model=None,
                   layers=[ds.LayerPlan(i, cfg.is_moe_layer(i), cfg.is_full_indexer_layer(i))
                           for i in range(cfg.num_hidden_layers)],
                   buckets=[M], kv_pattern=LENS, paths=["ours", "stock"], cmp_modes={M: "serial"}, megamoe_configs={},
                   out="/tmp/unused-decode-step")
    b = ds.StepBench(plan, "cpu")
    b.sp, b.chain, b.prefix_impl = _FakeSP(), _FakeChain(cfg), impl or P
    b._c = {"silu_and_mul": ds.silu_and_mul, "route_topk": ds.route_topk, "combine_shared": ds.combine_shared}
    b._router_gemm = lambda h, gate, gate32: h.float() @ gate.float().t()
    b._mm_config = lambda m: None
    step = make_decode_step(cfg, LENS, seed=7, spare_pages=1)  # what _make_step_inputs does, on the CPU
    bt = step.block_table
    b.pad_page = min(set(range(step.index_k_cache.shape[0])) - set(bt[bt >= 0].tolist()))
    step.block_table = torch.where(bt >= 0, bt, torch.full_like(bt, b.pad_page)).contiguous()
    b.base = step
    for lp, lw in zip(plan.layers, weights):
        L = ds._Layer(lp, lw.attn, lw.post_attn_norm)
        L.kv = step.kv_cache if not b.layers else step.kv_cache.clone()
        L.ik = step.index_k_cache if not b.layers else step.index_k_cache.clone()
        L.w["o_proj"] = (lw.attn.o_proj.weight, lw.attn.o_proj.scale_inv)
        if lp.moe:
            ex = lw.mlp.experts
            L.gate, L.bias, L.mm = lw.mlp.gate, lw.mlp.e_score_correction_bias.float(), ex
            L.dg = lambda x8, xs, ids, wts, m, h, ex=ex: _moe_fp8(x8, xs, ids, wts, ex, cfg, False).to(torch.bfloat16)
            w13, w2 = ex.get(cfg.n_routed_experts)
            L.w["shared"] = [((w13.weight, w13.scale_inv), (w2.weight, w2.scale_inv))]
        else:
            L.dense = lw.mlp
            L.w["gate_up"] = (lw.mlp.gate_up.weight, lw.mlp.gate_up.scale_inv)
            L.w["down"] = (lw.mlp.down.weight, lw.mlp.down.scale_inv)
        b.layers.append(L)
    g = torch.Generator().manual_seed(11)
    b.final_norm = torch.ones(cfg.hidden_size, dtype=torch.bfloat16)
    b.lm_head = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g) * cfg.hidden_size ** -0.5).bfloat16()

    def fake_a0(h, r, w, eps, scale_layout="row"):
        x, r2, x8, xs = P.a0_add_rmsnorm_quant(h, r, w, eps)
        return x, r2, x8, (xs.t().contiguous().t() if scale_layout == "col_tma" else xs)

    def fake_mega(x8, xs, ids, wts, mm, *, routed_scaling_factor, config=None):
        assert xs.is_contiguous()  # the kernel's contract (row-major scales)
        return (_moe_fp8(x8, xs, ids, wts, mm, cfg, True) * routed_scaling_factor).to(torch.bfloat16)

    monkeypatch.setattr(ops, "add_rmsnorm_quant", a0 or fake_a0)
    monkeypatch.setattr(ops, "moe_route", route or (lambda x, gate, bias, c: ref_route(x, gate, bias, c)))
    monkeypatch.setattr(MM, "mega_moe", mega or fake_mega)
    b.set_bucket(M)
    b.fakes = {"a0": fake_a0, "mega": fake_mega}
    return b


def _steps(b):
    recs = {}
    for path in ("ours", "stock"):
        recs[path] = {}
        b.run_step(path, recs[path])
    return recs


def _caches(b):
    return [(L.kv.clone(), L.ik.clone()) for L in b.layers]


def _same_caches(b, before):
    return all(torch.equal(L.kv, kv) and torch.equal(L.ik, ik) for L, (kv, ik) in zip(b.layers, before))


def test_teacher_forced_identical_paths_pass(monkeypatch, small_weights):
    b = _cpu_bench(monkeypatch, small_weights)
    recs = _steps(b)
    before = _caches(b)  # the stock step's state, which the timed runs start from
    seen = []
    core = b.core
    monkeypatch.setattr(b, "core", lambda L, q_lat, q_pe, topk: seen.append(topk) or core(L, q_lat, q_pe, topk))
    c = b.check(recs["ours"], recs["stock"])
    assert c["passed"], c["failures"]
    assert c["method"] == "teacher-forced per layer" and c["tol"] == 0.03 and c["caches_ok"]
    assert _same_caches(b, before)  # saved, poisoned, rewritten twice, restored
    assert [seen[i] is recs["stock"][("prefix", L.i)][2] for i, L in enumerate(b.layers)] == [True, True]  # stock top-k
    dense, moe = c["layers"]
    assert set(dense["prefix"]) == {"q_lat", "q_pe", "residual_out", "kv_entry", "index_k_entry"}
    for row in c["layers"]:
        assert all(x["rel_l2"] == 0 for x in row["prefix"].values())  # the same reference on both sides
        assert row["core"]["rel_l2"] == 0 and all(x["rel_l2"] == 0 for x in row["rest"].values())
        assert row["topk_overlap"] == 1.0 and row["stock_rerun"] == {"max_rel_l2": 0.0, "topk_overlap": 1.0}
        assert row["caches"] == {"stock_writes_current": True, "ours_writes_current": True, "restored": True}
    assert dense["mlp"]["rel_l2"] == 0 and "expert_overlap" not in dense
    # fused MoE (one bf16 rounding of the combine) vs routed + separate shared expert: bf16-level differences
    assert 0 < moe["mlp"]["rel_l2"] < 1e-2 and moe["expert_overlap"] == 1.0
    assert c["worst"]["mlp"] == moe["mlp"]["rel_l2"] and c["min_expert_overlap_seen"] == 1.0
    e2e = c["e2e_drift"]
    assert e2e["final_hidden"]["finite"] and e2e["final_hidden"]["rel_l2"] < 2e-2 and "selection" in e2e["note"]
    assert [x["layer"] for x in e2e["layers"]] == [0, 1] and e2e["min_topk_overlap_seen"] is not None
    json.dumps(c)  # goes into decode_step.json as is


def _perturb_if(target, scale):
    return lambda t, w: t * scale if w is target else t


@pytest.mark.parametrize("where", ["prefix_residual", "kv_entry", "norm", "moe"])
def test_injected_numeric_error_fails_that_piece_only(monkeypatch, small_weights, where):
    """An error in one of OUR pieces of one layer fails that piece of that layer and nothing else (the attention
    core runs on our prefix's q and KV entry, so a KV-entry error also shows there: by design)."""
    from glm5_fastpath.ref import prefix as P
    from glm5_fastpath.ref.fp8 import quant_act_per_token

    w0, w1 = small_weights
    kw = {}
    if where == "prefix_residual":  # layer 1's A0 of our prefix: residual_out x1.1
        def a0(h, r, w, eps):
            x, r2, x8, xs = P.a0_add_rmsnorm_quant(h, r, w, eps)
            return x, (r2.float() * 1.1).bfloat16() if w is w1.attn.input_norm else r2, x8, xs
        kw["impl"] = _Inject(P, a0_add_rmsnorm_quant=a0)
        want = {"layer 1 prefix residual_out"}
    elif where == "kv_entry":  # layer 0's D2 writes a wrong k_pe into the KV cache
        def d2(q_nope, c_kv, k_pe, w, positions, loc, kv, cfg):
            q_lat = P.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, positions, loc, kv, cfg)
            if w.w_kc is w0.attn.w_kc:
                kv[loc.long(), cfg.kv_lora_rank:] *= 3
            return q_lat
        kw["impl"] = _Inject(P, d2_absorb_and_kv_store=d2)
        want = {"layer 0 prefix kv_entry", "layer 0 core"}
    elif where == "norm":  # layer 1's post-attention A0: x x1.06 (and its quantization)
        def a0(h, r, w, eps, scale_layout="row"):
            x, r2, x8, xs = P.a0_add_rmsnorm_quant(h, r, w, eps)
            if w is w1.post_attn_norm:
                x = (x.float() * 1.06).bfloat16()
                x8, xs = quant_act_per_token(x)
            return x, r2, x8, xs
        kw["a0"] = a0
        want = {"layer 1 norm x", "layer 1 norm x_fp8"}
    else:  # layer 1's MegaMoE: output x1.06
        def mega(x8, xs, ids, wts, mm, *, routed_scaling_factor, config=None):
            y = (_moe_fp8(x8, xs, ids, wts, mm, SMALL, True) * routed_scaling_factor)
            return (y * 1.06).bfloat16() if mm is w1.mlp.experts else y.bfloat16()
        kw["mega"] = mega
        want = {"layer 1 mlp"}
    b = _cpu_bench(monkeypatch, small_weights, **kw)
    stock = {}
    b.run_step("stock", stock)  # (check() also compares the free-running ours step: not needed here)
    before = _caches(b)
    c = ds.summarize_teacher_forced([b.teacher_forced_layer(L, stock) for L in b.layers], 0.03, 0.9, 0.9)
    assert not c["passed"]
    failed = {f.split(":")[0] for f in c["failures"]}
    assert failed == want, c["failures"]
    assert all("rel L2" in f and ("> tol 0.03" in f or (f.split(":")[0].endswith("core") and "> tol 0.05" in f))
               for f in c["failures"])
    assert c["caches_ok"] and _same_caches(b, before)
    rows = {r["layer"]: r for r in c["layers"]}
    assert [rows[i]["passed"] for i in (0, 1)] == [not any(f.startswith("layer 0") for f in want),
                                                   not any(f.startswith("layer 1") for f in want)]
    md = "\n".join(ds.render_correctness([{"M": M, "correctness": c}]))
    assert "FAIL: " in md and "Failures:" in md


def test_selection_flips_are_reported_and_do_not_leak_into_the_numerics(monkeypatch, small_weights):
    """Our indexer / router choosing differently on identical inputs fails the overlap criteria only: the core runs
    on the stock top-k and the MoE on the stock routing."""
    from glm5_fastpath.ref import prefix as P
    from glm5_fastpath.ref.moe import route as ref_route

    w1 = small_weights[1]

    def e1(q8, head_w, cache, seq_lens, bt, cfg, **kw):  # layer 1 (identified by its index-K cache): noisy logits
        lg = P.e1_indexer_logits(q8, head_w, cache, seq_lens, bt, cfg, **kw)
        if cache is b.layers[1].ik:
            lg = lg + 100 * torch.rand(lg.shape, generator=torch.Generator().manual_seed(0)) * lg.abs().max()
        return lg

    def route(x, gate, bias, cfg):  # layer 1's router swaps every token's last expert for an unchosen one
        ids, w, logits = ref_route(x, gate, bias, cfg)
        if gate is w1.mlp.gate:
            ids = ids.clone()
            for t in range(ids.shape[0]):
                ids[t, -1] = next(e for e in range(cfg.n_routed_experts) if e not in ids[t].tolist())
        return ids, w, logits

    b = _cpu_bench(monkeypatch, small_weights, impl=_Inject(P, e1_indexer_logits=e1), route=route)
    recs = _steps(b)
    c = b.check(recs["ours"], recs["stock"])
    layer1 = c["layers"][1]
    assert layer1["topk_overlap"] < 0.9 and layer1["expert_overlap"] == pytest.approx(0.75)
    assert len(c["failures"]) == 2 and c["failures"][0].startswith("layer 1 indexer top-k overlap 0.")
    assert c["failures"][1] == "layer 1 expert overlap 0.7500 < 0.9 (identical inputs)"
    assert layer1["core"]["rel_l2"] == 0 and layer1["mlp"]["rel_l2"] < 1e-2 and c["layers"][0]["passed"]
    # the free-running steps did diverge: the end-to-end drift shows it (information only)
    assert c["e2e_drift"]["layers"][1]["topk_overlap"] < 0.9


def test_a_prefix_that_does_not_write_its_cache_entry_is_caught(monkeypatch, small_weights):
    """The check poisons the current token's entries before each re-run: our prefix skipping the KV store fails
    (and the core reading the poisoned row is not finite); the caches still end as the stock step left them."""
    from glm5_fastpath.ref import prefix as P

    w1 = small_weights[1]

    def d2(q_nope, c_kv, k_pe, w, positions, loc, kv, cfg):
        if w.w_kc is w1.attn.w_kc:
            return P.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, positions, loc, kv.clone(), cfg)  # no store
        return P.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, positions, loc, kv, cfg)

    b = _cpu_bench(monkeypatch, small_weights, impl=_Inject(P, d2_absorb_and_kv_store=d2))
    stock = {}
    b.run_step("stock", stock)  # only the stock record is needed
    before = _caches(b)
    row = b.teacher_forced_layer(b.layers[1], stock)
    assert row["caches"] == {"stock_writes_current": True, "ours_writes_current": False, "restored": True}
    assert not row["core"]["finite"] and not row["prefix"]["kv_entry"]["finite"]
    fails = ds.teacher_forced_failures(row, 0.03, 0.9, 0.9)
    assert "layer 1: our prefix did not write the current token's cache entries" in fails and "layer 1 core: not finite" in fails
    assert _same_caches(b, before)


def test_forced_routing_plumbing(monkeypatch, small_weights):
    from glm5_fastpath import ops
    from glm5_fastpath.ref.moe import moe_forward
    from glm5_fastpath.weights import MoEWeights

    b = _cpu_bench(monkeypatch, small_weights)
    L = b.layers[1]
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(M, SMALL.hidden_size, generator=g) * 2).bfloat16()
    x8, xs = b.sp._quant(x)
    ids = torch.stack([torch.randperm(SMALL.n_routed_experts, generator=g)[:SMALL.num_experts_per_tok]
                       for _ in range(M)]).int()
    wts = torch.rand(M, SMALL.num_experts_per_tok, generator=g)
    wts = wts / wts.sum(1, keepdim=True)
    ref = moe_forward(x, MoEWeights(L.gate, L.bias, L.mm), SMALL, ids, wts)
    dg_seen = []
    dg = L.dg
    L.dg = lambda x8_, xs_, ids_, wts_, m, h: dg_seen.append((ids_, wts_)) or dg(x8_, xs_, ids_, wts_, m, h)
    monkeypatch.setattr(ops, "moe_route", lambda *a: pytest.fail("a forced routing must not call the router"))
    y, i2, w2 = b.mlp("ours", L, x, x8, xs.contiguous(), routing=(ids, wts))
    assert i2 is ids and w2 is wts and torch.equal(y, ref)
    b._router_gemm = lambda *a: pytest.fail("a forced routing must not call the stock router")
    y, i2, w2 = b.mlp("stock", L, x, x8, xs, routing=(ids, wts))
    assert dg_seen[0][0] is ids and dg_seen[0][1] is wts
    assert ds.compare(y, ref)["rel_l2"] < 1e-2
    # unforced: the path's own router, and the routing is returned (what run_step records)
    b2 = _cpu_bench(monkeypatch, small_weights)
    y, i2, w2 = b2.mlp("ours", b2.layers[1], x, x8, xs.contiguous())
    r_ids, r_w = b2.route("stock", b2.layers[1], x)
    assert torch.equal(i2, r_ids) and torch.allclose(w2, r_w, atol=1e-6)
    assert b2.mlp("ours", b2.layers[0], x, x8, xs)[1:] == (None, None)  # dense
    rec = {}
    b2.run_step("stock", rec)
    assert rec[("routing", 1)][0] is rec[("ids", 1)] and rec[("routing", 0)] == (None, None)


def test_cache_digest_and_failure_rules():
    t = torch.randn(64, 10).bfloat16()
    d = ds.cache_digest(t, chunk=100)
    assert d == ds.cache_digest(t.clone(), chunk=256)
    u = t.clone()
    u[3, 4] = float(u[3, 4]) + 1
    assert ds.cache_digest(u) != d
    v = t.clone()
    v[[0, 1]] = v[[1, 0]]  # swapped rows: same plain sum, different position-weighted sum
    assert ds.cache_digest(v)[0] == d[0] and ds.cache_digest(v) != d
    b8 = torch.randint(0, 255, (3, 7), dtype=torch.uint8)  # odd byte count
    assert ds.cache_digest(b8) == ds.cache_digest(b8.clone())
    ok = {"rel_l2": 0.01, "max_rel": 0.02, "finite": True}
    row = {"layer": 2, "prefix": {"q_lat": ok, "kv_entry": {"rel_l2": 0.05, "finite": True}}, "core": ok,
           "rest": {"x": ok}, "mlp": {"rel_l2": float("nan"), "finite": False}, "topk_overlap": 0.95,
           "expert_overlap": 0.85, "layer_out": {"hidden": {"rel_l2": 0.5, "finite": True}},
           "stock_rerun": {"max_rel_l2": 0.2}, "caches": {"restored": False, "ours_writes_current": True}}
    assert ds.teacher_forced_failures(row, 0.03, 0.9, 0.9) == [
        "layer 2 prefix kv_entry: rel L2 0.0500 > tol 0.03", "layer 2 mlp: not finite",
        "layer 2 expert overlap 0.8500 < 0.9 (identical inputs)",
        "layer 2: the caches differ after the check (restore failed)"]  # layer out / stock re-run: information
    s = ds.summarize_teacher_forced([row], 0.03, 0.9, 0.9, None)
    assert not s["passed"] and not s["caches_ok"] and s["worst"]["mlp"] == float("inf")
    assert s["worst"]["prefix"] == 0.05 and s["worst"]["layer_out"] == 0.5 and s["min_expert_overlap_seen"] == 0.85


# ---- GPU ------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_two_layer_step_ours_vs_stock(tmp_path):
    """1 dense + 1 MoE synthetic layers at full dims, buckets 1 and 16: both paths run as whole-step graphs and
    agree teacher-forced per layer (every piece within --tol on identical inputs, selections overlapping, caches
    restored); the end-to-end drift is reported."""
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
        assert c["passed"], c["failures"]
        assert c["method"] == "teacher-forced per layer" and c["caches_ok"]
        assert c["layers"][0]["topk_overlap"] > 0.95 and c["layers"][1]["expert_overlap"] > 0.9
        assert c["e2e_drift"]["final_hidden"]["finite"]
    assert rc == 0


def test_fp8_entries_and_the_core_have_their_own_tolerances():
    """The FP8 index-K entry is judged at the e4m3 half-ULP (2^-4), the core at 0.05, everything else at --tol:
    FP8-rounding-level differences pass, a real error (a wrong formula: O(1)) fails."""
    def row(ik, core, q=0.01):
        return {"layer": 2, "prefix": {"q_lat": {"rel_l2": q}, "index_k_entry": {"rel_l2": ik}},
                "core": {"rel_l2": core}, "mlp": {"rel_l2": 0.02}}

    assert ds.teacher_forced_failures(row(0.046, 0.033), 0.03, 0.9, 0.9) == []  # the H200 run's worst values
    assert ds.TOL_FP8 == 2.0 ** -4
    f = ds.teacher_forced_failures(row(0.07, 0.06, q=0.031), 0.03, 0.9, 0.9)
    assert f == ["layer 2 prefix q_lat: rel L2 0.0310 > tol 0.03", "layer 2 prefix index_k_entry: rel L2 0.0700 > tol 0.0625",
                 "layer 2 core: rel L2 0.0600 > tol 0.05"]
    assert ds.teacher_forced_failures(row(0.07, 0.06), 0.03, 0.9, 0.9, tol_fp8=0.1, tol_core=0.1) == []
