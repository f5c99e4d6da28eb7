"""bench/moe_masked on CPU: the masked layout, dispatch, combine and the FC1 -> act -> FC2 pipeline with the
reference grouped GEMM, against a per-pair computation; bench moe's report and plot with the masked column."""
import json

import pytest
import torch

from glm5_fastpath.bench import moe as BM
from glm5_fastpath.bench import moe_masked as MK
from glm5_fastpath.ref.fp8 import quant_act_per_token, quant_weight_block

H, I, E, K = 256, 128, 5, 3


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    w13, s13, w2, s2 = [], [], [], []
    for _ in range(E):
        a, b = quant_weight_block(torch.randn(2 * I, H, generator=g) * 0.05)
        c, d = quant_weight_block(torch.randn(H, I, generator=g) * 0.05)
        w13.append(a), s13.append(b), w2.append(c), s2.append(d)
    return torch.stack(w13), torch.stack(s13), torch.stack(w2), torch.stack(s2)


def inputs(m=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    x8, xs = quant_act_per_token(torch.randn(m, H, generator=g).to(torch.bfloat16))
    ids = torch.tensor([[0, 1, 2], [1, 0, 3], [3, 1, -1], [1, 2, 0], [0, 1, 3], [1, -1, -1], [2, 1, 0]],
                       dtype=torch.int32)[:m]  # expert 4: no token; expert 1: every token
    w = torch.rand(m, K, generator=g) + 0.1
    return x8, xs, ids, (w / w.sum(-1, keepdim=True)).float()


def per_pair(x8, xs, ids, wts, wt):
    """The reference expert FFN (ref.moe.expert_ffn) per (token, slot), weighted and summed in fp32."""
    from glm5_fastpath.ref.moe import expert_ffn
    from glm5_fastpath.weights import Fp8Linear

    w13, s13, w2, s2 = wt
    out = torch.zeros(ids.shape[0], H, dtype=torch.float32)
    for t in range(ids.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            if e >= 0:
                y = expert_ffn(x8[t:t + 1], xs[t:t + 1], Fp8Linear(w13[e], s13[e]), Fp8Linear(w2[e], s2[e]))
                out[t] += y[0].float() * wts[t, j]
    return out.to(torch.bfloat16)


def test_layout_counts_order_and_rows():
    _, _, ids, _ = inputs()
    lay = MK.masked_layout(ids, E, align=4)
    assert lay.masked_m.tolist() == [5, 7, 3, 3, 0]
    assert lay.max_m == 8 and lay.expected_m == -(-18 // 4)
    assert lay.pair_expert.tolist() == sorted(lay.pair_expert.tolist())  # expert-major
    for e in range(E):
        sel = lay.pair_expert == e
        assert lay.pair_token[sel].tolist() == sorted(lay.pair_token[sel].tolist())  # then token order
        assert lay.pair_row[sel].tolist() == list(range(int(sel.sum())))
    assert bool((ids[lay.pair_token, lay.pair_slot] == lay.pair_expert.to(torch.int32)).all())
    assert MK.masked_layout(ids, E).max_m == MK.ROW_ALIGN
    with pytest.raises(ValueError, match=">= 5 experts"):
        MK.masked_layout(torch.tensor([[5]]), E)
    empty = MK.masked_layout(torch.full((2, 3), -1, dtype=torch.int32), E)
    assert empty.masked_m.tolist() == [0] * E and empty.pair_token.numel() == 0


def test_dispatch_fills_rows_and_zero_pads():
    x8, xs, ids, _ = inputs()
    lay = MK.masked_layout(ids, E, align=4)
    a8, a_sf = MK.dispatch(x8, xs, lay)
    assert a8.shape == (E, 8, H) and a_sf.shape == (E, 8, H // 128)
    for p in range(lay.pair_token.numel()):
        e, r, t = int(lay.pair_expert[p]), int(lay.pair_row[p]), int(lay.pair_token[p])
        assert torch.equal(a8[e, r].view(torch.uint8), x8[t].view(torch.uint8)) and torch.equal(a_sf[e, r], xs[t])
    assert bool((a8[4].float() == 0).all()) and bool((a_sf[4] == 1).all())  # padding: zeros, scale 1


def test_pipeline_with_reference_gemm_matches_per_pair_math():
    wt = weights()
    x8, xs, ids, wts = inputs()
    pipe = MK.MaskedPipeline(wt, MK.reference_masked_gemm)
    lay = pipe.prepare(x8, xs, ids)
    y = pipe()
    assert y.shape == (E, lay.max_m, H)
    got = pipe.output(wts, ids.shape[0]).float()
    want = per_pair(x8, xs, ids, wts, wt).float()
    err = (got - want).norm() / want.norm()
    assert err < 2e-2, err  # bf16 rounding of the weighted slot sums (combine sums fp32 of bf16 values)
    assert torch.isfinite(got).all()
    seen = []
    pipe2 = MK.MaskedPipeline(wt, MK.reference_masked_gemm, input_sf=lambda sf: seen.append(sf.shape) or sf.clone())
    pipe2.prepare(x8, xs, ids)
    pipe2()
    assert seen == [(E, lay.max_m, H // 128)]  # FC1's scales transformed once, in prepare
    assert torch.equal(pipe2.output(wts, ids.shape[0]), pipe.output(wts, ids.shape[0]))


def _result():
    rows = [{"tokens": 1, "experts_touched": 8, "floor_us": 70.7, "floor_shared_us": 79.5,
             "ours": {"median_us": 88.8}, "ours_shared": {"median_us": 96.4}, "deepgemm": {"median_us": 144.8},
             "deepgemm_masked": {"median_us": 120.0, "act": "sglang silu_and_mul_masked_post_quant_fwd"},
             "ours_vs_floor": 1.256, "ours_shared_vs_floor": 1.21, "deepgemm_vs_floor": 2.05,
             "speedup_vs_deepgemm": 1.63, "deepgemm_masked_vs_floor": 1.70, "speedup_vs_deepgemm_masked": 1.35},
            {"tokens": 16, "experts_touched": 105, "floor_us": 928.2, "floor_shared_us": 966.0,
             "ours": {"median_us": 919.3}, "deepgemm_masked": {"error": "RuntimeError: x"}}]
    return {"gpu": "NVIDIA H200", "date": "2026-11-29", "commit": "abc", "copy_bandwidth_tb_s": 4.1,
            "settings": {"b": rows}}


def test_report_has_the_masked_column():
    md = BM.markdown(_result())
    assert "| dg masked us | masked/floor | speedup vs masked |" in md
    assert "| 120.0 | 1.700 | 1.35x |" in md and "RuntimeError: x" in md
    assert "activation by sglang silu_and_mul_masked_post_quant_fwd" in md


def test_plot(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert BM.write_plot(_result(), tmp_path / "none.png") is False  # optional: no plot, no error
    monkeypatch.undo()
    pytest.importorskip("matplotlib")
    p = tmp_path / "m.png"
    assert BM.write_plot(json.loads(json.dumps(_result())), p) and p.stat().st_size > 1000


def test_report_has_the_trace_section():
    res = _result()
    res["settings"]["b"][0]["ours_shared_trace"] = {
        "tasks": 3, "ctas": 2, "span_us": 8.1, "math_busy_share": 0.74, "tail_us": 3.95,
        "fc1": {"tasks": 2, "wait_us": 1.5, "mma_us": 6.0, "epi_us": 1.0, "spin_us": 0.0, "spun_tasks": 0},
        "fc2": {"tasks": 1, "wait_us": 1.0, "mma_us": 2.0, "epi_us": 0.5, "spin_us": 1.0, "spun_tasks": 1}}
    res["settings"]["b"][1]["ours_shared_trace"] = {"error": "RuntimeError: no trace"}
    md = BM.markdown(res)
    assert "## Where the time goes" in md
    assert "- (b) 1 tokens: span 8.1 us, math busy 74 %" in md and "fc1_done spin 1.0 us over 1 tasks" in md
    assert "- (b) 16 tokens: RuntimeError: no trace" in md
    assert "Where the time goes" not in BM.markdown(_result())


def test_report_has_the_lean_fences_section():
    res = _result()
    r = res["settings"]["b"][0]
    r["ours_shared_lean"] = {"median_us": 90.0}
    r["ours_shared_fenced"] = {"median_us": 93.6}
    md = BM.markdown(res)
    assert "## Fence builds" in md
    line = [ln for ln in md.splitlines() if ln.startswith("| b | " + str(r["tokens"]) + " |")][0]
    assert "| 93.6 | 90.0 | 1.040 |" in line
    assert "Fence builds" not in BM.markdown(_result())
