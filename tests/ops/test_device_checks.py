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
