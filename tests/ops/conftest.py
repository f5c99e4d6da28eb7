"""Fixtures shared by the op tests."""
import pytest

from glm5_fastpath.ops import fp8_gemm as _fp8_gemm


@pytest.fixture
def no_pdl_override(monkeypatch):
    """PDL on, whatever GLM5_FASTPATH_DISABLE_PDL says in the environment (the PDL tests need it)."""
    monkeypatch.delenv("GLM5_FASTPATH_DISABLE_PDL", raising=False)


@pytest.fixture(params=_fp8_gemm.IMPLS)
def impl(request, monkeypatch):
    """Run the test with each FP8 GEMM mainloop, forced for every op through GLM5_FASTPATH_FP8_GEMM_IMPL."""
    monkeypatch.setenv(_fp8_gemm.IMPL_ENV, request.param)
    return request.param
