"""bench gemm-layout: argument parsing and the report (CPU); on an H200, one real case."""
import pytest

from glm5_fastpath.bench import gemm_layout as GL


def test_parse_list_and_markdown():
    assert GL.parse_list("qkv_a,q_b", tuple(s[0] for s in GL.SHAPES), "shape(s)") == ["qkv_a", "q_b"]
    with pytest.raises(ValueError, match="unknown variant"):
        GL.parse_list("full,bogus", GL.VARIANTS, "variant(s)")
    with pytest.raises(ValueError, match="unknown shape"):
        GL.parse_list("", ("qkv_a",), "shape(s)")
    rep = {"device": "NVIDIA H200", "date": "2026-11-30", "commit": "abc", "copy_tbs": 4.0, "rows": [
        {"name": "q_b", "M": 16, "mb": 34.1, "floor_us": 8.5, "bitwise": True,
         "config": {"tm": 16, "splits": 1, "stages": 8, "reduce": "global"},
         "row_full_us": 12.0, "kb_full_us": 10.0, "row_loads_tbs": 3.1, "kb_loads_tbs": 3.6}]}
    md = GL.render_markdown(rep)
    assert "| q_b | 16 | 34.1 | tm16 s1 st8 global | 12.00 | 10.00 | 1.200 | 1.41 | 1.18 | 3.10 | 3.60 | yes |" in md
    assert GL.ratio(None, 2.0) is None and GL.ratio(3.0, 2.0) == 1.5


def test_cli_without_gpu(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU error path")
    from glm5_fastpath.cli import main

    assert main(["bench", "gemm-layout", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_one_case_on_the_h200():
    """q_b at 16 tokens: both layouts timed, the k-block-major output bitwise equal to the row-major one."""
    from glm5_fastpath.bench.timing import measure_copy_bandwidth

    bw = measure_copy_bandwidth("cuda", nbytes=1 << 28, reps=3)["bytes_per_s"]
    r = GL.run_case("q_b", 16384, 2048, 16, ["full", "loads"], 10, bw)
    print(r)
    assert r["bitwise"] is True
    for k in ("row_full_us", "kb_full_us", "row_loads_us", "kb_loads_us"):
        assert 0 < r[k] < 1000, k
    assert r["floor_us"] > 0 and r["rotation"]["covers_l2"]
