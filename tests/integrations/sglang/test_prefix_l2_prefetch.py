"""The SGLang seam honours CMP's `l2:OP=F` modifier like CmpExecutor (cmp/executor.py issue_l2_prefetch /
join_l2_prefetch): the prefetch is issued before the first launch and joined after the last, also when an op
raises; on CPU the results are those of the mode without it."""
import types

import pytest
import torch

import prefix_fakes as F
from glm5_fastpath import selection
from glm5_fastpath.attn_pre.cmp import executor as cmp_executor
from glm5_fastpath.integrations.sglang import prefix_executor as PX
from glm5_fastpath.ref import prefix as P

CFG = F.small_cfg()
SEQ = [5, 70, 130]


def _run(mode):
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ, fused_topk=True)
    ex = PX.PrefixExecutor(impl=P, mode=mode, cfg=CFG)
    out = ex(a.forward_absorb_prepare, step.positions, x, fb, object())
    return [t for t in out if isinstance(t, torch.Tensor)], fb.token_to_kv_pool.get_index_k_with_scale_buffer(1)


@pytest.mark.parametrize("base", ["full", "serial"])
def test_cpu_results_equal_the_mode_without_l2(base):
    (a, ika), (b, ikb) = _run(base), _run(f"{base}+l2:D1=1+l2:D0=0.5")
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ika, ikb)


def test_plan_rejects_an_l2_op_without_weights():
    ex = PX.PrefixExecutor(impl=P, mode="full+l2:E2=1", cfg=CFG)
    with pytest.raises(ValueError, match="no 2-D weights"):
        ex.plan("full")
    PX.PrefixExecutor(impl=P, mode="full+l2:D1=1", cfg=CFG).plan("partial")  # no D1 there: does not apply


def test_uses_l2_prefetch_from_mode_or_table():
    assert not PX.PrefixExecutor(mode="full")._uses_l2_prefetch()
    assert PX.PrefixExecutor(mode="full+l2:D0=1")._uses_l2_prefetch()
    table = selection.parse({"version": 1, "buckets": [
        {"tokens": 4, "prefix": "cmp", "moe": "stock", "cmp_mode": "full+l2:D0=0.5"}]})
    assert PX.PrefixExecutor(mode="full", router=types.SimpleNamespace(table=table))._uses_l2_prefetch()


class _Stream:
    device = "cuda:0"


@pytest.fixture
def fake(monkeypatch):
    log = []

    def issue(mode, graph, env, main, side, *, bulk=False):
        log.append(("issue", mode.l2_prefetch, main is streams[0], side, bulk))
        return "l2"

    monkeypatch.setattr(cmp_executor, "issue_l2_prefetch", issue)
    monkeypatch.setattr(cmp_executor, "join_l2_prefetch", lambda main, side: log.append(("join", side)))
    streams = [_Stream()]
    return log, streams


def _graph(log, fail=False):
    def x(e):
        log.append("X")
        return {"b": e["a"] + 1}

    def d0(e):
        log.append("D0")
        if fail:
            raise RuntimeError("D0 failed")
        return {"c": e["b"] * 2}

    ops = {"X": types.SimpleNamespace(inputs=("a",), ref=x), "D0": types.SimpleNamespace(inputs=("b",), ref=d0)}
    launches = tuple(types.SimpleNamespace(op=o, stream=0, waits=(), records=False) for o in ("X", "D0"))
    return types.SimpleNamespace(ops=ops), types.SimpleNamespace(mode="full+l2:D0=0.5", launches=launches, joins=())


def test_seam_enqueue_issues_first_and_joins_last(fake):
    log, streams = fake
    graph, sched = _graph(log)
    out = PX.enqueue(graph, sched, {"a": torch.tensor(1.0)}, streams, l2_stream="S", l2_bulk=True)
    assert out["c"].item() == 4.0
    assert log == [("issue", (("D0", 0.5),), True, "S", True), "X", "D0", ("join", "l2")]


def test_seam_enqueue_joins_when_an_op_raises(fake):
    log, streams = fake
    graph, sched = _graph(log, fail=True)
    with pytest.raises(RuntimeError, match="D0 failed"):
        PX.enqueue(graph, sched, {"a": torch.tensor(1.0)}, streams)
    assert log[-1] == ("join", "l2")


def test_seam_enqueue_on_cpu_issues_nothing(fake):
    log, _ = fake
    graph, sched = _graph(log)
    PX.enqueue(graph, sched, {"a": torch.tensor(1.0)}, [None])
    assert log == ["X", "D0"]
