"""Test configuration: GPU tests carry @pytest.mark.gpu and are skipped without CUDA."""
import os

import pytest
import torch


def _cuda_ok() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on an H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed():
    """A fresh seed per test run (printed so a failure can be replayed with GLM5_FASTPATH_TEST_SEED)."""
    s = int(os.environ.get("GLM5_FASTPATH_TEST_SEED", torch.seed() % (2**31)))
    print(f"seed={s}")
    torch.manual_seed(s)
    return s


@pytest.fixture
def nvcc_jit(tmp_path, monkeypatch):
    """compile(spec) -> CompiledKernel for sm_90a into a fresh JIT cache, with the ptxas report on; skips the
    test where there is no nvcc (compile checks need the CUDA toolkit, not a GPU)."""
    from glm5_fastpath.jit import NvccNotFoundError, compile_kernel, find_nvcc

    try:
        find_nvcc()
    except NvccNotFoundError:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("GLM5_FASTPATH_CACHE_DIR", str(tmp_path / "jit"))
    monkeypatch.setenv("GLM5_FASTPATH_PTXAS_VERBOSE", "1")
    return lambda spec, arch="sm_90a": compile_kernel(spec, arch)


@pytest.fixture
def no_pdl_override(monkeypatch):
    """PDL on, whatever GLM5_FASTPATH_DISABLE_PDL says in the environment (the PDL tests need it). Here rather than in
    tests/ops/conftest.py so tests in any directory can ask for it (session 37's tests/moe file could not)."""
    monkeypatch.delenv("GLM5_FASTPATH_DISABLE_PDL", raising=False)
