"""Numeric comparison helpers and thresholds: the one place every test takes them from.

Every check computes in float64 and fails with a message naming the op, the shapes and the
measured error, so a failing CI log is actionable without re-running.
"""
from __future__ import annotations

from typing import Iterable

import torch

# Relative-error thresholds ||out - ref|| / ||ref|| by what separates the two sides.
THRESHOLDS: dict[str, float] = {
    # same math, both sides in fp32 or better (reordering of sums only)
    "fp32": 1e-5,
    # one side rounds intermediates to bf16 (one or two roundings on the way)
    "bf16": 1.5e-2,
    # a GEMM/norm chain with several bf16 roundings vs a float64 formulation
    "bf16_chain": 3e-2,
    # FP8 kernel vs the reference with the *same* quantization (accumulation order / a rare 1-ulp re-quant flip)
    "fp8_same_quant": 2e-2,
    # FP8 path vs a float64 formulation without quantization (quantization noise itself)
    "fp8_vs_exact": 8e-2,
    # two FP8 paths quantizing DIFFERENT intermediates of the same values (e.g. rotated vs unrotated indexer q / k):
    # each within fp8_vs_exact of the exact result, so within twice that of each other (triangle inequality)
    "fp8_vs_fp8": 16e-2,
}


def _fmt_shapes(*ts: torch.Tensor) -> str:
    return ", ".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in ts)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 in float64 (0 when both are zero)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    den = r.norm().item()
    num = (o - r).norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def calc_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """1 - 2<x,y>/(|x|^2+|y|^2) in float64: scale-sensitive similarity, 0 for identical tensors."""
    x, y = out.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    den = (x * x + y * y).sum().item()
    if den == 0.0:
        return 0.0
    return 1.0 - 2.0 * (x * y).sum().item() / den


def max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.detach().double().cpu() - ref.detach().double().cpu()).abs().max().item() if out.numel() else 0.0


def assert_close(op: str, out: torch.Tensor, ref: torch.Tensor, *, kind: str | None = None,
                 tol: float | None = None, context: str = "") -> float:
    """Fail unless rel_err(out, ref) <= tol (taken from THRESHOLDS[kind] when tol is None).

    NaN/Inf in `out` always fails (that also catches poisoned, unwritten outputs).
    Returns the measured relative error.
    """
    if tol is None:
        if kind is None:
            raise ValueError("assert_close: pass kind= (a THRESHOLDS key) or tol=")
        tol = THRESHOLDS[kind]
    where = f"{op}: out {_fmt_shapes(out)} vs ref {_fmt_shapes(ref)}" + (f" [{context}]" if context else "")
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"{where}: shape mismatch")
    o = out.detach().double().cpu()
    bad = ~torch.isfinite(o)
    if bad.any():
        idx = bad.nonzero()[:4].tolist()
        raise AssertionError(f"{where}: {int(bad.sum())} non-finite elements (unwritten/poisoned?), first at {idx}")
    e = rel_err(out, ref)
    if not e <= tol:
        raise AssertionError(f"{where}: rel_err={e:.3e} > tol={tol:.1e} (kind={kind}); "
                             f"max_abs_err={max_abs_err(out, ref):.3e}, |ref|_max={ref.detach().double().abs().max().item():.3e}")
    return e


def assert_equal(op: str, out: torch.Tensor, ref: torch.Tensor, context: str = "") -> None:
    """Bitwise equality (fp8 compared as bytes, NaN never equal)."""
    where = f"{op}: out {_fmt_shapes(out)} vs ref {_fmt_shapes(ref)}" + (f" [{context}]" if context else "")
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        raise AssertionError(f"{where}: shape/dtype mismatch")
    a, b = out.detach().cpu(), ref.detach().cpu()
    if a.dtype.is_floating_point and a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    neq = a != b
    if a.dtype.is_floating_point:
        neq = neq | torch.isnan(a)
    if neq.any():
        idx = neq.nonzero()[:4].tolist()
        raise AssertionError(f"{where}: {int(neq.sum())} of {a.numel()} elements differ, first at {idx}")


def topk_overlap(out: torch.Tensor, ref: torch.Tensor, pad: int = -1) -> float:
    """Mean over rows of |set(out) & set(ref)| / |set(ref)| (pad entries ignored; rows with no valid ref count 1)."""
    o, r = out.detach().cpu(), ref.detach().cpu()
    fracs = []
    for orow, rrow in zip(o.tolist(), r.tolist()):
        rs = {v for v in rrow if v != pad}
        os_ = {v for v in orow if v != pad}
        fracs.append(1.0 if not rs else len(rs & os_) / len(rs))
    return sum(fracs) / max(len(fracs), 1)


def assert_topk_sets(op: str, out: torch.Tensor, ref: torch.Tensor, *, min_overlap: float = 0.999,
                     pad: int = -1) -> float:
    """Top-k outputs compared as sets per row (order-free, ties tolerated up to min_overlap)."""
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"{op}: shape mismatch {tuple(out.shape)} vs {tuple(ref.shape)}")
    ov = topk_overlap(out, ref, pad)
    if ov < min_overlap:
        raise AssertionError(f"{op}: top-k set overlap {ov:.5f} < {min_overlap} for shape {tuple(out.shape)}")
    o = out.detach().cpu()
    for i, row in enumerate(o.tolist()):
        valid = [v for v in row if v != pad]
        if len(valid) != len(set(valid)):
            raise AssertionError(f"{op}: row {i} has duplicate indices")
    return ov


# ---- poisoning: unwritten outputs must fail ------------------------------------------------------

def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no correct kernel produces: NaN for floats (0xFF = NaN for e4m3fn), INT_MIN-ish for ints."""
    if t.dtype.is_floating_point:
        if t.element_size() == 1:
            t.view(torch.uint8).fill_(0xFF)
        else:
            t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return poison_(torch.empty_like(t))


def assert_no_poison(op: str, *ts: torch.Tensor, names: Iterable[str] | None = None) -> None:
    names = list(names) if names is not None else [f"out{i}" for i in range(len(ts))]
    for n, t in zip(names, ts):
        a = t.detach().cpu()
        if a.dtype.is_floating_point:
            bad = (a.view(torch.uint8) == 0xFF) if a.element_size() == 1 else torch.isnan(a)
        elif a.dtype == torch.bool:
            continue
        else:
            bad = a == torch.iinfo(a.dtype).min
        if bad.any():
            raise AssertionError(f"{op}: {n} {tuple(a.shape)} has {int(bad.sum())} unwritten (poisoned) elements, "
                                 f"first at {bad.nonzero()[:4].tolist()}")
