"""benchmarks/dsa_metadata_host.py on CPU: its copy of SGLang's sequence equals the op's reference, argument checks,
the report, a clear exit without a GPU; the GPU run is marked gpu."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from glm5_fastpath.ops import dsa_metadata as DM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("dsa_metadata_host", ROOT / "benchmarks" / "dsa_metadata_host.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sglang_sequence_equals_the_op(bench):
    g = torch.Generator().manual_seed(3)
    r2t = torch.randint(0, 1000, (6, 300), generator=g, dtype=torch.int32)
    idx, lens = torch.tensor([4, 1, 2]), torch.tensor([300, 17, 130])
    a, b = bench.buffers(torch, 3, 300, 64, "cpu"), bench.buffers(torch, 3, 300, 64, "cpu")
    ml = bench.sglang_sequence(torch, r2t, idx, lens, lens, 2048, 64, a)
    DM.FastLauncher(r2t, idx, lens, 2048, 64, **b)(ml)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_args_and_render(bench):
    assert bench.int_list("1, 8", "batches") == [1, 8]
    for bad in ("", "0", "x"):
        with pytest.raises(SystemExit, match="--batches"):
            bench.int_list(bad, "batches")
    with pytest.raises(SystemExit, match="--replays"):
        bench.main(["--replays", "2"])
    md = bench.render({"gpu": "G", "date": "D", "commit": "c", "rows": [
        {"bs": 1, "ctx": 400, "page_size": 64, "sglang_host_us": 90.0, "ours_host_us": 20.0, "sglang_gpu_us": 30.0,
         "ours_gpu_us": 3.0, "bitwise": True}]})
    assert "| 1 | 400 | 64 | 90.0 | 20.0 | 70.0 | 30.0 | 3.0 | True |" in md


def test_no_gpu_exits_2(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2


@pytest.mark.gpu
def test_gpu_run(bench, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert bench.main(["--batches", "1,4", "--contexts", "130", "--replays", "20", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "dsa_metadata_host.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["bitwise"] for r in rows)
