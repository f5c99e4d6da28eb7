"""integrations.sglang.l2_prefetch: the sites' env parsing, what each site hands to the op, and that a raising
prefetch turns its site off (logged) instead of failing the step."""
from __future__ import annotations

import logging
import types

import torch

from glm5_fastpath.integrations.sglang import l2_prefetch as L
from glm5_fastpath.moe.megamoe import MegaMoEWeights


def test_parse_sites(caplog):
    assert L.parse_sites(None) == frozenset(L.DEFAULT_SITES)
    assert L.parse_sites("none") == frozenset() == L.parse_sites("0")
    assert L.parse_sites("all") == frozenset(L.SITES)
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        assert L.parse_sites("tail, moe,bogus") == {"tail", "moe"}
    assert "bogus" in caplog.text


def test_parse_fraction(caplog):
    assert L.parse_fraction(None) == L.DEFAULT_OPROJ_FRACTION
    assert L.parse_fraction("0.5") == 0.5
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        assert L.parse_fraction("2") == L.DEFAULT_OPROJ_FRACTION
        assert L.parse_fraction("x") == L.DEFAULT_OPROJ_FRACTION
    assert L.ENV_OPROJ in caplog.text


class _Recorder(L.L2Prefetcher):
    def __init__(self, sites, **kw):
        super().__init__(sites=frozenset(sites), oproj_fraction=0.25, **kw)
        self.calls = []

    def issue(self, site, items):
        if site not in self.sites:
            return False
        self.calls.append((site, items))
        return True


def test_sites_hand_over_the_right_tensors():
    p = _Recorder(L.SITES)
    attn = types.SimpleNamespace(o_proj=types.SimpleNamespace(weight=torch.zeros(8, 16)), w_vc=torch.zeros(2, 4, 4))
    assert p.tail(attn)
    (site, items), = p.calls
    assert site == "tail" and items[0][0] is attn.o_proj.weight and items[0][1] == 0.25 and items[1][0] is attn.w_vc
    w = MegaMoEWeights(torch.zeros(3, 4, 8), torch.zeros(3, 1, 1), torch.zeros(3, 8, 2), torch.zeros(3, 1, 1), 2, 1)
    assert p.moe(w)
    _, items = p.calls[-1]
    assert items[0][0].shape == (1, 4, 8) and items[0][0].data_ptr() == w.w13[2].data_ptr()
    assert items[1][0].data_ptr() == w.w2[2].data_ptr()
    no_shared = MegaMoEWeights(w.w13[:2], w.w13_scale[:2], w.w2[:2], w.w2_scale[:2], 2, 0)
    assert not p.moe(no_shared)
    q_b = torch.zeros(4, 4)
    assert p.prefix({"w.q_b.weight": q_b}) and p.calls[-1][1][0][0] is q_b
    off = _Recorder(())
    assert not off.tail(attn) and not off.calls


def test_cpu_tensors_launch_nothing():
    p = L.L2Prefetcher(sites=frozenset(L.SITES))
    assert not p.issue("tail", [(torch.zeros(4, 4), 1.0)])
    assert not p.failed and p.describe().startswith("prefix")


def test_a_raising_prefetch_turns_its_site_off(monkeypatch, caplog):
    from glm5_fastpath.ops import prefetch as P

    def boom(*a, **k):
        raise RuntimeError("no kernel")
    monkeypatch.setattr(P, "l2_prefetch", boom)
    monkeypatch.setattr(L, "_cuda_tensors", lambda items: ([t for t, _ in items], [f for _, f in items]))
    p = L.L2Prefetcher(sites=frozenset({"moe"}))
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        assert not p.issue("moe", [(torch.zeros(4), 1.0)])
    assert p.failed == {"moe"} and "no kernel" in caplog.text
    assert not p.issue("moe", [(torch.zeros(4), 1.0)])  # stays off, no second warning
    assert caplog.text.count("no kernel") == 1
