"""benchmarks/fp8_gemm_sweep.py on CPU: the opt-in FP8-linear shapes, their two-CTAs-per-SM candidates, and the
table rule that a plain linear gets one entry (no fused phase)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("fp8_gemm_sweep", ROOT / "benchmarks" / "fp8_gemm_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_linear_shapes_are_opt_in_and_plain(sweep):
    F = sweep.F
    assert set(sweep.DEFAULT_SHAPES) == {"qkv_a", "q_b", "wq_b", "wk"}
    for name in ("o_proj", "dense_gate_up", "dense_down"):
        assert name in sweep.SHAPES and name not in sweep.DEFAULT_SHAPES and sweep.SHAPES[name][2] == F.EPI_PLAIN


def test_multi_wave_shapes_get_two_ctas_per_sm_candidates(sweep):
    F = sweep.F
    grid = sweep.grid_for(1, 24576, 6144, 132, ("wgmma",), linear=True)
    two = [kn for kn in grid if kn[4] == 2]
    assert two and all(kn[2] in (1, 2, 3) for kn in two)
    for kn in two:  # the ring fits twice in shared memory
        c = F.SkinnyConfig(F.EPI_PLAIN, 1, 24576, 6144, kn[1], kn[2], kn[3], 2, 0, "wgmma")
        assert c.smem_bytes <= F.SMEM_LIMIT // 2
    assert grid.index(two[0]) > 0  # after the cost model's own first choice
    assert not any(kn[4] == 2 for kn in sweep.grid_for(1, 2624, 6144, 132, ("wgmma",), linear=True))  # one wave
    assert not any(kn[4] == 2 for kn in sweep.grid_for(16, 16384, 2048, 132, ("wgmma",)))  # prefix sweep: unchanged


def test_unknown_shape_is_refused():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_gemm_sweep.py"), "--shapes", "nope",
                        "--out", "/tmp/unused_sweep"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown nope" in r.stderr
