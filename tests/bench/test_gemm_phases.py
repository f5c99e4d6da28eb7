"""bench gemm-phases: the per-CTA phase summary (CPU, synthetic marks) and, on an H200, one real launch."""
import pytest

from glm5_fastpath.bench import gemm_phases as GP


def _row(entry, wait, first, kdone, fin, epi, sm):
    return [entry, wait, first, kdone, fin, epi, 0, sm]


def test_summarize_per_cta_phases():
    base = 1_000_000
    rows = [_row(base, base + 500, base + 1500, base + 5500, base + 6000, base + 7000, 3),  # finishes its tile
            _row(base + 800, base + 1000, base + 2200, base + 6200, base + 6300, 0, 4),    # another CTA finishes
            [0] * 8]                                                                          # never launched
    s = GP.summarize(rows)
    assert (s["ctas"], s["sms"]) == (2, 2)
    assert s["launch_spread_us"] == pytest.approx(0.8) and s["span_us"] == pytest.approx(7.0)
    assert s["first_byte_med_us"] == pytest.approx((1.0 + 1.2) / 2) and s["first_byte_max_us"] == pytest.approx(1.2)
    assert s["stream_max_us"] == pytest.approx(4.0) and s["finish_med_us"] == pytest.approx(0.3)
    assert s["epilogue_med_us"] == pytest.approx(1.0) and s["epilogue_max_us"] == pytest.approx(1.0)
    assert s["last_k_loop_done_us"] == pytest.approx(6.2)
    m = GP.median_summary([s, {**s, "span_us": 9.0, "epilogue_med_us": None}])
    assert m["span_us"] == pytest.approx(8.0) and m["epilogue_med_us"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no CTA"):
        GP.summarize([[0] * 8])


def test_markdown_and_cli_without_gpu(capsys, tmp_path):
    import torch

    s = GP.summarize([_row(10, 20, 1020, 3020, 3020, 4020, 0)])
    rep = {"device": "NVIDIA H200", "date": "2026-11-30", "commit": "abc", "rows": [
        {"name": "qkv_a", "layout": "kb", "N": 2624, "K": 6144, "M": 16, "mb": 16.2, "event_us": 9.4, "phase_build_equal": True, **s}]}
    md = GP.render_markdown(rep)
    assert "| qkv_a | kb | 16 | 16.2 | 1 | 9.40 |" in md and md.rstrip().endswith("| yes |")
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU error path")
    from glm5_fastpath.cli import main

    assert main(["bench", "gemm-phases", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_phase_build_on_the_h200():
    """The phase build gives the normal build's bits, and every CTA's marks are in order."""
    import torch

    from glm5_fastpath.ops import fp8_gemm as F

    r = GP.run_case("qkv_a", 2624, 6144, 16, launches=2)
    print(r)
    assert r["phase_build_equal"] and r["ctas"] == F.config_for(16, 2624, 6144).ctas
    for k in ("first_byte_med_us", "stream_med_us", "finish_med_us", "epilogue_med_us"):
        assert r[k] is not None and r[k] >= 0, k
    assert 0 < r["span_us"] < 1000 and r["event_us"] > 0
    cfg = F.config_for(16, 2624, 6144)
    ph = F.read_phases(cfg)
    rows = [x for x in ph.cpu().tolist() if x[0] > 0]
    for x in rows:
        assert x[0] <= x[1] <= x[2] <= x[3] <= x[4], x
    assert torch.cuda.is_available()
