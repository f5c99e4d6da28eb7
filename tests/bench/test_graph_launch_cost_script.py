"""benchmarks/graph_launch_cost.py on CPU: argument checks, the report, and a clear exit without a GPU; the GPU run
itself is marked gpu."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("graph_launch_cost", ROOT / "benchmarks" / "graph_launch_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_nodes(probe):
    assert probe.parse_nodes("200,25, 50,25") == [25, 50, 200]
    for bad in ("", "0", "x", "5000", "-3"):
        with pytest.raises(SystemExit, match="--nodes"):
            probe.parse_nodes(bad)


def test_bad_kinds_and_replays(probe):
    with pytest.raises(SystemExit, match="--kinds"):
        probe.main(["--kinds", "torch,warp"])
    with pytest.raises(SystemExit, match="--replays"):
        probe.main(["--replays", "3"])


def test_render_per_node_column(probe):
    res = {"gpu": "G", "date": "D", "commit": "c", "rows": [
        {"kind": "pdl", "nodes": 200, "host_us_p50": 50.0, "host_us_p10": 40.0, "host_us_p90": 60.0,
         "gpu_us_per_replay": 400.0}]}
    md = probe.render(res)
    assert "| pdl | 200 | 50.0 | 40.0 | 60.0 | 0.25 | 400.0 |" in md
    assert md.startswith("# CUDA-graph launch host cost (G, D, commit c)")


def test_no_gpu_exits_2(probe, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert probe.main(["--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_gpu_probe_runs(probe, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert probe.main(["--nodes", "4,16", "--replays", "20", "--out", str(tmp_path)]) == 0
    import json
    rows = json.loads((tmp_path / "graph_launch_cost.json").read_text())["rows"]
    assert {(r["kind"], r["nodes"]) for r in rows} == {(k, n) for k in probe.KINDS for n in (4, 16)}
    assert all(r["host_us_p50"] > 0 and r["gpu_us_per_replay"] > 0 for r in rows)
