"""CI's compile check: every kernel in csrc/ builds for sm_90a without spills (needs nvcc, not a GPU)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_compiles_for_sm90a(tmp_path):
    from glm5_fastpath.jit import NvccNotFoundError, find_nvcc
    try:
        find_nvcc()
    except NvccNotFoundError:
        pytest.skip("nvcc not found: compile check needs the CUDA toolkit (not a GPU)")
    out = tmp_path / "compile.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_check.py"), "--arch", "sm_90a",
                        "--json", str(out), "--cache-dir", str(tmp_path / "jit")], capture_output=True, text=True)
    assert r.returncode == 0, f"compile check failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    report = json.loads(out.read_text())
    assert report, "compile check compiled nothing"
