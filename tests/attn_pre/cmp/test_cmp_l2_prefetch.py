"""The `l2:OP=F` modifier (modes.py): parsing and validation, the selection table's grammar, which tensors the
executor prefetches (executor.l2_prefetch_names / l2_prefetch_tensors), how issue_l2_prefetch forks, chunks and
joins (fake streams: no GPU here), and that CPU runs are unchanged by it."""
import contextlib
import types

import pytest
import torch

from glm5_fastpath.attn_pre.cmp import MODES, get_mode
from glm5_fastpath.attn_pre.cmp import executor as X
from glm5_fastpath.attn_pre.cmp.executor import CmpError, CmpExecutor
from glm5_fastpath.attn_pre.cmp.modes import Mode
from glm5_fastpath.config import small_config
from glm5_fastpath.graph import build_prefix_graph
from glm5_fastpath.graph.prefix_graph import weight_tensors
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.weights import random_layer

CFG = small_config()
GRAPH = build_prefix_graph(CFG)
D0_W = ["w.q_b.weight", "w.q_b.scale_inv"]
D1_W = ["w.indexer.wq_b.weight", "w.indexer.wq_b.scale_inv"]


# ---- parsing / validation ----------------------------------------------------------------------------------

def test_parse():
    m = get_mode("full+l2:D0=0.5")
    assert m.l2_prefetch == (("D0", 0.5),)
    base = MODES["full"]
    assert (m.multistream, m.pdl, m.wait_point, m.pins) == (base.multistream, base.pdl, base.wait_point, ())
    m = get_mode("full+l2:D1=1+l2:D0=.25+pin:D1=0")
    assert m.l2_prefetch == (("D1", 1.0), ("D0", 0.25)) and m.pins == (("D1", 0),)
    assert get_mode("serial+l2:D0=1.").l2_prefetch == (("D0", 1.0),)
    assert MODES["full"].l2_prefetch == ()


@pytest.mark.parametrize("bad", ["full+l2:D0=0", "full+l2:D0=1.5", "full+l2:D0=x", "full+l2:D0", "full+l2:D0=",
                                 "full+l2:=0.5", "full+l2:d0=0.5", "full+l2:D0=-0.5", "full+l2:D0=1e-3",
                                 "full+l2:D0=nan", "full+l2:D0=0.0", "full+l2:D0=0.5+l2:D0=1"])
def test_bad_fractions_and_syntax_raise(bad):
    with pytest.raises(ValueError, match="CMP mode"):
        get_mode(bad)


def test_field_check_names_the_mode():
    for f in (0, 0.0, 1.5, -1, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match=r"CMP mode x: l2 D0=.* must be a fraction in \(0, 1\]"):
            Mode("x", True, True, "after_prefetch", l2_prefetch=(("D0", f),))
    with pytest.raises(ValueError, match="more than once"):
        Mode("x", True, True, "after_prefetch", l2_prefetch=(("D0", 0.5), ("D0", 1.0)))
    Mode("x", True, True, "after_prefetch", l2_prefetch=(("D0", 1), ("D1", 1e-3)))


def test_modifier_lists_name_l2():
    with pytest.raises(ValueError, match=r"l2:OP=F"):
        get_mode("full+sideways:D0")
    with pytest.raises(ValueError, match=r"l2:OP=F"):
        get_mode("fast+l2:D0=1")


def test_for_ops_checks_and_drops_l2_ops():
    m = get_mode("full+l2:D1=1+l2:D0=0.5")
    assert m.for_ops(GRAPH.topo_order()) is m
    shared = m.for_ops(["A0", "B0", "D0", "D2"])  # a GLM-5.2 shared layer has no D1
    assert shared.l2_prefetch == (("D0", 0.5),) and shared.name == m.name
    with pytest.raises(ValueError, match="not prefix ops"):
        get_mode("full+l2:Q9=1").for_ops(GRAPH.topo_order())


@pytest.mark.parametrize("mode", ["full+l2:D0=0.5", "full+l2:D1=1+l2:D0=0.5", "serial+l2:B0=.25", "full+l2:D0=1.000",
                                  "full+pin:D1=0+l2:D0=0.05"])
def test_selection_accepts_what_get_mode_parses(mode):
    from glm5_fastpath.selection import valid_cmp_mode

    assert valid_cmp_mode(mode)
    assert get_mode(mode).name == mode


@pytest.mark.parametrize("bad", ["full+l2:D0=0", "full+l2:D0=1.5", "full+l2:D0=x", "full+l2:D0", "full+l2:D0=0.0",
                                 "full+l2:D0=10", "full+l2:D0=1e-3", "full+l2:D0=-0.5"])
def test_selection_rejects_what_get_mode_rejects(bad):
    from glm5_fastpath import selection

    assert not selection.valid_cmp_mode(bad)
    with pytest.raises(ValueError):
        get_mode(bad)
    table = {"version": 1, "buckets": [{"tokens": 4, "prefix": "cmp", "moe": "stock", "cmp_mode": bad}]}
    with pytest.raises(selection.SelectionError, match="l2:OP=F"):
        selection.parse(table)


def test_bench_and_tune_accept_the_modifier():
    from glm5_fastpath import tune
    from glm5_fastpath.attn_pre.cmp.bench import check_modes

    check_modes(["full+l2:D0=0.5", "full+l2:D1=1+l2:D0=0.5"])
    with pytest.raises(ValueError, match="unknown mode"):
        check_modes(["full+l2:D0=2"])
    assert tune.tune_modes("full,full+l2:D0=0.5") == ("full", "full+l2:D0=0.5")


# ---- which tensors ---------------------------------------------------------------------------------------

def test_names_are_the_ops_2d_weights_and_scales():
    assert X.l2_prefetch_names(get_mode("full+l2:D0=0.5"), GRAPH) == [(t, 0.5) for t in D0_W]
    assert X.l2_prefetch_names(get_mode("full+l2:D1=1+l2:D0=0.5"), GRAPH) == \
        [(t, 1.0) for t in D1_W] + [(t, 0.5) for t in D0_W]
    # B0: the GEMM weight and scales, not the 1-D norm weights
    assert X.l2_prefetch_names(get_mode("full+l2:B0=1"), GRAPH) == \
        [("w.qkv_a.weight", 1.0), ("w.qkv_a.scale_inv", 1.0)]
    assert X.l2_prefetch_names(MODES["full"], GRAPH) == []
    shared = build_prefix_graph(CFG, full_indexer=False)
    assert X.l2_prefetch_names(get_mode("full+l2:D1=1+l2:D0=0.5"), shared) == [(t, 0.5) for t in D0_W]
    for op in ("E2", "A0"):  # no 2-D weight: the modifier would do nothing
        with pytest.raises(ValueError, match=f"l2:{op} names an op with no 2-D weights"):
            X.l2_prefetch_names(get_mode(f"full+l2:{op}=1"), GRAPH)


def test_tensors_resolve_in_the_env():
    w = random_layer(CFG, 1, seed=0).attn
    env = weight_tensors(w)
    got = X.l2_prefetch_tensors(get_mode("full+l2:D1=1+l2:D0=0.5"), GRAPH, env)
    assert [(id(t), f) for t, f in got] == [(id(env[n]), 1.0) for n in D1_W] + [(id(env[n]), 0.5) for n in D0_W]
    assert all(t.dim() == 2 for t, _ in got)
    env.pop("w.q_b.scale_inv")
    assert [f for _, f in X.l2_prefetch_tensors(get_mode("full+l2:D0=0.5"), GRAPH, env)] == [0.5]


# ---- issue / join (fake streams) ----------------------------------------------------------------------------

class _Stream:
    def __init__(self, name, log):
        self.name, self.log, self.device = name, log, "cuda:0"

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


def _cuda_like(t):
    """A tensor stand-in that says it is on CUDA (issue_l2_prefetch only reads .is_cuda; the op is faked)."""
    return types.SimpleNamespace(is_cuda=True, t=t)


@pytest.fixture
def fake_cuda(monkeypatch):
    from glm5_fastpath.ops import prefetch

    log = []
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext(log.append(("on", s.name))))
    monkeypatch.setattr(prefetch, "l2_prefetch", lambda ts, fs, pdl, bulk: log.append(
        ("l2_prefetch", [t.t for t in ts], list(fs), pdl, bulk)))
    return log


def test_issue_forks_chunks_by_max_ranges_and_joins(fake_cuda):
    log = fake_cuda
    env = {n: _cuda_like(n) for n in GRAPH.tensors if n.startswith("w.")}
    main, side = _Stream("main", log), _Stream("side", log)
    mode = get_mode("full+l2:B0=1+l2:D1=1+l2:D0=0.5")  # 6 tensors: two launches (MAX_RANGES = 4)
    assert X.issue_l2_prefetch(mode, GRAPH, env, main, side, bulk=True) is side
    assert log == [("wait", "side", "main"), ("on", "side"),
                   ("l2_prefetch", ["w.qkv_a.weight", "w.qkv_a.scale_inv"] + D1_W, [1.0] * 4, False, True),
                   ("l2_prefetch", D0_W, [0.5, 0.5], False, True)]
    log.clear()
    X.join_l2_prefetch(main, side)
    assert log == [("wait", "main", "side")]
    log.clear()
    X.join_l2_prefetch(main, None)
    assert X.issue_l2_prefetch(MODES["full"], GRAPH, env, main, side) is None  # no modifier
    assert X.issue_l2_prefetch(mode, GRAPH, env, None, side) is None  # no CUDA stream (CPU)
    cpu = {n: torch.zeros(1) for n in env}
    assert X.issue_l2_prefetch(mode, GRAPH, cpu, main, side) is None  # CPU tensors
    assert log == []


def test_issue_joins_back_when_the_launch_raises(fake_cuda, monkeypatch):
    from glm5_fastpath.ops import prefetch

    log = fake_cuda

    def boom(*a, **k):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(prefetch, "l2_prefetch", boom)
    env = {n: _cuda_like(n) for n in GRAPH.tensors if n.startswith("w.")}
    main, side = _Stream("main", log), _Stream("side", log)
    with pytest.raises(RuntimeError, match="no kernel"):
        X.issue_l2_prefetch(get_mode("full+l2:D0=1"), GRAPH, env, main, side)
    assert log[0] == ("wait", "side", "main") and log[-1] == ("wait", "main", "side")


def test_bulk_flag_from_env(monkeypatch):
    monkeypatch.delenv(X.ENV_L2_BULK, raising=False)
    assert X.l2_bulk_from_env() is False
    monkeypatch.setenv(X.ENV_L2_BULK, "1")
    assert X.l2_bulk_from_env() is True
    monkeypatch.setenv(X.ENV_L2_BULK, "0")
    assert X.l2_bulk_from_env() is False


# ---- the executor on CPU -----------------------------------------------------------------------------------

def _executor(mode, layer, s, pad_page):
    return CmpExecutor(CFG, layer, "cpu", buckets=(4,), mode=mode, impl=P, kv_cache=s.kv_cache,
                       index_k_cache=s.index_k_cache, max_pages=s.block_table.shape[1], pad_slot=pad_page * 64)


def _step():
    s = make_decode_step(CFG, [70, 130, 5], seed=1, spare_pages=2)
    used = set(s.block_table[s.block_table >= 0].tolist())
    return s, min(set(range(s.index_k_cache.shape[0])) - used)


def test_executor_cpu_outputs_unchanged_and_schedule_unchanged(monkeypatch):
    monkeypatch.setenv(X.ENV_L2_BULK, "1")
    layer = random_layer(CFG, 1, seed=3)
    outs, schedules = [], []
    for mode in ("full", "full+l2:D1=1+l2:D0=0.5"):
        s, pad = _step()
        ex = _executor(mode, layer, s, pad)
        schedules.append(ex.schedule.launches)
        out = ex.run(hidden=s.hidden, residual=s.residual, positions=s.positions, out_cache_loc=s.out_cache_loc,
                     seq_lens=s.seq_lens, block_table=s.block_table, all_tensors=True)
        outs.append(({k: v.clone() for k, v in out.items()}, s.kv_cache.clone(), s.index_k_cache.clone()))
    assert ex.l2_bulk is True and ex.l2_names == [(t, 1.0) for t in D1_W] + [(t, 0.5) for t in D0_W]
    assert ex._l2_stream is None  # CPU: nothing issued
    assert schedules[0] == schedules[1]  # the prefetch stream is not one of the schedule's
    (a, kva, ika), (b, kvb, ikb) = outs
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(kva, kvb) and torch.equal(ika, ikb)


def test_executor_l2_on_shared_layer_and_errors():
    cfg = small_config(index_topk_freq=2)
    layer = next(l for l in range(1, cfg.num_hidden_layers) if not cfg.is_full_indexer_layer(l))
    w = random_layer(cfg, layer, seed=0)
    s = make_decode_step(cfg, [40, 90, 7], seed=0, spare_pages=2)
    kw = dict(buckets=(4,), impl=P, kv_cache=s.kv_cache, max_pages=s.block_table.shape[1], pad_slot=0)
    ex = CmpExecutor(cfg, w, "cpu", mode="full+l2:D1=1+l2:D0=0.5", **kw)  # D1: not in this layer, dropped
    assert ex.mode.l2_prefetch == (("D0", 0.5),) and ex.l2_names == [(t, 0.5) for t in D0_W]
    with pytest.raises(CmpError, match="not prefix ops"):
        CmpExecutor(cfg, w, "cpu", mode="full+l2:Q9=1", **kw)
    with pytest.raises(CmpError, match="no 2-D weights"):
        CmpExecutor(cfg, w, "cpu", mode="full+l2:A0=1", **kw)  # A0: only a 1-D norm weight


# ---- on the H200 ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("bulk", ["0", "1"])
def test_gpu_l2_modes_equal_full_bitwise(monkeypatch, bulk):
    """Captured graphs with the prefetch stream (line and bulk forms) replay the bits of `full`; a prefetch is a
    hint. The capture would fail if the prefetch stream were left unjoined."""
    from glm5_fastpath.config import Glm5Config

    monkeypatch.setenv(X.ENV_L2_BULK, bulk)
    cfg = Glm5Config.preset("glm5")
    layer = random_layer(cfg, 3, seed=11, device="cuda")
    s = make_decode_step(cfg, [257 + (i * 523) % 3000 for i in range(16)], seed=5, device="cuda", spare_pages=2)
    used = set(s.block_table[s.block_table >= 0].tolist())
    pad = min(set(range(s.index_k_cache.shape[0])) - used)
    outs = {}
    for mode in ("full", "full+l2:D1=1+l2:D0=0.5", "serial+l2:D0=1+l2:B0=0.25+l2:D1=1"):
        kv, ik = s.kv_cache.clone(), s.index_k_cache.clone()
        ex = CmpExecutor(cfg, layer, "cuda", buckets=(1, 16), mode=mode, kv_cache=kv, index_k_cache=ik,
                         max_pages=s.block_table.shape[1], pad_slot=pad * 64)
        assert ex.l2_bulk is (bulk == "1")
        for m in (1, 16):
            r = {"hidden": s.hidden[:m], "residual": s.residual[:m], "positions": s.positions[:m],
                 "out_cache_loc": s.out_cache_loc[:m], "seq_lens": s.seq_lens[:m], "block_table": s.block_table[:m]}
            for _ in range(2):
                out = ex.run(**r, all_tensors=True)
            torch.cuda.synchronize()
            outs[(mode, m)] = {k: v.clone() for k, v in out.items()}
        if ex.l2_names:
            assert ex._l2_stream is not None and ex.captures == 2
    for (mode, m), o in outs.items():
        for k, v in o.items():
            assert torch.equal(v, outs[("full", m)][k]), (mode, m, k)
