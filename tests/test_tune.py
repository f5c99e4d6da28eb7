"""glm5-fastpath tune: the per-bucket choice from a benchmark report (CPU, synthetic reports)."""
import json

import pytest

from glm5_fastpath import selection, tune


def _row(m, stock, **modes):
    return {"M": m, "stock": {"median_us": stock} if stock is not None else {"skipped": "no deep_gemm"},
            "modes": {k: ({"median_us": v} if v is not None else {"error": "boom"}) for k, v in modes.items()}}


def test_choose_prefix_fastest_mode_and_gain_threshold():
    assert tune.choose_prefix(_row(16, 100.0, serial=80.0, multistream=60.0, full=66.0))[:2] == ("cmp", "multistream")
    # within 3 % of stock: keep SGLang's path
    assert tune.choose_prefix(_row(256, 100.0, serial=120.0, full=98.5))[:2] == ("stock", None)
    assert tune.choose_prefix(_row(8, None, full=50.0))[:2] == ("cmp", "full")
    ex, mode, why = tune.choose_prefix(_row(8, 40.0, full=None))
    assert (ex, mode) == ("stock", None) and "no CMP mode" in why


def test_modes_within_the_margin_count_as_tied_and_the_first_listed_wins():
    """Session 16 (H200, call 3 merged): composites beat multistream by ~1 % at 32-128 tokens (inside the spread),
    full+pin:D1=0 beat every named mode by 3-5 % at 1-4: only the latter may change the table."""
    r32 = _row(32, 92.4, multistream=66.2, full=67.9, **{"full+after:D1>D0": 65.4})
    assert tune.choose_prefix(r32)[1] == "multistream"
    assert tune.choose_prefix(r32, mode_margin=0.0)[1] == "full+after:D1>D0"
    r1 = _row(1, 74.0, multistream_pdl_prologue=45.6, full=46.2, **{"full+pin:D1=0": 44.1})
    assert tune.choose_prefix(r1)[1] == "full+pin:D1=0"
    doc = tune.table_from_report({"device": "H200", "kv_len": 8192, "rows": [r32]}, ["H200"], mode_margin=0.0)
    assert doc["buckets"][0]["cmp_mode"] == "full+after:D1>D0"


def test_table_from_report_is_a_valid_selection_table(tmp_path):
    rep = {"device": "NVIDIA H200", "kv_len": 8192,
           "rows": [_row(64, 145.0, serial=130.0, multistream=110.0, full=100.0),
                    _row(16, 120.0, serial=83.0, multistream=66.7, full=70.2),
                    _row(256, 200.0, serial=300.0, full=290.0)]}
    doc = tune.table_from_report(rep, ["H200"], commit="abc123")
    assert [b["tokens"] for b in doc["buckets"]] == [16, 64, 256]
    assert doc["buckets"][0] == {"tokens": 16, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream"}
    assert doc["buckets"][1] == {"tokens": 64, "prefix": "cmp", "moe": "stock"}  # full is the default mode
    assert doc["buckets"][2]["prefix"] == "stock"
    assert "abc123" in doc["comment"] and "M<=16" in doc["comment"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    t = selection.load(p)
    assert t.lookup(10).choice.cmp_mode == "multistream" and t.lookup(40).choice.cmp_mode == "full"
    assert t.lookup(300).reason == "above_largest_bucket"


def test_selection_rejects_unknown_cmp_mode():
    doc = {"version": 1, "buckets": [{"tokens": 1, "prefix": "cmp", "moe": "stock", "cmp_mode": "turbo"}]}
    with pytest.raises(selection.SelectionError, match=r"buckets\[0\]\.cmp_mode"):
        selection.parse(doc, "x.json")


def test_cli_tune_needs_a_gpu(capsys, tmp_path):
    import torch

    from glm5_fastpath.cli import main

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU error path")
    assert main(["tune", "--out", str(tmp_path / "t.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---- MoE part (issue #7) -------------------------------------------------------------------------------------

def _moe_row(m, stock, cands, *, quant=None, kind=tune.STOCK_TRITON, includes_quant=False):
    """A MoE report row: cands {config name: median us | "excluded reason"}; stock None = no stock timing."""
    st = ({"kind": kind, "median_us": stock, "includes_quant": includes_quant, "includes_shared": True}
          if stock is not None else {"kind": None, "skipped": "no SGLang, no DeepGEMM"})
    row = {"M": m, "experts_expected": tune.expected_distinct_experts(m), "experts_touched": 8, "floor_us": 80.0,
           "default_config": next(iter(cands)), "stock": st,
           "candidates": {k: ({"median_us": v, "min_us": v - 1, "p90_us": v + 1, "fc1_split": False, "check": "bitwise"}
                              if isinstance(v, float) else {"excluded": v, "fc1_split": True}) for k, v in cands.items()}}
    if quant is not None:
        row["quant"] = {"median_us": quant}
    return row


def _moe_rep(rows, kind=tune.STOCK_TRITON):
    return {"device": "NVIDIA H200", "date": "2026-12-01", "commit": "abc123", "hidden": 6144, "inter": 2048,
            "experts": 256, "shared": 1, "topk": 8, "rsf": 2.5, "launches": 10, "replays": 30, "margin": 0.03,
            "without_stock": False, "stock": {"kind": kind, "note": "", "tried": [{"kind": kind}]}, "rows": rows,
            "aborted": None}


def test_moe_candidates_valid_bounded_default_first():
    from glm5_fastpath.moe import megamoe as MM

    for m in tune.DEFAULT_BUCKETS:
        default = MM.default_config(m, 256, 8, 1, 132)
        load = MM.expected_max_load(m, 256, 8)
        for n in (1, 2, 3, 4, 6):
            cands = tune.moe_candidates(m, n)
            assert 1 <= len(cands) <= n
            assert cands[0] == default
            names = [c.name for c in cands]
            assert len(set(names)) == len(names)
            for c in cands:
                assert c.validate() is c and c.stages == MM.max_stages(c.block_n)
                assert c.block_n == default.block_n or c.block_n >= load  # holds the expected routed load
                # the default's split setting, or its flipped twin (only blocks that can split at all)
                assert c.split_waves in (0, 4) and (c.split_waves == default.split_waves or c.block_n <= MM.SPLIT_MAX_BN)
                assert MM.MegaMoEConfig.from_name(c.name) == c  # the table's "megamoe:<name>" round-trips
    with pytest.raises(ValueError, match="moe-candidates"):
        tune.moe_candidates(16, 0)


def test_moe_candidates_split_twin_only_where_the_split_differs():
    from glm5_fastpath.moe import megamoe as MM

    one = [1] * 8 + [0] * 248  # M=1: 8 experts of one token, + the shared expert = 9 token blocks
    bn8 = MM.MegaMoEConfig(8, MM.max_stages(8))
    assert tune.fc1_split(bn8, one, 1) and not tune.fc1_split(MM.MegaMoEConfig(8, 6, split_waves=0), one, 1)
    assert not tune.fc1_split(MM.MegaMoEConfig(32, 6), one, 1)  # only block_n <= 16 splits
    assert [c.name for c in tune.moe_candidates(1, 4, counts=one)] == [
        "bn8_s6_g512_w4_lf", "bn8_s6_g512_w0_lf", "bn16_s6_g512_w4_lf", "bn32_s6_g512_w4_lf"]
    # M=16: ~100 token blocks x 16 FC1 tiles > 4 waves of 132 SMs: no split either way, no twin (the default does
    # not split from 2 tokens on)
    cands = tune.moe_candidates(16, 4)
    assert all(c.split_waves == 0 for c in cands) and cands[0].block_n == 16
    assert {c.block_n for c in cands} == {8, 16, 32, 64}
    # a larger bucket: only the block sizes that hold the expected routed load
    assert all(c.block_n >= 32 for c in tune.moe_candidates(256, 4))


def test_choose_moe_margin_quant_and_missing_stock():
    a, b = "bn16_s6_g512_w4", "bn32_s6_g512_w4"
    assert tune.choose_moe(_moe_row(16, 100.0, {a: 95.0, b: 90.0}))[0] == f"megamoe:{b}"
    # within 3 % of stock: keep SGLang's path
    v, why = tune.choose_moe(_moe_row(16, 92.0, {a: 95.0, b: 90.0}))
    assert v == "stock" and "no gain above 3%" in why
    assert tune.choose_moe(_moe_row(16, 92.0, {a: 95.0, b: 90.0}), margin=0.0)[0] == f"megamoe:{b}"
    # the stock quantises inside: our act quant is added before comparing
    row = _moe_row(16, 97.0, {a: 90.0}, quant=5.0, includes_quant=True)
    v, why = tune.choose_moe(row)
    assert v == "stock" and "95.00 us (incl. 5.00 us act quant)" in why
    assert tune.choose_moe(_moe_row(16, 97.0, {a: 90.0}, quant=5.0, includes_quant=False))[0] == f"megamoe:{a}"
    # no stock timing: stock unless --moe-without-stock
    v, why = tune.choose_moe(_moe_row(16, None, {a: 90.0}))
    assert v == "stock" and "--moe-without-stock" in why and "no SGLang" in why
    assert tune.choose_moe(_moe_row(16, None, {a: 90.0}), without_stock=True)[0] == f"megamoe:{a}"
    # excluded / failed candidates never win
    row = _moe_row(16, 100.0, {a: "disagrees with default", b: 80.0})
    assert tune.choose_moe(row)[0] == f"megamoe:{b}"
    v, why = tune.choose_moe(_moe_row(16, 100.0, {a: "disagrees with default"}))
    assert v == "stock" and "no MegaMoE candidate ran" in why and a in why


def test_table_with_moe_parses_and_round_trips_config_names(tmp_path):
    from glm5_fastpath.moe import megamoe as MM

    rep = {"device": "NVIDIA H200", "kv_len": 8192,
           "rows": [_row(1, 60.0, full=50.0), _row(16, 120.0, multistream=66.7, full=70.2), _row(256, 200.0, full=290.0)]}
    moe = _moe_rep([_moe_row(1, 200.0, {"bn8_s6_g512_w4": 110.0, "bn8_s6_g512_w0": 105.0}),
                    _moe_row(16, 1000.0, {"bn16_s6_g512_w4": 950.0, "bn32_s6_g512_w4": 940.0}),
                    _moe_row(256, 2400.0, {"bn64_s5_g512_w4": 3000.0})])
    doc = tune.table_from_report(rep, ["H200"], commit="abc123", moe=moe)
    assert [b["moe"] for b in doc["buckets"]] == ["megamoe:bn8_s6_g512_w0", "megamoe:bn32_s6_g512_w4", "stock"]
    assert doc["buckets"][1] == {"tokens": 16, "prefix": "cmp", "moe": "megamoe:bn32_s6_g512_w4",
                                 "cmp_mode": "multistream"}
    assert "sglang_triton_fused_moe" in doc["comment"] and "MoE stays stock" not in doc["comment"]
    assert "MoE megamoe:bn8_s6_g512_w0" in doc["comment"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    t = selection.load(p)
    for m in (1, 10):
        moe_value = t.lookup(m).choice.moe
        name = moe_value.split(":", 1)[1]
        assert f"megamoe:{MM.MegaMoEConfig.from_name(name).name}" == moe_value
    assert t.lookup(200).choice.moe == "stock"
    # a bucket the MoE part did not reach stays stock
    doc = tune.table_from_report(rep, ["H200"], moe=_moe_rep(moe["rows"][:1]))
    assert [b["moe"] for b in doc["buckets"]] == ["megamoe:bn8_s6_g512_w0", "stock", "stock"]
    assert "MoE not measured" in doc["comment"]


def test_moe_off_table_is_unchanged():
    rep = {"device": "NVIDIA H200", "kv_len": 8192, "rows": [_row(16, 120.0, full=70.2), _row(64, 145.0, full=109.0)]}
    doc = tune.table_from_report(rep, ["H200"], commit="abc123")
    assert doc == tune.table_from_report(rep, ["H200"], commit="abc123", moe=None)
    assert all(b["moe"] == "stock" for b in doc["buckets"])
    assert "MoE stays stock until MegaMoE lands." in doc["comment"] and "MoE stock:" not in doc["comment"]


def _fake_gpu_run(monkeypatch, tmp_path, argv, moe_rep=None):
    """cli tune with the prefix benchmark and the MoE measurement replaced by fakes (CPU)."""
    import torch

    import glm5_fastpath.attn_pre.cmp.bench as cmp_bench
    from glm5_fastpath.cli import main

    prefix_rep = {"device": "NVIDIA H200", "kv_len": 8192, "config": "glm5", "modes": ["full"],
                  "copy_bandwidth": {"bytes_per_s": 4.1e12},
                  "rows": [{**_row(1, 60.0, full=50.0), "floor_us": 17.5, "bytes": 73e6},
                           {**_row(16, 120.0, full=70.0), "floor_us": 22.5, "bytes": 94e6}]}
    calls = []

    def fake_bench_prefix(cfg, modes, buckets, kv_len, out_dir, **kw):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "cmp_prefix.json").write_text(json.dumps(prefix_rep))
        return prefix_rep

    def fake_tune_moe(buckets, out_dir, **kw):
        calls.append((list(buckets), kw))
        (out_dir / "moe_tune.json").write_text(json.dumps(moe_rep))
        return moe_rep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(cmp_bench, "bench_prefix", fake_bench_prefix)
    monkeypatch.setattr(tune, "tune_moe", fake_tune_moe)
    out = tmp_path / "table.json"
    assert main(["tune", "--out", str(out), "--buckets", "1,16", *argv]) == 0
    return json.loads(out.read_text()), sorted(p.name for p in (tmp_path / "table").iterdir()), calls, prefix_rep


def test_cli_moe_off_keeps_the_prefix_only_tune(monkeypatch, tmp_path):
    doc, files, calls, prefix_rep = _fake_gpu_run(monkeypatch, tmp_path, ["--moe", "off", "--rounds", "1"])
    assert calls == [] and files == ["cmp_prefix.json"]  # no MoE measurement, no MoE report
    expected = tune.table_from_report(prefix_rep, ["H200"], commit="unknown")
    assert doc == expected and all(b["moe"] == "stock" for b in doc["buckets"])


def test_cli_moe_auto_fills_the_moe_column(monkeypatch, tmp_path):
    moe = _moe_rep([_moe_row(1, 200.0, {"bn8_s6_g512_w4": 110.0}), _moe_row(16, None, {"bn16_s6_g512_w4": 900.0})],
                   kind=tune.STOCK_DEEPGEMM)
    doc, files, calls, _ = _fake_gpu_run(monkeypatch, tmp_path, ["--moe-candidates", "2", "--moe-margin", "0.05",
                                                                  "--rounds", "1"], moe)
    assert calls[0][0] == [1, 16] and calls[0][1]["n_candidates"] == 2 and calls[0][1]["margin"] == 0.05
    assert [b["moe"] for b in doc["buckets"]] == ["megamoe:bn8_s6_g512_w4", "stock"]  # M=16: no stock timing
    assert "moe_tune.json" in files and selection.parse(doc).lookup(1).choice.moe == "megamoe:bn8_s6_g512_w4"
    doc, *_ = _fake_gpu_run(monkeypatch, tmp_path, ["--moe-without-stock", "--rounds", "1"], moe)
    assert [b["moe"] for b in doc["buckets"]] == ["megamoe:bn8_s6_g512_w4", "megamoe:bn16_s6_g512_w4"]


def test_merge_rounds_takes_the_median_per_mode_and_bucket():
    r1 = {"device": "NVIDIA H200", "kv_len": 8192, "modes": ["full", "multistream"],
          "rows": [{**_row(1, 70.0, full=50.0, multistream=52.0), "floor_us": 17.5},
                   {**_row(16, 90.0, full=55.0, multistream=None), "floor_us": 22.5}]}
    r2 = {"rows": [{**_row(1, None, full=47.0, multistream=46.0), "floor_us": 17.5},
                   {**_row(16, None, full=51.0, multistream=53.0), "floor_us": 22.5}]}
    r3 = {"rows": [{**_row(1, None, full=48.0, multistream=45.0), "floor_us": 17.5}]}  # cut short before M = 16
    for r in (r2, r3):
        for row in r["rows"]:
            row.pop("stock")  # later rounds run without the stock graph
    rep = tune.merge_rounds([r1, r2, r3])
    assert rep["rounds"] == 3 and [r["M"] for r in rep["rows"]] == [1, 16] and rep["device"] == "NVIDIA H200"
    one, sixteen = rep["rows"]
    assert one["modes"]["full"] == {"median_us": 48.0, "rounds_us": [50.0, 47.0, 48.0],
                                    **{k: one["modes"]["full"][k] for k in ("time_over_floor", "speedup_vs_stock",
                                                                             "speedup_vs_serial")}}
    assert one["modes"]["multistream"]["median_us"] == 46.0 and one["stock"]["median_us"] == 70.0
    assert abs(one["modes"]["multistream"]["speedup_vs_stock"] - 70.0 / 46.0) < 1e-9
    assert sixteen["modes"]["full"]["median_us"] == 53.0 and sixteen["modes"]["multistream"]["rounds_us"] == [53.0]
    # round 1 alone would pick full at M = 1 (50 < 52); the median picks multistream (46 < 48)
    assert tune.choose_prefix(r1["rows"][0])[1] == "full" and tune.choose_prefix(one)[1] == "multistream"
    err = tune.merge_rounds([{"rows": [_row(8, None, full=None)]}])["rows"][0]
    assert "error" in err["modes"]["full"] and err["stock"] == {"skipped": "no deep_gemm"}
    with pytest.raises(ValueError, match="no rounds"):
        tune.merge_rounds([])


def test_cli_rounds_merge_the_prefix_rounds(monkeypatch, tmp_path):
    doc, files, calls, prefix_rep = _fake_gpu_run(monkeypatch, tmp_path, ["--moe", "off", "--rounds", "3"])
    assert files == ["cmp_prefix.json", "merged", "round2", "round3"]
    merged = json.loads((tmp_path / "table" / "merged" / "cmp_prefix.json").read_text())
    assert merged["rounds"] == 3 and merged["rows"][0]["modes"]["full"]["rounds_us"] == [50.0, 50.0, 50.0]
    assert [b["tokens"] for b in doc["buckets"]] == [1, 16]
    from glm5_fastpath.cli import build_parser

    assert build_parser().parse_args(["tune", "--out", "t.json"]).rounds == tune.ROUNDS


def test_cli_moe_options_parse():
    from glm5_fastpath.cli import build_parser

    a = build_parser().parse_args(["tune", "--out", "t.json"])
    assert (a.moe, a.moe_candidates, a.moe_margin, a.moe_without_stock) == ("auto", 4, 0.03, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--out", "t.json", "--moe", "sometimes"])


def test_tune_module_import_is_light():
    import subprocess
    import sys

    code = "import sys, glm5_fastpath.tune; print(sorted(m for m in ('torch', 'sglang', 'deep_gemm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_render_moe_markdown_with_fake_timings():
    rows = [_moe_row(1, 200.0, {"bn8_s6_g512_w4": 110.0, "bn8_s6_g512_w0": "disagrees with bn8_s6_g512_w4: rel_err 3e-1"}),
            _moe_row(64, 2300.0, {"bn64_s5_g512_w4": 2350.0, "bn32_s6_g512_w4": 2200.0}, quant=4.0, includes_quant=True),
            _moe_row(256, None, {"bn64_s5_g512_w4": 5000.0})]
    md = tune.render_moe_markdown(_moe_rep(rows))
    assert md.startswith("# MoE tune (NVIDIA H200, 2026-12-01, commit abc123)")
    assert "Stock: **sglang_triton_fused_moe**" in md
    lines = md.splitlines()
    row1 = next(x for x in lines if x.startswith("| 1 |"))
    assert "megamoe:bn8_s6_g512_w4" in row1 and "110.00" in row1 and "200.00" in row1 and "1.375" in row1  # /floor 80
    row64 = next(x for x in lines if x.startswith("| 64 |"))
    assert "bn32_s6_g512_w4" in row64 and "4.00" in row64 and "megamoe:bn32_s6_g512_w4" in row64
    row256 = next(x for x in lines if x.startswith("| 256 |"))
    assert "| stock |" in row256 and "--moe-without-stock" in row256
    assert any("bn8_s6_g512_w0" in x and "disagrees" in x for x in lines)  # the excluded candidate is reported
    assert "## Candidates" in md


class _Cfg:
    """Stands in for SGLang's MoeRunnerConfig (a dataclass: only its field names matter)."""
    __dataclass_fields__ = dict.fromkeys(("num_experts", "num_local_experts", "top_k", "num_fused_shared_experts",
                                          "inplace", "activation", "routed_scaling_factor"))

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_triton_call_adapts_to_the_sglang_signature():
    from typing import NamedTuple

    class TopK(NamedTuple):
        topk_weights: object
        topk_ids: object
        router_logits: object

    import torch

    h, w13, w2 = torch.zeros(2, 256), torch.zeros(9, 256, 256), torch.zeros(9, 256, 128)
    ids, wts = torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3)

    def new(hidden_states, w1, w2, topk_output, moe_runner_config, b1=None, b2=None, use_fp8_w8a8=False,
            w1_scale=None, w2_scale=None, block_shape=None):
        pass

    args, kw, after = tune.triton_call(new, _Cfg, TopK, h, w13, "s13", w2, "s2", ids, wts, 2.5)
    assert args[:3] == (h, w13, w2) and args[3].topk_ids is ids and args[3].topk_weights is wts and not after
    c = kw["moe_runner_config"]
    assert (c.inplace, c.routed_scaling_factor, c.num_experts, c.num_local_experts, c.top_k,
            c.num_fused_shared_experts, c.activation) == (False, 2.5, 9, 9, 3, 1, "silu")
    assert (kw["use_fp8_w8a8"], kw["w1_scale"], kw["w2_scale"], kw["block_shape"]) == (True, "s13", "s2", [128, 128])

    def old(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu", use_fp8_w8a8=False,
            w1_scale=None, w2_scale=None, block_shape=None, no_combine=False):
        pass

    args, kw, after = tune.triton_call(old, None, None, h, w13, "s13", w2, "s2", ids, wts, 2.5)
    assert args == (h, w13, w2, wts, ids) and kw["inplace"] is False and after  # rsf applied by the caller

    def not_fp8(hidden_states, w1, w2, topk_weights, topk_ids):
        pass

    with pytest.raises(TypeError, match="use_fp8_w8a8"):
        tune.triton_call(not_fp8, None, None, h, w13, "s13", w2, "s2", ids, wts, 2.5)


@pytest.mark.gpu
def test_gpu_tune_with_moe_smoke(tmp_path):
    """(H200) tune buckets 1 and 16 with --moe auto: the table parses, every MoE choice is a valid config,
    and the default MegaMoE config of each bucket ran and passed its check."""
    from glm5_fastpath.cli import main
    from glm5_fastpath.moe import megamoe as MM

    out = tmp_path / "table.json"
    assert main(["tune", "--out", str(out), "--buckets", "1,16", "--moe", "auto", "--replays", "5", "--rounds", "2",
                 "--modes", "full,full+pin:D1=0"]) == 0
    assert json.loads((tmp_path / "table" / "merged" / "cmp_prefix.json").read_text())["rounds"] == 2
    t = selection.load(out)
    assert [b.tokens for b in t.buckets] == [1, 16]
    for b in t.buckets:
        assert b.moe == "stock" or MM.MegaMoEConfig.from_name(b.moe.split(":", 1)[1]).name == b.moe.split(":", 1)[1]
    rep = json.loads((tmp_path / "table" / "moe_tune.json").read_text())
    assert rep["aborted"] is None and rep["zero_copy"] and [r["M"] for r in rep["rows"]] == [1, 16]
    for r in rep["rows"]:
        d = r["candidates"][r["default_config"]]
        assert d.get("median_us", 0) > 0 and d["check"] == "bitwise", d
        assert r["choice"] == tune.choose_moe(r)[0]
    assert (tmp_path / "table" / "moe_tune.md").read_text().startswith("# MoE tune")


def test_moe_candidates_take_the_wide_block_only_as_an_alternative_of_the_token_major_default():
    """bn128 (the wide mode) measured slower than bn64 below the token-major threshold and in its cp.async build: tune
    does not spend its budget on it there. From the threshold the default is bn64 + pool + token-major + end combine,
    with bn64 token-major (no pool), plain bn64 and the wide token-major pool build as the alternatives."""
    from glm5_fastpath.moe import megamoe as MM
    for m in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096):
        for experts in (32, 256):
            cands = tune.moe_candidates(m, 4, experts=experts)
            if MM.expected_max_load(m, experts, 8) >= MM.TOKEN_MAJOR_POOL_MIN_LOAD:
                assert [c.name for c in cands] == ["bn64_s5_g512_w0_lf_p_t_e", "bn64_s5_g512_w0_lf_t",
                                                   "bn64_s5_g512_w0_lf", "bn128_s6_g512_w0_lf_p_t_e"], (m, experts)
            else:
                assert all(c.block_n != MM.WIDE_BN and not c.pool for c in cands), (m, experts)
                # bn64 defaults near the threshold: the token-major twin is the first alternative
                tm = cands[0].block_n == 64 and MM.expected_max_load(m, experts, 8) >= tune.TOKEN_MAJOR_CANDIDATE_MIN_LOAD
                assert [c.token_major for c in cands] == [False, True] + [False] * (len(cands) - 2) if tm else \
                    not any(c.token_major for c in cands), (m, experts, [c.name for c in cands])
    assert [c.name for c in tune.moe_candidates(128, 4, experts=32)][:2] == ["bn64_s5_g512_w0_lf", "bn64_s5_g512_w0_lf_t"]


def test_tune_modes_option():
    """tune --modes: the candidate list in the given order (duplicates dropped), composites allowed, unknown names and
    an empty list refused; None keeps TUNE_MODES."""
    assert tune.tune_modes(None) == tune.TUNE_MODES
    assert tune.tune_modes("full, full+pin:D1=0,full") == ("full", "full+pin:D1=0")
    with pytest.raises(ValueError, match="unknown mode"):
        tune.tune_modes("full,warp_speed")
    with pytest.raises(ValueError, match="no mode given"):
        tune.tune_modes(" , ")
