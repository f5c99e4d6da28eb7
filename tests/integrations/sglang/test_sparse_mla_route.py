"""The sparse-MLA route (integrations/sglang/attn_core.py) on CPU: on-by-default switch, the class-level wrap of the DSA
backend's _forward_flashmla_sparse, which calls reach our op and which stay on FlashMLA (each reason logged once,
counted), precompile failure, unpatch. The op itself is a recorder here (its numerics: tests/ops/test_sparse_mla.py
on a GPU)."""
import logging
import types

import pytest
import torch
from prometheus_client import CollectorRegistry

import glm5_fastpath.ops as ops_pkg
from glm5_fastpath.integrations.sglang import attn_core as AC
from glm5_fastpath.metrics import FastpathMetrics

BF16 = torch.bfloat16


class Backend:  # the shape of sglang's DeepseekSparseAttnBackend as far as the seam goes
    def _forward_flashmla_sparse(self, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, topk_length=None,
                                 attn_sink=None):
        return ("flashmla", q_all.shape[0])


@pytest.fixture
def op(monkeypatch):
    calls = []

    def sparse_mla_decode(q, kv, idx, scale, d_v, num_splits=None, stages=None, kernel=None):
        calls.append((q, kv, idx, scale, d_v))
        splits.append(num_splits)
        used_stages.append(stages)
        tiles.append(kernel)
        return torch.zeros(q.shape[0], q.shape[1], d_v, dtype=BF16)

    from glm5_fastpath.ops import sparse_mla as real  # its input checks and split tables are the real ones

    splits: list = []
    used_stages: list = []
    tiles: list = []
    fake = types.SimpleNamespace(sparse_mla_decode=sparse_mla_decode, unsupported=real.unsupported,
                                 parse_split_table=real.parse_split_table, splits_for=real.splits_for,
                                 STAGE_CHOICES=real.STAGE_CHOICES, DEFAULT_STAGES=real.DEFAULT_STAGES,
                                 precompile=lambda device=None, stages=(2,): calls.append("pre"), splits=splits,
                                 used_stages=used_stages, tiles=tiles, resolve_kernel=real.resolve_kernel,
                                 KERNEL_CHOICES=real.KERNEL_CHOICES)
    monkeypatch.setattr(ops_pkg, "sparse_mla", fake, raising=False)
    monkeypatch.delenv(AC.ENV, raising=False)  # on by default
    monkeypatch.delenv(AC.ENV_MAX_TOKENS, raising=False)
    monkeypatch.delenv(AC.ENV_SPLITS, raising=False)
    monkeypatch.delenv(AC.ENV_STAGES, raising=False)
    monkeypatch.delenv(AC.ENV_CHECK, raising=False)
    monkeypatch.delenv(AC.ENV_TILE, raising=False)
    cls = type("Backend", (Backend,), {})  # a fresh class per test: the wrap is class-level
    return calls, cls


def args(t=2, h=64, k=2048, d=576):
    q = torch.randn(t, h, d).to(BF16)
    kv = torch.randn(100, 1, d).to(BF16)
    idx = torch.full((t, k), -1, dtype=torch.int32)
    idx[:, :5] = torch.arange(5, dtype=torch.int32)
    return q, kv, 512, idx, 0.1


def install(cls, reg=None, **kw):
    return AC.install_sparse_mla(FastpathMetrics(reg) if reg else None, backend_cls=cls, devices=("cpu",), **kw)


@pytest.mark.parametrize("value", ["sglang", "off", "0", "FlashMLA"])
def test_switched_off_keeps_flashmla(monkeypatch, op, value):
    calls, cls = op
    assert AC.enabled()  # on by default
    monkeypatch.setenv(AC.ENV, value)
    assert not AC.enabled() and not install(cls)
    assert cls._forward_flashmla_sparse is Backend._forward_flashmla_sparse and calls == []


def test_tuned_split_table_from_env(op, monkeypatch, caplog):
    """GLM5_FASTPATH_SPARSE_MLA_SPLITS picks num_splits per T (largest entry <= T); T below every entry and an
    unparsable table leave the op's heuristic (None), the latter logged."""
    calls, cls = op
    monkeypatch.setenv(AC.ENV_TILE, "mma")  # the table times the mma tile
    monkeypatch.setenv(AC.ENV_SPLITS, "2:16,8:32")
    install(cls)
    for t in (1, 2, 3, 8):
        cls()._forward_flashmla_sparse(*args(t=t))
    assert ops_pkg.sparse_mla.splits == [None, 16, 16, 32]
    cls2 = type("Backend2", (Backend,), {})
    monkeypatch.setenv(AC.ENV_SPLITS, "2:99")
    caplog.set_level(logging.INFO, "glm5_fastpath")
    install(cls2)
    cls2()._forward_flashmla_sparse(*args(t=2))
    assert ops_pkg.sparse_mla.splits[-1] is None and "GLM5_FASTPATH_SPARSE_MLA_SPLITS ignored" in caplog.text


def test_small_calls_reach_our_kernel_and_are_counted(op, caplog):
    calls, cls = op
    reg = CollectorRegistry()
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert install(cls, reg) and calls == ["pre"]  # compiled at install, before any capture
    q, kv, dv, idx, sc = args(t=3)
    out = cls()._forward_flashmla_sparse(q_all=q, kv_cache=kv, v_head_dim=dv, page_table_1=idx, sm_scale=sc)
    assert out.shape == (3, 64, 512)
    cq, ckv, cidx, cscale, cdv = calls[-1]
    assert cq is q and ckv is kv and cidx is idx and (cscale, cdv) == (0.1, 512)
    cls()._forward_flashmla_sparse(q, kv, dv, idx, sc, None, None)  # 0.5.23's extra arguments, unset
    assert reg.get_sample_value("glm5_fastpath_sparse_mla_total", {"route": "ours", "reason": "routed"}) == 2
    assert "sparse MLA -> ours" in caplog.text and f"for <= {AC.DEFAULT_MAX_TOKENS} tokens" in caplog.text
    assert install(cls)  # idempotent: the class keeps one wrapper
    assert getattr(cls._forward_flashmla_sparse, AC.ORIGINAL_ATTR) is Backend._forward_flashmla_sparse


@pytest.mark.parametrize("mutate, reason", [
    (lambda a: (torch.randn(AC.DEFAULT_MAX_TOKENS + 1, 64, 576).to(BF16),) + a[1:3]
     + (torch.zeros(AC.DEFAULT_MAX_TOKENS + 1, 8, dtype=torch.int32),) + a[4:], "tokens"),
    (lambda a: (a[0].float(),) + a[1:], "layout"),
    (lambda a: a[:3] + (a[3].long(),) + a[4:], "layout"),
    (lambda a: a[:3] + (torch.zeros(2, 4096, dtype=torch.int32),) + a[4:], "layout"),
    (lambda a: (a[0][:, :8],) + a[1:], "layout"),  # 8 heads: not a multiple of 16
    (lambda a: a[:2] + (448,) + a[3:], "layout"),  # d_v + 64 != head dim
    (lambda a: a[:1] + (a[1].float(),) + a[2:], "layout"),
])
def test_calls_our_kernel_does_not_take_stay_on_flashmla(op, mutate, reason, caplog):
    calls, cls = op
    reg = CollectorRegistry()
    install(cls, reg)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    a = mutate(args())
    for _ in range(2):
        assert cls()._forward_flashmla_sparse(*a) == ("flashmla", a[0].shape[0])
    assert calls == ["pre"]
    assert reg.get_sample_value("glm5_fastpath_sparse_mla_total", {"route": "stock", "reason": reason}) == 2
    assert caplog.text.count(f"sparse MLA -> FlashMLA ({AC.REASONS[reason]})") == 1


def test_sink_or_topk_length_stay_on_flashmla(op):
    calls, cls = op
    install(cls)
    q, kv, dv, idx, sc = args()
    assert cls()._forward_flashmla_sparse(q, kv, dv, idx, sc, topk_length=torch.ones(2)) == ("flashmla", 2)
    assert cls()._forward_flashmla_sparse(q, kv, dv, idx, sc, None, torch.zeros(64)) == ("flashmla", 2)


def test_token_limit_from_env(op, monkeypatch):
    calls, cls = op
    monkeypatch.setenv(AC.ENV_MAX_TOKENS, "4")
    install(cls)
    q, kv, dv, idx, sc = args(t=5)
    assert cls()._forward_flashmla_sparse(q, kv, dv, idx, sc) == ("flashmla", 5)
    q, kv, dv, idx, sc = args(t=4)
    assert cls()._forward_flashmla_sparse(q, kv, dv, idx, sc).shape == (4, 64, 512)


def test_kernel_error_falls_back_once_loudly(op, monkeypatch, caplog):
    calls, cls = op

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(ops_pkg.sparse_mla, "sparse_mla_decode", boom)
    reg = CollectorRegistry()
    install(cls, reg)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    for _ in range(2):
        assert cls()._forward_flashmla_sparse(*args()) == ("flashmla", 2)
    assert caplog.text.count("sparse MLA kernel raised RuntimeError: kaput") == 1
    assert reg.get_sample_value("glm5_fastpath_sparse_mla_total", {"route": "stock", "reason": "error"}) == 2


def test_precompile_failure_leaves_flashmla(op, monkeypatch, caplog):
    calls, cls = op

    def boom(device=None, stages=(2,)):
        raise RuntimeError("no nvcc")

    monkeypatch.setattr(ops_pkg.sparse_mla, "precompile", boom)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert not install(cls)
    assert cls._forward_flashmla_sparse is Backend._forward_flashmla_sparse
    assert "sparse MLA kernel unavailable (RuntimeError: no nvcc); FlashMLA stays" in caplog.text


def test_unpatch_and_missing_backend(op, caplog):
    calls, cls = op
    install(cls)
    assert AC.unpatch_sparse_mla(cls) and cls._forward_flashmla_sparse is Backend._forward_flashmla_sparse
    assert not AC.unpatch_sparse_mla(cls)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert not install(type("Other", (), {}))
    assert "not found in this SGLang; FlashMLA stays" in caplog.text


def test_real_sglang_backend_has_the_seam():
    """The seam exists with this signature in the installed SGLang (0.5.23 in CI), checked in a fresh interpreter
    as test_sglang_real does (importing SGLang's attention backends patches nothing, but pulls in a lot)."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang not installed")
    from test_sglang_real import _run

    out = _run(f"""
import inspect
from {AC.BACKEND_MODULE} import {AC.BACKEND_CLASS} as B
print(list(inspect.signature(B.{AC.METHOD}).parameters))
""")
    params = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's printed list
    assert params[:6] == ["self", "q_all", "kv_cache", "v_head_dim", "page_table_1", "sm_scale"]


def test_stages_from_env(op, monkeypatch, caplog):
    """GLM5_FASTPATH_SPARSE_MLA_STAGES picks the split kernel's build; unset -> the default; a bad value is
    logged and the default kept."""
    calls, cls = op
    install(cls)
    cls()._forward_flashmla_sparse(*args(t=1))
    monkeypatch.setenv(AC.ENV_STAGES, "5")
    cls5 = type("Backend5", (Backend,), {})
    install(cls5)
    cls5()._forward_flashmla_sparse(*args(t=1))
    monkeypatch.setenv(AC.ENV_STAGES, "7")
    caplog.set_level(logging.INFO, "glm5_fastpath")
    cls7 = type("Backend7", (Backend,), {})
    install(cls7)
    cls7()._forward_flashmla_sparse(*args(t=1))
    assert ops_pkg.sparse_mla.used_stages == [2, 5, 2]
    assert "GLM5_FASTPATH_SPARSE_MLA_STAGES='7' ignored" in caplog.text


def test_tuned_split_table_is_ignored_for_the_deep_ring(op, monkeypatch, caplog):
    """A split table is tuned on the default build; with GLM5_FASTPATH_SPARSE_MLA_STAGES=5 (one CTA per SM)
    the op's own plan decides, and the bad pairing is logged once at install."""
    calls, cls = op
    monkeypatch.setenv(AC.ENV_TILE, "mma")
    monkeypatch.setenv(AC.ENV_SPLITS, "1:16,8:8")
    monkeypatch.setenv(AC.ENV_STAGES, "5")
    caplog.set_level(logging.INFO, "glm5_fastpath")
    install(cls)
    cls()._forward_flashmla_sparse(*args(t=8))
    assert ops_pkg.sparse_mla.splits[-1] is None and ops_pkg.sparse_mla.used_stages[-1] == 5
    assert caplog.text.count("GLM5_FASTPATH_SPARSE_MLA_SPLITS ignored with GLM5_FASTPATH_SPARSE_MLA_STAGES=5") == 1


def test_check_mode_compares_the_first_n_calls_with_flashmla(op, monkeypatch, caplog):
    """GLM5_FASTPATH_SPARSE_MLA_CHECK=N: the first N routed calls also run the original (FlashMLA) on the same
    inputs and log ours-vs-FlashMLA numbers; ours is still what the call returns; later calls run ours only."""
    calls, cls = op
    seen = []

    class Ref(Backend):
        def _forward_flashmla_sparse(self, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *a, **k):
            seen.append(q_all.shape[0])
            return torch.full((q_all.shape[0], q_all.shape[1], v_head_dim), 2.0, dtype=BF16)

    cls = type("BackendChk", (Ref,), {})
    monkeypatch.setenv(AC.ENV_CHECK, "2")
    caplog.set_level(logging.WARNING, "glm5_fastpath")
    install(cls)
    route = cls._forward_flashmla_sparse.__glm5_fastpath_route__
    outs = [cls()._forward_flashmla_sparse(*args(t=t)) for t in (1, 3, 2)]
    assert all(bool((o == 0).all()) for o in outs)  # ours (the recorder's zeros) is returned
    assert seen == [1, 3] and len(route.checks) == 2
    c = route.checks[0]
    assert c["T"] == 1 and c["rel_l2"] == pytest.approx(1.0) and c["max_abs"] == 2.0 and c["finite"]
    assert c["passed"] is False and '"passed": false' in caplog.text  # JSON lines; 100 % off fails
    assert c["invalid_slots"] == pytest.approx(1 - 5 / 2048)
    assert caplog.text.count("sparse MLA check vs FlashMLA") == 2


def test_check_count_parsing(monkeypatch, caplog):
    monkeypatch.delenv(AC.ENV_CHECK, raising=False)
    assert AC.check_count() == 0
    monkeypatch.setenv(AC.ENV_CHECK, "5")
    assert AC.check_count() == 5
    monkeypatch.setenv(AC.ENV_CHECK, "many")
    with caplog.at_level(logging.WARNING, "glm5_fastpath"):
        assert AC.check_count() == 0
    assert "not a count" in caplog.text


def test_tile_choice(op, monkeypatch, caplog):
    """Default auto: the mma tile at 1 token (with its stages), the wgmma tile from 2 tokens at H % 64 == 0 (no stages
    / split table), mma at H = 32; TILE=mma / wgmma pin one; a bad value is logged and auto kept. The token limit
    follows the tile (32, or 16 with mma)."""
    calls, cls = op
    install(cls)
    for t, h in ((1, 64), (2, 64), (32, 64), (4, 32)):
        cls()._forward_flashmla_sparse(*args(t=t, h=h))
    fake = ops_pkg.sparse_mla
    assert fake.tiles == ["mma", "wgmma", "wgmma", "mma"] and fake.used_stages == [2, None, None, 2]
    assert cls()._forward_flashmla_sparse(*args(t=33)) == ("flashmla", 33) and AC.max_tokens() == 32
    monkeypatch.setenv(AC.ENV_TILE, "mma")
    assert AC.tile() == "mma" and AC.max_tokens("mma") == 16
    cls2 = type("Backend2", (Backend,), {})
    install(cls2)
    cls2()._forward_flashmla_sparse(*args(t=8))
    assert fake.tiles[-1] == "mma"
    assert cls2()._forward_flashmla_sparse(*args(t=17)) == ("flashmla", 17)
    monkeypatch.setenv(AC.ENV_TILE, "wgmma_pp")  # the opt-in tile reaches the op as such, never silently mma
    cls3 = type("Backend3", (Backend,), {})
    install(cls3)
    cls3()._forward_flashmla_sparse(*args(t=8))
    assert fake.tiles[-1] == "wgmma_pp" and fake.used_stages[-1] is None
    monkeypatch.setenv(AC.ENV_TILE, "tensor")
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert AC.tile() == "auto" and "GLM5_FASTPATH_SPARSE_MLA_TILE='tensor' ignored" in caplog.text
