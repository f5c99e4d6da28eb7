"""bench/trace_rows.py on hand-made MegaMoE trace rows (SM clock 2 GHz: cycles = 2 x ns): phase quantiles per task
kind, the claim lead and idle gaps from the global timer, the last-finishing CTAs, and the CLI on a saved file."""
import pytest
import torch

from glm5_fastpath.bench import trace_rows as TR
from glm5_fastpath.moe import megamoe as M
from glm5_fastpath.testing.megamoe_trace import put_trace_row


def _rows():
    r = torch.zeros(2, 3, M.TRACE_COLS, dtype=torch.int64)
    fc1, fc2 = M.encode_task(0, 1, 0, 0), M.encode_task(1, 1, 0, 0)

    put_trace_row(r, 0, 0, 1000, 1100, 2100, 5100, 5600, fc1)  # ns; clocks at 2 cycles / ns
    put_trace_row(r, 0, 1, 1200, 5600, 6600, 8600, 9100, fc2, spin=(5000, 6000))
    put_trace_row(r, 1, 0, 1050, 1150, 1650, 4650, 5150, fc1)
    put_trace_row(r, 1, 1, 1300, 5650, 6150, 7150, 12650, fc2)  # idle 0.5 us before it, a 5.5 us epilogue: the tail
    return r


def test_details_quantiles_gaps_and_tail():
    d = TR.details(_rows(), tail_ctas=2)
    assert d["tasks"] == 4 and d["sm_ghz"] == pytest.approx(2.0)
    fc1 = d["kinds"]["fc1"]
    assert fc1["first_stage"]["n"] == 2 and fc1["first_stage"]["max"] == pytest.approx(1.0)
    assert fc1["mma"]["p50"] == pytest.approx(3.0) and fc1["claim_lead"]["max"] == pytest.approx(0.1)
    fc2 = d["kinds"]["fc2"]
    assert fc2["idle_before"]["max"] == pytest.approx(0.5) and fc2["epilogue"]["max"] == pytest.approx(5.5)
    assert fc2["spin"]["n"] == 1 and fc2["spin"]["max"] == pytest.approx(1.0)
    assert [t["cta"] for t in d["tail"]] == [1, 0] and d["tail"][0]["kind"] == "fc2"
    assert d["tail"][0]["end_us"] == pytest.approx((12650 - 1000) / 1e3) and d["tail"][0]["epilogue"] == pytest.approx(5.5)
    md = TR.markdown("x", d)
    assert "| fc2 | epilogue | 2 |" in md and "CTA 1: ends at 11.7 us, fc2" in md
    assert TR.details(torch.zeros(1, 2, M.TRACE_COLS, dtype=torch.int64)) == {"tasks": 0}


def test_cli_reads_a_saved_file(tmp_path, capsys):
    p = tmp_path / "b_M1.pt"
    torch.save({"rows": _rows(), "columns": M.TRACE_COLUMNS, "config": "bn8_s6_g512_w4", "setting": "b",
                "tokens": 1}, p)
    assert TR.main([str(p)]) == 0
    out = capsys.readouterr().out
    assert "b_M1.pt (bn8_s6_g512_w4, 1 tokens)" in out and "| fc1 | mma |" in out
