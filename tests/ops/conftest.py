"""Fixtures shared by the op tests."""
import pytest


@pytest.fixture
def no_pdl_override(monkeypatch):
    """PDL on, whatever GLM5_FASTPATH_DISABLE_PDL says in the environment (the PDL tests need it)."""
    monkeypatch.delenv("GLM5_FASTPATH_DISABLE_PDL", raising=False)
