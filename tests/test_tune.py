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


def test_table_from_report_is_a_valid_selection_table(tmp_path):
    rep = {"device": "NVIDIA H200", "kv_len": 8192,
           "rows": [_row(64, 145.0, serial=130.0, multistream=110.0, full=109.0),
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
