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


def test_server_args_stand_in_answers_with_serverargs_defaults(monkeypatch):
    """Outside a server the Triton MoE's get_global_server_args() raises; the stand-in answers field defaults."""
    import dataclasses
    import sys
    import types

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str
        enable_deterministic_inference: bool = False
        chunked_prefill_size: int = 8192

    state = {}

    def get():
        if "a" not in state:
            raise ValueError("Global server args is not set yet!")
        return state["a"]

    mod = types.SimpleNamespace(ServerArgs=ServerArgs, get_global_server_args=get,
                                set_global_server_args_for_scheduler=lambda a: state.__setitem__("a", a))
    pkg = types.ModuleType("sglang.srt")
    pkg.server_args = mod
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.srt", pkg)
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", mod)
    MP._ensure_server_args()
    a = get()
    assert a.enable_deterministic_inference is False and a.chunked_prefill_size == 8192 and a.model_path is None
    MP._ensure_server_args()  # already set: left alone
    assert get() is a
