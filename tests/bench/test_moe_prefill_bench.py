"""bench moe-prefill on CPU: arguments, the report table, and (with an sm_90 GPU) one small run."""
import argparse

import pytest
import torch

from glm5_fastpath.bench import moe_prefill as MP


def test_parse_tokens():
    assert MP.parse_tokens("128, 4096") == [128, 4096]
    with pytest.raises(SystemExit):
        MP.parse_tokens("0")


def test_markdown_rows_with_and_without_a_column():
    res = {"gpu": "H200", "date_utc": "2026-12-02", "commit": "abc", "stock": "sglang fused_experts",
           "copy_bandwidth": {"bytes_per_s": 4.0e12},
           "rows": [{"M": 128, "experts_touched": 252, "floor_us": 2378.0, "config": "bn32",
                     "stock": {"median_us": 4000.0, "x_floor": 1.68}, "ours": {"median_us": 2500.0, "x_floor": 1.05},
                     "speedup": 1.6, "rel_err_ours_vs_stock": 0.004},
                    {"M": 8192, "experts_touched": 257, "floor_us": 2425.0,
                     "stock": {"median_us": 9000.0, "x_floor": 3.71}, "ours": {"error": "M above MegaMoE's MAX_TOKENS"}}]}
    md = MP.markdown(res)
    assert "| 128 | 252 | 2378 | 4000 | 1.68 | 2500 | 1.05 | 1.60x | bn32 | 4.00e-03 |" in md
    assert "| 8192 | 257 | 2425 | 9000 | 3.71 | M above MegaMoE's MAX_TOKENS | - | - | - | - |" in md


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90 GPU (run scripts/gpu_check.sh on an H200)")
def test_small_run_agrees_with_stock_when_sglang_imports(tmp_path):
    a = argparse.Namespace(out=str(tmp_path), tokens="200", launches=2, replays=2, seed=0)
    res = MP.run(a)
    (row,) = res["rows"]
    assert "median_us" in row["ours"], row
    if "median_us" in row.get("stock", {}):  # FP8 noise between two FP8 pipelines of the same math
        assert row["rel_err_ours_vs_stock"] < 3e-2
