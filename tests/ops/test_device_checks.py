"""The shared device check: CUDA only, Hopper or newer, cached per device, errors name the op (runs on CPU)."""
import pytest
import torch

from glm5_fastpath.ops import _device


def test_non_cuda_device_uses_the_ops_error():
    with pytest.raises(KeyError, match="must be on a CUDA device"):
        _device.require_hopper("glm5_fastpath.x", torch.device("cpu"), lambda m: KeyError(m))


def test_pre_hopper_refused_and_cached(monkeypatch):
    calls = []
    monkeypatch.setattr(_device, "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: calls.append(i) or (8, 0))
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"glm5_fastpath.x: needs a Hopper \(sm_90\)"):
            _device.require_hopper("glm5_fastpath.x", torch.device("cuda", 3), ValueError)
    assert calls == [3]  # asked once per device


def test_hopper_accepted(monkeypatch):
    monkeypatch.setattr(_device, "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    assert _device.require_hopper("op", torch.device("cuda", 1), ValueError) == 1


def test_require_aligned_names_the_tensor():
    base = torch.zeros(64, dtype=torch.uint8)
    _device.require_aligned(ValueError, {"ok": base[:16]})
    with pytest.raises(ValueError, match=r"x data must be 16-byte aligned \(got address"):
        _device.require_aligned(ValueError, {"ok": base[:16], "x": base[1:17]})
    _device.require_aligned(ValueError, {"empty": base[1:1]})  # no data, nothing to align


def test_overlaps_by_byte_ranges():
    t = torch.zeros(8, 8)
    assert _device.overlaps(t[0], t[0, 4:]) and _device.overlaps(t, t[7])
    assert not _device.overlaps(t[0], t[1]) and not _device.overlaps(t[:0], t)
    assert _device.overlaps(t[:, 0], t[3])  # strided column crosses row 3


def test_ops_precompile_builds_every_requested_wait_point(monkeypatch):
    """ops.precompile(pdl_waits=...) hands the GLM5_PDL_WAIT_AT codes of the early-wait CMP modes to every op
    family (separate cubins: without them a PDL mode's first launch compiles inside SGLang's graph capture)."""
    from glm5_fastpath import ops

    moe_router = ops._moe_router
    got = {}
    for mod in (ops._a0, ops._c0, ops._d2, ops._e1, ops._e2, ops._fp8):
        monkeypatch.setattr(mod, "precompile", lambda *a, _m=mod.__name__, **k: got.setdefault(_m, k.get("wait_ats")))
    monkeypatch.setattr(moe_router, "precompile", lambda *a, **k: None)
    ops.precompile(None, "cpu", pdl_waits=(None, "entry", "after_prologue", None))
    assert len(got) == 6 and all(w == (2, 0, 1) for w in got.values()), got
    got.clear()
    ops.precompile(None, "cpu")
    assert all(w == (2,) for w in got.values())
    with pytest.raises(ValueError, match="pdl_wait"):
        ops.precompile(None, "cpu", pdl_waits=("sometime",))
