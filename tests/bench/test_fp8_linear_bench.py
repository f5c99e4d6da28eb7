"""bench fp8-linear on CPU: arguments, shapes from the config, weights, the float64 reference, the stock dispatch
(both SGLang signatures), rotation, the floor, the report, --help through the CLI."""
import functools
import json
import subprocess
import sys
import types

import pytest
import torch

from glm5_fastpath.bench import fp8_linear as B
from glm5_fastpath.cli import build_parser
from glm5_fastpath.config import Glm5Config, small_config


def _args(*extra):
    return build_parser().parse_args(["bench", "fp8-linear", "--out", "/tmp/x", *extra])


def test_registered_with_defaults():
    a = _args()
    ms, shapes = B.validate(a)
    assert ms == [1, 2, 4, 8, 16, 32, 64] and (a.replays, a.seed) == (30, 0)
    # GLM-5: hidden 6144, 64 heads x v_head_dim 256, dense intermediate 12288
    assert shapes == [("o_proj", 6144, 16384), ("dense_gate_up", 24576, 6144), ("dense_down", 6144, 12288)]
    assert B.config_label(a) == "preset glm5"


@pytest.mark.parametrize("argv, msg", [
    (["--ms", "0,1"], "1..256"), (["--ms", "300"], "1..256"), (["--ms", "a"], "integers"), (["--ms", ","], "empty"),
    (["--shapes", "o_proj,q_b"], "unknown --shapes q_b"), (["--shapes", ","], "--shapes is empty"),
    (["--replays", "0"], "--replays"), (["--max-copies", "0"], "--max-copies"),
    (["--preset", "glm5", "--config", "/tmp/c.json"], "not both"),
    (["--config", "/nonexistent/dir/config.json"], "no such config file")])
def test_invalid_arguments(argv, msg, capsys):
    a = _args(*argv)
    with pytest.raises(ValueError, match=msg):
        B.validate(a)
    assert B.main(a) == 2 and msg in capsys.readouterr().out


def test_shapes_subset_keeps_a_fixed_order():
    _, shapes = B.validate(_args("--shapes", "dense_down,o_proj,dense_down"))
    assert [s[0] for s in shapes] == ["o_proj", "dense_down"]


def test_shapes_from_a_config_file(tmp_path):
    cfg = small_config(hidden_size=1024, intermediate_size=640, num_attention_heads=8, num_key_value_heads=8,
                       v_head_dim=32)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg.to_hf_dict()))
    a = _args("--config", str(p), "--ms", "3,1")
    ms, shapes = B.validate(a)
    assert ms == [1, 3]
    assert shapes == [("o_proj", 1024, 256), ("dense_gate_up", 1280, 1024), ("dense_down", 1024, 640)]
    assert str(p) in B.config_label(a, Glm5Config.from_file(p))
    _, glm52 = B.validate(_args("--preset", "glm5.2", "--shapes", "o_proj"))
    c = Glm5Config.preset("glm5.2")
    assert glm52 == [("o_proj", c.hidden_size, c.num_attention_heads * c.v_head_dim)]


def test_k_not_a_multiple_of_128_is_refused_per_shape():
    cfg = small_config(v_head_dim=48)  # o_proj K = 4 x 48 = 192
    with pytest.raises(ValueError, match="o_proj has K=192"):
        B.shapes_from_config(cfg, ["o_proj"])
    assert B.shapes_from_config(cfg, ["dense_down"]) == [("dense_down", 512, 384)]


def test_floor_and_weight_bytes():
    assert B.weight_bytes(6144, 16384) == 6144 * 16384 + 48 * 128 * 4
    assert B.weight_bytes(200, 256) == 200 * 256 + 2 * 2 * 4  # ragged N: ceil(200 / 128) scale rows
    assert B.floor_bytes(6144, 16384, 4) == B.weight_bytes(6144, 16384) + 4 * 16384 * 2 + 4 * 6144 * 2


def test_rotation_exceeds_twice_l2_with_at_least_two_copies():
    l2 = 60 * 2**20
    o_proj = B.rotation(B.weight_bytes(6144, 16384), l2, 256)
    assert o_proj.sets == 2 and o_proj.covers_l2 and o_proj.launches % 2 == 0
    big = B.rotation(B.weight_bytes(24576, 6144), l2, 256)  # 151 MB alone exceeds 2x L2: still two copies
    assert big.sets == 2 and big.launches % big.sets == 0 and big.launches >= 20
    small = B.rotation(1 << 20, l2, 256)
    assert small.sets == 120 and small.covers_l2 and small.launches % 120 == 0
    capped = B.rotation(1 << 20, l2, 16)
    assert capped.sets == 16 and not capped.covers_l2 and capped.capped_by == "max_sets"
    assert B.rotation(1 << 30, l2, 1).sets == 1


def test_make_weight_is_the_checkpoint_layer0_tensors():
    from glm5_fastpath.weights import _lin, generate_tensor

    cfg = Glm5Config.preset("small")
    (_, n, k), = B.shapes_from_config(cfg, ["dense_gate_up"])
    w8, ws = B.make_weight("dense_gate_up", n, k, seed=3)
    assert w8.dtype == torch.float8_e4m3fn and tuple(w8.shape) == (n, k)
    assert ws.dtype == torch.float32 and tuple(ws.shape) == (n // 128, k // 128) and bool((ws > 0).all())
    gate = generate_tensor(_lin("model.layers.0.mlp.gate_proj.weight", n // 2, k), 3)
    up = generate_tensor(_lin("model.layers.0.mlp.up_proj.weight", n // 2, k), 3)
    half = n // 2
    assert torch.equal(w8[:half].view(torch.uint8), gate["model.layers.0.mlp.gate_proj.weight"].view(torch.uint8))
    assert torch.equal(w8[half:].view(torch.uint8), up["model.layers.0.mlp.up_proj.weight"].view(torch.uint8))
    assert torch.equal(ws[half // 128:], up["model.layers.0.mlp.up_proj.weight_scale_inv"])
    from glm5_fastpath.ref.fp8 import dequant_weight_block

    std = dequant_weight_block(w8, ws).std().item()
    assert abs(std - k ** -0.5) < 0.05 * k ** -0.5  # realistic magnitude: std K^-0.5, as make-checkpoint writes
    w8b, _ = B.make_weight("dense_gate_up", n, k, seed=4)
    assert not torch.equal(w8.view(torch.uint8), w8b.view(torch.uint8))


@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (5, 200, 384), (3, 6 * 128 + 64, 256)])
def test_reference_is_the_quantised_math_in_float64(m, n, k):
    from glm5_fastpath.ref.fp8 import block_fp8_linear, quant_act_per_token, quant_weight_block

    g = torch.Generator().manual_seed(m * 7 + n)
    x = torch.randn(m, k, generator=g).bfloat16()
    w8, ws = quant_weight_block(torch.randn(n, k, generator=g) * k ** -0.5)
    ref = B.reference(x, w8, ws)
    assert ref.dtype == torch.float64 and tuple(ref.shape) == (m, n)
    x8, xs = quant_act_per_token(x)
    fp32 = block_fp8_linear(x8, xs, w8, ws).double()  # the project's fp32 formulation of the same math
    assert (ref - fp32).norm() / ref.norm() < 1e-5
    # chunking over N does not change it (chunks of one scale row, ragged last one): float64 rounding only
    assert torch.allclose(B.reference(x, w8, ws, chunk=128), ref, rtol=1e-12, atol=1e-12)
    # and a bf16-rounded copy (what a correct kernel returns) sits well inside the flag
    from glm5_fastpath.testing.numerics import rel_err

    assert rel_err(ref.bfloat16(), ref) < 0.005 < B.ERR_FLAG


def _fake_sglang(monkeypatch, dispatch):
    mods = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization",
                 "sglang.srt.layers.quantization.fp8_utils"):
        mods[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, mods[name])
    mods["sglang"].__version__ = "9.9.9"
    mods["sglang.srt.layers.quantization"].fp8_utils = mods["sglang.srt.layers.quantization.fp8_utils"]
    mods["sglang.srt.layers.quantization.fp8_utils"].dispatch_w8a8_block_fp8_linear = dispatch


def _linear_impl(calls):
    def deepgemm_w8a8_block_fp8_linear_with_fallback(input, weight, block_size, weight_scale, input_scale=None,
                                                     bias=None, act_scale_ue8m0=False):
        calls.append(dict(input=input, weight=weight, block_size=block_size, weight_scale=weight_scale,
                          input_scale=input_scale, bias=bias, act_scale_ue8m0=act_scale_ue8m0))
        return "y"
    return deepgemm_w8a8_block_fp8_linear_with_fallback


def test_stock_dispatch_0_5_14_signature(monkeypatch):
    calls, seen = [], []

    def dispatch_w8a8_block_fp8_linear():  # 0.5.14: no arguments
        seen.append(())
        return _linear_impl(calls)

    _fake_sglang(monkeypatch, dispatch_w8a8_block_fp8_linear)
    fn, name, reason = B._stock_fn()
    assert reason == "" and seen == [()]
    assert "sglang 9.9.9" in name and name.endswith("deepgemm_w8a8_block_fp8_linear_with_fallback")
    assert fn("x", "w", "s") == "y"
    assert calls == [dict(input="x", weight="w", block_size=[128, 128], weight_scale="s", input_scale=None,
                          bias=None, act_scale_ue8m0=False)]


def test_stock_dispatch_0_5_23_signature(monkeypatch):
    calls, seen = [], []

    def dispatch_w8a8_block_fp8_linear(weight_block_size=None, act_scale_ue8m0=False):  # 0.5.23
        seen.append((weight_block_size, act_scale_ue8m0))
        return functools.partial(_linear_impl(calls), act_scale_ue8m0=act_scale_ue8m0)

    _fake_sglang(monkeypatch, dispatch_w8a8_block_fp8_linear)
    fn, name, reason = B._stock_fn()
    assert reason == "" and seen == [([128, 128], False)]
    assert "weight_block_size=[128, 128], act_scale_ue8m0=False" in name
    assert "deepgemm_w8a8_block_fp8_linear_with_fallback with {'act_scale_ue8m0': False}" in name
    assert fn("x", "w", "s") == "y" and calls[0]["block_size"] == [128, 128] and calls[0]["input_scale"] is None


def test_stock_unavailable_gives_the_reason(monkeypatch):
    _fake_sglang(monkeypatch, None)
    quant = sys.modules["sglang.srt.layers.quantization"]
    monkeypatch.delattr(quant, "fp8_utils")

    def missing(attr):
        if attr != "fp8_utils":
            raise AttributeError(attr)
        raise ImportError(f"cannot import {attr}: libcuda.so.1 not found")

    monkeypatch.setattr(quant, "__getattr__", missing, raising=False)  # the submodule's import fails
    fn, name, reason = B._stock_fn()
    assert fn is None and name == ""
    assert reason == ("sglang.srt.layers.quantization.fp8_utils not importable: ImportError: cannot import fp8_utils: "
                      "libcuda.so.1 not found")

    def broken():
        raise RuntimeError("no DeepGEMM")

    _fake_sglang(monkeypatch, broken)
    fn, _, reason = B._stock_fn()
    assert fn is None and reason == "dispatch_w8a8_block_fp8_linear() raised RuntimeError: no DeepGEMM"


def _result(**over):
    res = {"gpu": "NVIDIA H200", "date": "2026-12-01T00:00:00+00:00", "commit": "abc123", "config": "preset glm5",
           "ours": "linear_route.ours_linear", "ours_reason": "", "stock": "sglang 0.5.14: deepgemm",
           "stock_reason": "",
           "copy_bandwidth": {"bytes_per_s": 4.0e12}, "l2_bytes": 60 * 2**20, "err_flag": 0.02, "seed": 0,
           "shapes": [{"shape": "o_proj", "N": 6144, "K": 16384, "weight_bytes": 100_687_872, "rotation": {"sets": 2}},
                      {"shape": "dense_down", "N": 6144, "K": 12288, "weight_bytes": 75_515_904,
                       "rotation": {"sets": 2}}],
           "rows": [{"shape": "o_proj", "M": 1, "floor_us": 25.2, "ours_us": 30.0, "stock_us": 34.5,
                     "stock_over_ours": 1.15, "ours_over_floor": 1.19, "stock_over_floor": 1.37,
                     "ours_rel_l2": 0.0021, "stock_rel_l2": 0.0022},
                    {"shape": "o_proj", "M": 64, "floor_us": 25.9, "ours_us": 40.0, "ours_rel_l2": 0.35,
                     "stock_error": "RuntimeError: boom"},
                    {"shape": "dense_down", "M": 1, "floor_us": 18.9, "ours_us": 21.0, "stock_us": 26.0,
                     "stock_over_ours": 1.238, "ours_over_floor": 1.111, "stock_over_floor": 1.376,
                     "ours_rel_l2": 0.0019, "stock_rel_l2": float("nan")}],
           "aborted": ""}
    res.update(over)
    return res


def test_markdown_report():
    md = B.markdown(_result())
    assert md.startswith("# Block-FP8 linears outside the prefix: ours vs SGLang (NVIDIA H200, "
                         "2026-12-01T00:00:00+00:00, commit abc123)")
    assert "Stock: `sglang 0.5.14: deepgemm`" in md and "(4.00 TB/s)" in md and "60 MiB" in md
    assert "## o_proj (N=6144, K=16384; 100.7 MB of weights + scales, 2 copies)" in md
    assert "| 1 | 25.20 | 30.00 | 34.50 | 1.15 | 1.19 | 1.37 | 0.0021 | 0.0022 |" in md
    assert "| 64 | 25.90 | 40.00 | - | - | - | - | **0.3500 !** | - |" in md  # above 0.02: flagged
    assert "| 1 | 18.90 | 21.00 | 26.00 | 1.24 | 1.11 | 1.38 | 0.0019 | **nan !** |" in md  # NaN flagged too
    # the rows land under their own shape's table
    assert md.index("| 64 | 25.90") < md.index("## dense_down") < md.index("| 1 | 18.90")
    assert "- o_proj M=64 stock_error: RuntimeError: boom" in md
    assert "Run aborted" not in md


def test_markdown_says_why_a_column_is_missing():
    md = B.markdown(_result(stock="", stock_reason="sglang.srt.layers.quantization.fp8_utils not importable: X",
                            ours_reason="precompile failed: RuntimeError: nvcc", aborted="o_proj M=64 ours: lost"))
    assert ("Stock: not run, the stock columns are empty: sglang.srt.layers.quantization.fp8_utils not "
            "importable: X") in md
    assert "Ours: not run, the ours columns are empty: precompile failed: RuntimeError: nvcc" in md
    assert "**Run aborted:** o_proj M=64 ours: lost." in md


def test_json_round_trip_of_the_result(tmp_path):
    res = _result()
    p = tmp_path / "fp8_linear.json"
    p.write_text(json.dumps(res, indent=1, default=str))
    back = json.loads(p.read_text())
    assert back["rows"][0]["stock_over_ours"] == 1.15 and back["shapes"][1]["shape"] == "dense_down"
    assert B.markdown(back).count("| M | floor us |") == 2


def test_ratios():
    row = {"floor_us": 20.0, "ours_us": 25.0, "stock_us": 50.0}
    B._ratios(row)
    assert (row["stock_over_ours"], row["ours_over_floor"], row["stock_over_floor"]) == (2.0, 1.25, 2.5)
    row = {"floor_us": 20.0, "ours_us": 25.0}
    B._ratios(row)
    assert "stock_over_ours" not in row and "stock_over_floor" not in row and row["ours_over_floor"] == 1.25


def test_needs_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert B.main(_args()) == 2 and "needs a CUDA GPU" in capsys.readouterr().out


def test_help_through_the_cli():
    r = subprocess.run([sys.executable, "-m", "glm5_fastpath.cli", "bench", "fp8-linear", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for opt in ("--out", "--ms", "--shapes", "--preset", "--config", "--replays", "--seed"):
        assert opt in r.stdout, opt
    r = subprocess.run([sys.executable, "-m", "glm5_fastpath.cli", "bench", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "fp8-linear" in r.stdout and "(GPU) the block-FP8 linears" in r.stdout


def test_measure_shape_on_cpu_checks_times_and_keeps_going_past_a_failing_path():
    """The per-shape loop end to end on the CPU with stand-in paths: a correct one (bf16 of the quantised math),
    a wrong one (flagged by its rel err, still timed), one that raises (its error recorded, the others kept)."""
    from glm5_fastpath.ref.fp8 import block_fp8_linear, quant_act_per_token

    def correct(x, w, s):
        x8, xs = quant_act_per_token(x)
        return block_fp8_linear(x8, xs, w, s).bfloat16()

    def wrong(x, w, s):
        return (correct(x, w, s).float() * 1.1).bfloat16()

    def broken(x, w, s):
        raise RuntimeError("no kernel image")

    seen_w = set()

    def ours(x, w, s):
        seen_w.add(w.data_ptr())
        return correct(x, w, s)

    cfg = Glm5Config.preset("small")
    (name, n, k), = B.shapes_from_config(cfg, ["o_proj"])
    logs = []
    info, rows, aborted = B.measure_shape(
        name, n, k, [1, 3], {"ours": ours, "stock": wrong, "other": broken}, torch.device("cpu"), seed=0,
        replays=2, max_copies=8, bw={"bytes_per_s": 1e12}, l2=0, ours_config=lambda m: {"tm": 8 * m},
        log=logs.append)
    assert aborted == "" and info["rotation"]["sets"] == 2 and info["weight_bytes"] == B.weight_bytes(n, k)
    assert len(seen_w) == 2  # the timed launches rotate over both weight copies
    assert [r["M"] for r in rows] == [1, 3] and len(logs) == 2
    for r in rows:
        assert r["floor_us"] == pytest.approx(B.floor_bytes(n, k, r["M"]) / 1e6)
        assert r["ours_rel_l2"] < 0.005 and abs(r["stock_rel_l2"] - 0.1) < 0.01  # 10 % off: above the flag
        assert r["ours_us"] > 0 and r["ours_timing"]["method"] == "cpu-wall" and r["ours_config"] == {"tm": 8 * r["M"]}
        assert r["stock_over_ours"] == pytest.approx(r["stock_us"] / r["ours_us"])
        assert r["other_error"] == "RuntimeError: no kernel image" and "other_us" not in r
    md = B.markdown({"rows": rows, "shapes": [info], "stock": "x"})
    assert md.count("**0.1") == 2  # the wrong path's rel err flagged at both M


def test_measure_shape_rejects_a_wrong_output_shape():
    cfg = Glm5Config.preset("small")
    (name, n, k), = B.shapes_from_config(cfg, ["dense_down"])
    _, rows, _ = B.measure_shape(name, n, k, [2], {"ours": lambda x, w, s: torch.zeros(2, n - 2, dtype=torch.bfloat16)},
                                 torch.device("cpu"), seed=0, replays=1, max_copies=2, bw={}, l2=0, log=lambda s: None)
    assert rows[0]["ours_error"] == f"RuntimeError: output (2, {n - 2}) torch.bfloat16, expected (2, {n}) bf16"
    assert rows[0]["floor_us"] is None and "ours_us" not in rows[0]


def test_variant_configs():
    """--variants: 'persist' deals the units over one CTA per SM, 'pipe2' sets the stage-pair consumer; None where moot."""
    import dataclasses

    from glm5_fastpath.ops import fp8_gemm as F

    big = F.config_for(128, 6144, 16384, F.EPI_PLAIN, 132, "wgmma")  # M = 128: the heuristic's multi-wave split-K
    assert not big.persist and B.variant_config("persist", big) == dataclasses.replace(big, persist=132)
    # the tuned M = 1 entry: 2 splits with the cluster reduce, 96 units, one wave: no persistent variant
    small = F.config_for(1, 6144, 16384, F.EPI_PLAIN, 132, "wgmma")
    assert B.variant_config("persist", small) is None
    assert B.variant_config("persist", F.config_for(1, 2624, 6144, F.EPI_PLAIN, 132, "wgmma")) is None  # one wave
    assert B.variant_config("pipe2", small).pipe == 2
    assert B.variant_config("pipe2", big) is None and big.tm == 128  # pipe2 is for token blocks <= 64
    with pytest.raises(ValueError, match="unknown variant"):
        B.variant_config("nope", big)
    md = B.markdown({"rows": [{"shape": "o_proj", "M": 1, "ours_us": 30.0, "ours_persist_us": 36.0,
                               "ours_config": dataclasses.replace(big, pipe=2).describe()}],
                     "shapes": [{"shape": "o_proj", "N": 6144, "K": 16384, "weight_bytes": 1e8}]})
    assert "ours_persist us" in md and "| 36.00 |" in md and "pipe2" in md
