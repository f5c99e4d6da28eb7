"""L2 prefetch sites in the decode step: pull the next weight-bound kernel's weights into L2 while a latency-bound
stretch of the layer leaves HBM idle (ops.prefetch.l2_prefetch: one small PDL kernel, a hint that changes no
result).

Sites (GLM5_FASTPATH_L2_PREFETCH: a comma list of them, "all", or "none"):
- `tail`   at the end of our attention prefix, before SGLang's q concat / our sparse MLA / the W_UV bmm: the
           first GLM5_FASTPATH_L2_PREFETCH_OPROJ (default 0.3) of every o_proj weight row (its K-prefix,
           what the GEMM's CTAs read first; 30 MB of 100 MB for GLM-5) and all of W_UV (16.8 MB). The sparse
           MLA moves < 20 MB and is latency-bound, so HBM is free for ~15-30 us there.
- `moe`    at the start of our MoE route, before the router: the fused shared expert's w13 and w2 (37.7 MB),
           the one expert every token uses, so it is known before the router runs; the router + plan window
           (~16-19 us per layer on an H200) covers its ~9 us of HBM time.
- `prefix` at the start of our attention prefix: q_b's weight (33.5 MB), read ~15 us later by D0 after the
           QKV-A GEMM and the norms.
Default: off (not yet measured in the engine; `glm5-fastpath bench l2-prefetch` times each site alone); an
unknown site name is logged and ignored. A prefetch that raises is logged once and that site is switched off
for the process (it is a hint: the step runs the same without it).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Sequence

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_L2_PREFETCH"
ENV_OPROJ = "GLM5_FASTPATH_L2_PREFETCH_OPROJ"
SITES = ("prefix", "tail", "moe")
DEFAULT_SITES: tuple[str, ...] = ()
DEFAULT_OPROJ_FRACTION = 0.3


def parse_sites(value: str | None, log: logging.Logger = logger) -> frozenset[str]:
    """GLM5_FASTPATH_L2_PREFETCH's value -> the enabled sites (None / unset: DEFAULT_SITES)."""
    if value is None:
        return frozenset(DEFAULT_SITES)
    v = value.strip().lower()
    if v in ("", "none", "0", "off", "false"):
        return frozenset()
    if v in ("all", "1", "on", "true"):
        return frozenset(SITES)
    names = {s.strip() for s in v.split(",") if s.strip()}
    bad = sorted(names - set(SITES))
    if bad:
        log.warning("glm5_fastpath: %s: unknown site(s) %s ignored (sites: %s)", ENV, ",".join(bad), ",".join(SITES))
    return frozenset(names & set(SITES))


def parse_fraction(value: str | None, log: logging.Logger = logger) -> float:
    if value is None or not value.strip():
        return DEFAULT_OPROJ_FRACTION
    try:
        f = float(value)
    except ValueError:
        f = -1.0
    if not 0.0 < f <= 1.0:
        log.warning("glm5_fastpath: %s=%r is not a fraction in (0, 1]; using %g", ENV_OPROJ, value,
                    DEFAULT_OPROJ_FRACTION)
        return DEFAULT_OPROJ_FRACTION
    return f


def _cuda_tensors(items: Sequence[tuple[Any, float]]) -> tuple[list, list]:
    import torch

    ts, fs = [], []
    for t, f in items:
        if isinstance(t, torch.Tensor) and t.is_cuda and t.numel():
            ts.append(t)
            fs.append(f)
    return ts, fs


class L2Prefetcher:
    """The enabled sites and what each prefetches; `issue` never raises."""

    def __init__(self, sites: frozenset[str] | None = None, oproj_fraction: float | None = None,
                 log: logging.Logger = logger) -> None:
        self.log = log
        self.sites = parse_sites(os.environ.get(ENV), log) if sites is None else frozenset(sites)
        self.oproj_fraction = parse_fraction(os.environ.get(ENV_OPROJ), log) if oproj_fraction is None else oproj_fraction
        self.failed: set[str] = set()
        self.issued: dict[str, int] = {}

    def describe(self) -> str:
        if not self.sites:
            return "off"
        parts = [s + (f" (o_proj K-prefix {self.oproj_fraction:g})" if s == "tail" else "") for s in SITES
                 if s in self.sites]
        return ", ".join(parts)

    def issue(self, site: str, items: Sequence[tuple[Any, float]]) -> bool:
        """Launch the prefetch of `items` ((tensor, fraction) pairs) for `site` if it is on; -> launched."""
        if site not in self.sites or site in self.failed:
            return False
        try:
            from ...ops.prefetch import MAX_RANGES, l2_prefetch

            ts, fs = _cuda_tensors(items)
            if not ts:
                return False
            l2_prefetch(ts[:MAX_RANGES], fs[:MAX_RANGES])
        except Exception as e:  # noqa: BLE001 - a hint: never take the step down
            self.failed.add(site)
            self.log.warning("glm5_fastpath: L2 prefetch site %r raised %s: %s; that site is off for this process",
                             site, type(e).__name__, e)
            return False
        self.issued[site] = self.issued.get(site, 0) + 1
        return True

    # -- the sites -------------------------------------------------------------------------------------------
    def prefix(self, weight_env: dict) -> bool:
        return self.issue("prefix", [(weight_env.get("w.q_b.weight"), 1.0)])

    def tail(self, attn: Any) -> bool:
        o_proj = getattr(getattr(attn, "o_proj", None), "weight", None)
        return self.issue("tail", [(o_proj, self.oproj_fraction), (getattr(attn, "w_vc", None), 1.0)])

    def moe(self, weights: Any) -> bool:
        """weights: moe.megamoe.MegaMoEWeights; its shared experts are the last num_shared rows."""
        n_sh = int(getattr(weights, "num_shared", 0) or 0)
        if not n_sh:
            return False
        first = weights.num_total - n_sh
        return self.issue("moe", [(weights.w13[first:], 1.0), (weights.w2[first:], 1.0)])


_default: L2Prefetcher | None = None


def default() -> L2Prefetcher:
    global _default
    if _default is None:
        _default = L2Prefetcher()
    return _default


def reset_default() -> None:
    """Forget the process-wide prefetcher (tests; a changed environment)."""
    global _default
    _default = None
