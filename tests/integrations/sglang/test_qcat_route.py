"""The q_cat route on CPU (qcat_route.py): the prefix executor on the reference namespace hands the DSA backend's
forward_decode one [T, H, 576] q and the latent-KV rows already in the pool; the wrapper takes exactly that hand-off
(and nothing else), and every refusal keeps SGLang's concat + store."""
import logging
import types

import pytest
import torch

import prefix_fakes as F
from glm5_fastpath.integrations.sglang import prefix_executor as PX
from glm5_fastpath.integrations.sglang import qcat_route as QC
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.numerics import assert_equal

CFG = F.small_cfg()
SEQ = [5, 70, 130]
KVL = CFG.kv_lora_rank
BF16 = torch.bfloat16


class FakeDsaBackend:
    """SGLang's DeepseekSparseAttnBackend.forward_decode as far as the route sees it: it records its arguments."""

    dsa_decode_impl = "flashmla_sparse"

    def __init__(self):
        self.calls = []

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                       topk_indices=None, **kw):
        self.calls.append(dict(q=q, k=k, v=v, q_rope=q_rope, k_rope=k_rope, topk=topk_indices, save=save_kv_cache))
        return "attn-out"


@pytest.fixture
def route(monkeypatch):
    """The process route, installed on a fresh fake backend class with GLM5_FASTPATH_QCAT=1; restored after."""
    monkeypatch.setenv(QC.ENV, "1")
    cls = type("FakeDsaBackend", (FakeDsaBackend,), {})
    QC.ROUTE._pending.clear()
    assert QC.install_qcat(backend_cls=cls)
    yield types.SimpleNamespace(route=QC.ROUTE, cls=cls)
    QC.unpatch_qcat(backend_cls=cls)


def qcat_batch(seq=SEQ, impl="flashmla_sparse", pool_dtype=BF16, loc_dtype=torch.int64):
    """make_batch's decode step, with the backend / pool attributes the route checks (bf16 MLA pool per layer)."""
    step, x, fb = F.make_batch(CFG, seq)
    be, pool = fb.attn_backend, fb.token_to_kv_pool
    be.dsa_decode_impl = impl
    pool.dtype = pool.store_dtype = pool_dtype
    pool.kv_buffer = [torch.full((step.kv_cache.shape[0], 1, CFG.kv_cache_dim), -3.0, dtype=BF16) for _ in range(4)]
    pool.get_key_buffer = lambda layer_id: pool.kv_buffer[layer_id]
    fb.out_cache_loc = step.out_cache_loc.to(loc_dtype)
    return step, x, fb


@pytest.mark.parametrize("mode", ["serial", "full"])
def test_prefix_hands_off_one_buffer_and_stores_the_pool(route, mode):
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = qcat_batch()
    ex = PX.PrefixExecutor(impl=P, mode=mode, cfg=CFG)
    q_pe, k_pe, q_lat, k_nope, *_ = ex(a.forward_absorb_prepare, step.positions, x, fb, object())
    # the reference prefix (A0 included) on the adapter's weights, as test_prefix_route does
    w = types.SimpleNamespace(**{**vars(ex.layer_route(a).weights), "input_norm": torch.ones(CFG.hidden_size, dtype=BF16)})
    kv = step.kv_cache.clone()
    ref = P.attention_prefix(step.hidden, step.residual, step.positions, step.out_cache_loc, step.seq_lens,
                             step.block_table, w, CFG, kv, step.index_k_cache.clone())
    assert_equal("q_lat", q_lat, ref.q_lat)
    assert_equal("q_pe", q_pe, ref.q_pe)
    h = route.route._pending[a.layer_id]
    assert h.pool_written and h.q_cat.is_contiguous() and h.q_cat.shape == (3, CFG.num_attention_heads, CFG.kv_cache_dim)
    assert q_lat.data_ptr() == h.q_cat.data_ptr() and q_pe.data_ptr() == h.q_cat.data_ptr() + 2 * KVL
    loc = step.out_cache_loc
    pool = fb.token_to_kv_pool.kv_buffer[a.layer_id][:, 0]
    assert_equal("pool rows", pool[loc], kv[loc])
    others = torch.ones(pool.shape[0], dtype=torch.bool)
    others[loc] = False
    assert (pool[others] == -3.0).all(), "the pool's other rows are untouched"
    assert_equal("k_nope (scratch view, for SGLang's fallback store)", k_nope[:, 0], kv[loc, :KVL])
    assert_equal("k_pe", k_pe[:, 0], kv[loc, KVL:])


def _handed_off(route):
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = qcat_batch()
    out = PX.PrefixExecutor(impl=P, mode="serial", cfg=CFG)(a.forward_absorb_prepare, step.positions, x, fb, object())
    return a, fb, out


def test_forward_decode_takes_the_hand_off_once(route):
    a, fb, (q_pe, k_pe, q_lat, k_nope, *_) = _handed_off(route)
    be, layer = route.cls(), types.SimpleNamespace(layer_id=a.layer_id)
    topk = torch.zeros(3, 4, dtype=torch.int32)
    assert be.forward_decode(q_lat, k_nope, k_nope, layer, fb, q_rope=q_pe, k_rope=k_pe, topk_indices=topk) == "attn-out"
    c = be.calls[-1]
    assert c["q"].shape == (3, CFG.num_attention_heads, CFG.kv_cache_dim) and c["q"].data_ptr() == q_lat.data_ptr()
    assert c["k"] is None and c["v"] is None and c["q_rope"] is None and c["topk"] is topk and c["save"] is True
    assert a.layer_id not in route.route._pending
    # the same views again (SGLang's fallback core calling attn_mqa a second time): its own concat and store
    be.forward_decode(q_lat, k_nope, k_nope, layer, fb, q_rope=q_pe, k_rope=k_pe, topk_indices=topk)
    c = be.calls[-1]
    assert c["q"] is q_lat and c["k"] is k_nope and c["q_rope"] is q_pe


@pytest.mark.parametrize("case", ["other_layer", "copied_q", "copied_rope", "trtllm"])
def test_forward_decode_keeps_sglangs_path_when_not_the_hand_off(route, case):
    a, fb, (q_pe, k_pe, q_lat, k_nope, *_) = _handed_off(route)
    be, layer = route.cls(), types.SimpleNamespace(layer_id=a.layer_id)
    q, rope = q_lat, q_pe
    if case == "other_layer":
        layer = types.SimpleNamespace(layer_id=a.layer_id + 1)
    elif case == "copied_q":
        q = q_lat.contiguous()
    elif case == "copied_rope":
        rope = q_pe.contiguous()
    else:
        be.dsa_decode_impl = "trtllm"
    be.forward_decode(q, k_nope, k_nope, layer, fb, q_rope=rope, k_rope=k_pe)
    c = be.calls[-1]
    assert c["q"] is q and c["k"] is k_nope and c["q_rope"] is rope, "SGLang's concat and store kept"


@pytest.mark.parametrize("change, reason", [
    (dict(impl="trtllm"), "impl"),
    (dict(pool_dtype=torch.float8_e4m3fn), "pool"),
    (dict(loc_dtype=torch.int32), "loc"),
])
def test_pool_target_refusals_keep_the_split_outputs(route, change, reason, caplog):
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = qcat_batch(**change)
    assert route.route.pool_target(a.layer_id, fb, CFG.kv_cache_dim) == reason
    q_pe, _, q_lat, *_ = PX.PrefixExecutor(impl=P, mode="serial", cfg=CFG)(a.forward_absorb_prepare, step.positions,
                                                                           x, fb, object())
    assert a.layer_id not in route.route._pending
    assert q_lat.data_ptr() + 2 * KVL != q_pe.data_ptr(), "the split outputs, not one buffer"
    assert (fb.token_to_kv_pool.kv_buffer[a.layer_id] == -3.0).all(), "no pool store without the hand-off"


def test_hisparse_kpool_off_and_not_installed(route, monkeypatch):
    step, x, fb = qcat_batch()
    fb.attn_backend.hisparse_coordinator = object()
    assert route.route.pool_target(1, fb, CFG.kv_cache_dim) == "hisparse"
    fb.attn_backend.hisparse_coordinator = None
    fb.attn_backend.dsa_index_kpool = 2
    assert route.route.pool_target(1, fb, CFG.kv_cache_dim) == "kpool"
    fb.attn_backend.dsa_index_kpool = 1
    assert not isinstance(route.route.pool_target(1, fb, CFG.kv_cache_dim), str)
    route.route.installed = False
    assert route.route.pool_target(1, fb, CFG.kv_cache_dim) == "not_installed"
    route.route.installed = True
    monkeypatch.setenv(QC.ENV, "0")
    assert route.route.pool_target(1, fb, CFG.kv_cache_dim) == "off"


def test_install_is_opt_in_and_idempotent(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="glm5_fastpath")
    cls = type("B", (FakeDsaBackend,), {})
    r = QC.QcatRoute()
    monkeypatch.delenv(QC.ENV, raising=False)
    assert not QC.install_qcat(backend_cls=cls, route=r) and not r.installed
    assert cls.forward_decode is FakeDsaBackend.forward_decode
    monkeypatch.setenv(QC.ENV, "1")
    assert QC.install_qcat(backend_cls=cls, route=r) and r.installed
    wrapped = cls.forward_decode
    assert QC.install_qcat(backend_cls=cls, route=r) and cls.forward_decode is wrapped
    assert QC.unpatch_qcat(backend_cls=cls, route=r) and cls.forward_decode is FakeDsaBackend.forward_decode
    assert not QC.install_qcat(backend_cls=type("NoDecode", (), {}), route=r)
    assert "not found in this SGLang" in caplog.text


def test_installed_sglangs_forward_decode_has_what_the_route_relies_on():
    """On the installed SGLang (CI: 0.5.23, CPU-only; the H200 runs 0.5.14): forward_decode's signature, its store
    only when k is given, and its zero-copy view of a q passed with q_rope=None."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(QC.BACKEND_MODULE) if importlib.util.find_spec("sglang") else None
    if spec is None or spec.origin is None:
        pytest.skip(f"{QC.BACKEND_MODULE} not installed")
    src = Path(spec.origin).read_text(errors="replace")
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == QC.BACKEND_CLASS)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == QC.METHOD)
    names = [a.arg for a in fn.args.args]
    assert tuple(names[:len(QC.SIGNATURE)]) == QC.SIGNATURE and "q_rope" in names, names
    body = ast.get_source_segment(src, fn)
    assert "if k is not None:" in body and "set_mla_kv_buffer" in body
    assert "q.contiguous().view(" in body and "if q_rope is not None:" in body


def test_install_refuses_another_signature(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="glm5_fastpath")
    monkeypatch.setenv(QC.ENV, "1")

    class Other:
        def forward_decode(self, q, layer, forward_batch, **kw):
            return None

    r = QC.QcatRoute()
    assert not QC.install_qcat(backend_cls=Other, route=r) and not r.installed
    assert "another signature" in caplog.text
