"""Against the real sglang package (0.5.23): the entry point is discovered by load_plugins(), the flag parses,
sets GLM5_FASTPATH=1 and survives pickling, and the hooks attach to the real classes. Skipped where sglang is
not importable. Each check runs in a fresh interpreter: load_plugins() patches SGLang's classes process-wide.

CI recipe (CPU, ~1 min; no GPU packages): .ci/run installs sglang==0.5.23 and its import chain with --no-deps
(SGLANG_CPU_TEST_DEPS there) after `pip install -e .` (the entry point must be installed). Where no real
torchvision imports (CI's CPU torch), the subprocesses get the import-only stub in cpu_stubs/ (see its README)."""
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")

STUBS = Path(__file__).parent / "cpu_stubs"


@functools.lru_cache(maxsize=None)
def _torchvision_importable() -> bool:
    r = subprocess.run([sys.executable, "-c", "import torchvision.transforms"], capture_output=True, timeout=120)
    return r.returncode == 0


def _run(code: str, env_extra: dict | None = None, timeout: int = 240) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_FASTPATH")}
    env.update(env_extra or {})
    if not _torchvision_importable():  # CPU CI: import-only stub (cpu_stubs/README.md)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return r.stdout


def test_entry_point_flag_env_and_hooks():
    out = _run("""
import os, pickle
from importlib.metadata import entry_points
eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
assert eps.get("glm5_fastpath") == "glm5_fastpath.integrations.sglang.plugin:register", eps
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.model_executor.model_runner import ModelRunner
assert ModelRunner.load_model.__wrapped__.__name__ == "load_model"
assert "GLM5_FASTPATH" not in os.environ
sa = prepare_server_args(["--model-path", "x", "--enable-glm5-fastpath"])
assert os.environ["GLM5_FASTPATH"] == "1", os.environ.get("GLM5_FASTPATH")
assert sa._glm5_fastpath is True
assert pickle.loads(pickle.dumps(sa))._glm5_fastpath is True
print("OK")
""")
    assert "OK" in out


def test_without_flag_env_stays_unset():
    out = _run("""
import os
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
sa = prepare_server_args(["--model-path", "x"])
assert "GLM5_FASTPATH" not in os.environ and sa._glm5_fastpath is False
print("OK")
""")
    assert "OK" in out


@pytest.mark.slow
def test_external_model_package_resolves_our_class():
    """The 0.5.14 seam: SGLANG_EXTERNAL_MODEL_PACKAGE makes SGLang resolve our GlmMoeDsaForCausalLM subclass."""
    out = _run("""
from sglang.srt.models.registry import ModelRegistry
cls, arch = ModelRegistry.resolve_model_cls(["GlmMoeDsaForCausalLM"])
assert cls.__module__ == "glm5_fastpath.integrations.sglang.models.glm5_moe_dsa", cls.__module__
from sglang.srt.models.glm4_moe import GlmMoeDsaForCausalLM as Stock
assert issubclass(cls, Stock) and cls.__name__ == "GlmMoeDsaForCausalLM"
print("OK")
""", {"SGLANG_EXTERNAL_MODEL_PACKAGE": "glm5_fastpath.integrations.sglang.models"}, timeout=400)
    assert "OK" in out


def test_rmsnorm_has_the_seam_the_norm_route_assumes():
    """integrations/sglang/norm_route.py wraps RMSNorm.forward(x, residual, post_residual_addition) and reads weight /
    variance_epsilon and the form flags; a plain bf16 RMSNorm of this release must qualify."""
    out = _run("""
import inspect, torch
from sglang.srt.layers.layernorm import RMSNorm
from glm5_fastpath.integrations.sglang import norm_route as NR
params = list(inspect.signature(RMSNorm.forward_cuda).parameters)
assert params[:4] == ["self", "x", "residual", "post_residual_addition"], params
try:
    norm = RMSNorm(6144, eps=1e-5, weight_dtype=torch.bfloat16)
except Exception as e:  # a platform check of this build on CPU
    print("SKIP", e)
else:
    assert NR.module_why_not(norm) is None, NR.module_why_not(norm)
    print("OK")
""")
    if "SKIP" in out:
        pytest.skip(out.strip())
    assert "OK" in out

