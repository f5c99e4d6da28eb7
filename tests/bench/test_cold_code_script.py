"""benchmarks/cold_code.py on CPU: argument checks, the report, and a clear exit without a GPU; the GPU run itself is
marked gpu."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("cold_code", ROOT / "benchmarks" / "cold_code.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_ops(probe):
    assert probe.parse_ops("router,a0,router") == ["router", "a0"]
    for bad in ("", "router,warp", "x"):
        with pytest.raises(SystemExit, match="--ops"):
            probe.parse_ops(bad)


def test_bad_numbers(probe):
    for args in (["--launches", "0"], ["--rounds", "0"], ["--flush-mb", "16"]):
        with pytest.raises(SystemExit, match="at least"):
            probe.main(args)


def test_render(probe):
    res = {"gpu": "G", "date": "D", "commit": "c", "launches": 20, "rounds": 5, "flush_mb": 512,
           "rows": [{"op": "router", "hot_us": 7.0, "cold_us": 10.5, "cold_minus_hot_us": 3.5, "flush_us": 130.0}]}
    md = probe.render(res)
    assert md.startswith("# Cold L2 / code cost of short ops (G, D, commit c)")
    assert "| router | 7.00 | 10.50 | 3.50 | 130.0 |" in md and "20 launches per graph" in md


def test_no_gpu_exits_2(probe, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert probe.main(["--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_gpu_probe_runs(probe, tmp_path):
    assert probe.main(["--ops", "router,a0", "--launches", "4", "--rounds", "2", "--flush-mb", "128",
                       "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "cold_code.json").read_text())["rows"]
    assert [r["op"] for r in rows] == ["router", "a0"]
    assert all(r["hot_us"] > 0 and r["flush_us"] > 0 for r in rows)
