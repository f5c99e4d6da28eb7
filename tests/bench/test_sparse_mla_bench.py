"""bench sparse-mla on CPU: arguments, the floor, the float64 reference it judges both paths by, the report."""
import argparse

import pytest
import torch

from glm5_fastpath.bench import sparse_mla as B
from glm5_fastpath.cli import build_parser


def _args(*extra):
    return build_parser().parse_args(["bench", "sparse-mla", "--out", "/tmp/x", *extra])


def test_registered_with_defaults():
    a = _args()
    assert B.validate(a) == [1, 2, 4, 8, 16, 32, 64] and (a.topk, a.heads) == (2048, 64)


@pytest.mark.parametrize("argv, msg", [(["--tokens", "0,1"], "positive"), (["--tokens", "a"], "integers"),
                                       (["--topk", "4096"], "--topk"), (["--heads", "24"], "multiple of 16"),
                                       (["--kv-slots", "10"], "--kv-slots"), (["--tables", "0"], "--tables")])
def test_invalid_arguments(argv, msg, capsys):
    a = _args(*argv)
    with pytest.raises(ValueError, match=msg):
        B.validate(a)
    assert B.main(a) == 2 and msg in capsys.readouterr().out


def test_floor_bytes():
    assert B.floor_bytes(1, 2048, 64) == 2048 * 1152 + 64 * 1152 + 64 * 1024 + 2048 * 4


def test_reference_matches_a_loop_formulation():
    g = torch.Generator().manual_seed(0)
    t, h, k, s = 3, 16, 7, 50
    q = torch.randn(t, h, 576, generator=g).bfloat16()
    kv = torch.randn(s, 1, 576, generator=g).bfloat16()
    idx = torch.randint(0, s, (t, k), generator=g, dtype=torch.int32)
    idx[1, 3:] = -1
    idx[2, :] = -1  # no valid slot: zeros
    out = B.reference(q, kv, idx, 0.07)
    for ti in range(t):
        for hi in range(h):
            js = [int(j) for j in idx[ti] if j >= 0]
            if not js:
                assert out[ti, hi].abs().max() == 0
                continue
            rows = kv[js, 0].double()
            w = torch.softmax(rows @ q[ti, hi].double() * 0.07, 0)
            want = w @ rows[:, :512]  # the bench judges by the shared reference: fp32 math, bf16 output
            assert torch.allclose(out[ti, hi].double(), want, rtol=1e-2, atol=2e-3 * want.abs().max().item())


def test_markdown_report():
    res = {"gpu": "NVIDIA H200", "date": "2026-11-29", "commit": "abc", "stock": "flashmla", "kv_slots": 10,
           "rows": [{"T": 1, "K": 2048, "H": 64, "floor_us": 0.6, "ours_us": 8.0, "stock_us": 60.0,
                     "stock_over_ours": 7.5, "ours_over_floor": 13.3, "ours_rel_l2": 0.003, "stock_rel_l2": 0.003},
                    {"T": 2, "K": 2048, "H": 64, "stock_error": "RuntimeError: x"}]}
    md = B.markdown(res)
    assert "| 1 | 2048 | 64 | 0.60 | 8.00 | 60.00 | 7.50 | 13.30 | 0.0030 | 0.0030 |" in md
    assert "- T=2 stock_error: RuntimeError: x" in md


def test_needs_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert B.main(_args()) == 2 and "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [(["--splits", "0,4"], "1..64"), (["--splits", "x"], "integers"),
                                       (["--write-splits", "/tmp/s.json"], "needs --splits")])
def test_invalid_split_arguments(argv, msg):
    with pytest.raises(ValueError, match=msg):
        B.validate(_args(*argv))


def test_best_splits_and_the_table_it_writes(tmp_path):
    """The fastest split wins (the heuristic's own count on ties); the written JSON is what the op's table
    parser reads, so `--write-splits` output can be handed to GLM5_FASTPATH_SPARSE_MLA_SPLITS as is."""
    from glm5_fastpath.ops import sparse_mla as SM

    r1 = {"T": 1, "ours_us": 17.7, "ours_split_us": {"16": 12.0, "32": 14.0, "64": 18.0}}
    r8 = {"T": 8, "ours_us": 29.4, "ours_split_us": {"8": 29.4, "16": 30.0}}
    assert B.best_splits(r1, 64) == (16, 12.0)
    assert B.best_splits(r8, 8) == (8, 29.4)  # a tie with the heuristic keeps the heuristic
    assert B.best_splits({"T": 2}, 32) is None
    for r, auto in ((r1, 64), (r8, 8)):
        r["best_splits"], r["best_us"] = B.best_splits(r, auto)
        r["auto_splits"] = auto
    res = {"gpu": "NVIDIA H200", "date": "d", "commit": "c", "rows": [r1, r8]}
    p = tmp_path / "splits.json"
    p.write_text(__import__("json").dumps(B.split_table_json(res)))
    assert SM.parse_split_table(str(p)) == {1: 16, 8: 8}
    md = B.markdown({**res, "stock": "x", "kv_slots": 1, "rows": [{**r1, "K": 2048, "H": 64},
                                                                 {**r8, "K": 2048, "H": 64}]})
    assert "| 1 | 17.70 [64] | - | 12.00 | 14.00 | 18.00 | 16 | 12.00 |" in md  # columns 8, 16, 32, 64


def test_stages_option_and_report():
    assert B.parse_stages("") == [] and B.parse_stages("2,5") == [5]  # the default build is always timed
    for bad in ("3", "x"):
        with pytest.raises(ValueError, match="--stages"):
            B.validate(_args("--stages", bad))
    res = {"gpu": "g", "date": "d", "commit": "c", "stock": "x", "kv_slots": 1,
           "rows": [{"T": 8, "K": 2048, "H": 64, "ours_us": 29.4, "ours_stages_us": {"5": 14.2}}]}
    assert "| 8 | 29.40 [-] | 14.20 [-] |" in B.markdown(res)


def test_kernels_argument_and_report():
    a = _args("--kernels", "mma,wgmma", "--split-kernel", "wgmma", "--splits", "8,16")
    B.validate(a)
    assert B.parse_kernels("wgmma, mma,wgmma") == ["wgmma", "mma"]
    with pytest.raises(ValueError, match="kernels must be in"):
        B.validate(_args("--kernels", "tma"))
    res = {"gpu": "NVIDIA H200", "date": "2026-12-01", "commit": "abc", "stock": "flashmla", "kv_slots": 10,
           "rows": [{"T": 8, "K": 2048, "H": 64, "ours_us": 30.0, "stock_us": 60.0, "split_kernel": "wgmma",
                     "ours_kernel_us": {"mma": 30.0, "wgmma": 10.0}, "ours_kernel_rel_l2": {"mma": 0.002, "wgmma": 0.002},
                     "ours_split_us": {"8": 12.0, "16": 11.0}}]}
    md = B.markdown(res)
    assert "| 8 | 30.00 | 30.00 [0.0020] | 10.00 [0.0020] | 60.00 | 6.00 |" in md
    # a sweep of another tile than the default does not compete with the default tile's 'ours us'
    assert B.best_splits(res["rows"][0], 16) == (16, 11.0)
