"""`glm5-fastpath bench moe --ep N` (glm5_fastpath/moe/ep/bench.py): the harness on 2 gloo CPU ranks (small dims,
reference grouped GEMM), the CLI wiring, and the refusal without enough GPUs."""
from __future__ import annotations

import json

import pytest
import torch

from glm5_fastpath.cli import main
from glm5_fastpath.moe.ep import bench as B
from glm5_fastpath.moe.ep.layout import EPPartition


def test_bench_ep_cpu_smoke(tmp_path):
    rc = main(["bench", "moe", "--ep", "2", "--ep-device", "cpu", "--tokens", "1,5", "--ep-iters", "2",
               "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "megamoe_ep_bench.json").read_text())
    assert res["ep"] == 2 and [r["tokens_per_rank"] for r in res["rows"]] == [1, 5]
    for r in res["rows"]:
        st = r["staged"]
        assert st["median_us"] > 0 and st["window_mean_us"] > 0
        assert st["rel_err_vs_reference_max_rank"] < 2e-2  # staged vs the EP reference (fp8_same_quant class)
        assert "needs CUDA" in r["deepgemm"]["error"] and "needs CUDA" in r["ours"]["error"]
        assert r["floor_us"] > 0 and r["experts_touched_rank"] >= 1
    assert "| 5 |" in (tmp_path / "megamoe_ep_bench.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine --ep 2 would run the real benchmark")
def test_bench_ep_needs_gpus(tmp_path, capsys):
    assert main(["bench", "moe", "--ep", "2", "--out", str(tmp_path)]) == 2
    assert "needs 2 CUDA GPUs" in capsys.readouterr().err


def test_bench_ep_rejects_unknown_impl(tmp_path):
    assert main(["bench", "moe", "--ep", "2", "--ep-device", "cpu", "--ep-impls", "staged,nccl",
                 "--out", str(tmp_path)]) == 2


def test_local_weights_are_slices_of_the_global_stack():
    part = EPPartition(16, 4, 1)
    dev = torch.device("cpu")
    w1 = B.local_weights(part, 1, 256, 128, dev)
    assert w1.w13.shape == (5, 256, 256) and w1.w2.shape == (5, 256, 128)
    e5 = B.expert_weights(5, 256, 128, dev)  # global expert 5 = rank 1's local expert 1
    assert torch.equal(w1.w13[1].view(torch.uint8), e5[0].view(torch.uint8))
    sh = B.expert_weights(16, 256, 128, dev)  # the shared expert, replicated as every rank's last
    assert torch.equal(B.local_weights(part, 3, 256, 128, dev).w2[-1].view(torch.uint8), sh[2].view(torch.uint8))
