"""Fixtures shared by the op tests (no_pdl_override is in tests/conftest.py, for every test directory)."""
import pytest

from glm5_fastpath.ops import fp8_gemm as _fp8_gemm


@pytest.fixture(params=_fp8_gemm.IMPLS)
def impl(request, monkeypatch):
    """Run the test with each FP8 GEMM mainloop, forced for every op through GLM5_FASTPATH_FP8_GEMM_IMPL."""
    monkeypatch.setenv(_fp8_gemm.IMPL_ENV, request.param)
    return request.param
