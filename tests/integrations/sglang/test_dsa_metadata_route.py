"""The DSA metadata route on CPU, against a stand-in of SGLang 0.5.14's DeepseekSparseAttnBackend whose
_apply_cuda_graph_metadata is the decode branch of the real one (written out below, with a recording stand-in for
deep_gemm): same buffers bit for bit, the same DeepGEMM schedule call, every fallback reason, the check mode,
install / unpatch and the env switch."""
import ast
import logging
import os
import types
from pathlib import Path

import pytest
import torch

from glm5_fastpath.integrations.sglang import dsa_metadata_route as R
from glm5_fastpath.ops import dsa_metadata as DM


class FakeDeepGemm:
    def __init__(self):
        self.calls = []

    def get_num_sms(self):
        return 132

    def get_paged_mqa_logits_metadata(self, ctx, block, sms):
        self.calls.append((ctx.clone(), block, sms))
        return torch.stack([ctx.view(-1).sum(), torch.tensor(block), torch.tensor(sms)]).to(torch.int32)


class Mode:
    def __init__(self, decode=True):
        self.decode = decode

    def is_decode_or_idle(self):
        return self.decode

    def is_target_verify(self):
        return not self.decode

    def is_draft_extend_v2(self):
        return False


def to_2d(seqlens, bs):
    return seqlens.view(-1, 1)


class Metadata:  # SGLang's DSAMetadata is a frozen dataclass; object.__setattr__ works on this too
    def __init__(self, bs, ctx, ps):
        self.page_size = ps
        self.cache_seqlens_int32 = torch.zeros(bs, dtype=torch.int32)
        self.cu_seqlens_k = torch.zeros(bs + 1, dtype=torch.int32)
        self.page_table_1 = torch.full((bs, ctx), -3, dtype=torch.int32)
        self.dsa_cache_seqlens_int32 = torch.zeros(bs, dtype=torch.int32)
        self.dsa_cu_seqlens_k = torch.zeros(bs + 1, dtype=torch.int32)
        self.real_page_table = torch.full((bs, -(-ctx // ps)), -3, dtype=torch.int32) if ps > 1 else self.page_table_1
        self.paged_mqa_schedule_metadata = None
        self.paged_mqa_ctx_lens_2d = None


def make_backend_cls(dg):
    class Backend:
        def __init__(self, bs_list=(1, 4), ctx=300, ps=64, pool=9, topk=2048, impl="flashmla_sparse"):
            g = torch.Generator().manual_seed(ctx + ps)
            self.req_to_token = torch.randint(0, 1 << 16, (pool, ctx), generator=g, dtype=torch.int32)
            self.decode_cuda_graph_metadata = {b: Metadata(b, ctx, ps) for b in bs_list}
            self.dsa_index_topk, self.real_page_size, self.dsa_decode_impl = topk, ps, impl
            self.speculative_num_draft_tokens = None
            self.prefill_impl_calls = 0
            self.forward_metadata = None

        def set_dsa_prefill_impl(self, forward_batch=None):
            self.prefill_impl_calls += 1

        def _build_paged_mqa_schedule_2d_ctx_lens(self, forward_mode, cache_seqlens_int32, seqlens_expanded, bs):
            return to_2d(cache_seqlens_int32, bs)

        def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                                       out_cache_loc=None, actual_forward_mode=None):
            # sglang 0.5.14 dsa_backend.py, decode branch (the capture / verify branches are not exercised here)
            self.built = getattr(self, "built", 0)
            if bs not in self.decode_cuda_graph_metadata:
                self.built += 1
                return
            self.set_dsa_prefill_impl(forward_batch=None)
            seq_lens, seq_lens_cpu, req_pool_indices = seq_lens[:bs], seq_lens_cpu[:bs], req_pool_indices[:bs]
            metadata = self.decode_cuda_graph_metadata[bs]
            max_len = int(seq_lens_cpu.max().item())
            cache_seqlens = seq_lens.to(torch.int32)
            metadata.cache_seqlens_int32.copy_(cache_seqlens)
            metadata.cu_seqlens_k[1:].copy_(torch.cumsum(cache_seqlens, dim=0, dtype=torch.int32))
            page_indices = self.req_to_token[req_pool_indices, :max_len]
            metadata.page_table_1[:, :max_len].copy_(page_indices)
            dsa_cache_seqlens = cache_seqlens.clamp(max=self.dsa_index_topk)
            metadata.dsa_cache_seqlens_int32.copy_(dsa_cache_seqlens)
            seqlens_expanded = cache_seqlens
            seqlens_32_2d = self._build_paged_mqa_schedule_2d_ctx_lens(forward_mode, metadata.cache_seqlens_int32,
                                                                       seqlens_expanded, bs)
            new_schedule = dg.get_paged_mqa_logits_metadata(seqlens_32_2d, 64, dg.get_num_sms())
            if metadata.paged_mqa_schedule_metadata is None:
                object.__setattr__(metadata, "paged_mqa_schedule_metadata", new_schedule)
            else:
                metadata.paged_mqa_schedule_metadata.copy_(new_schedule)
            if metadata.paged_mqa_ctx_lens_2d is None:
                object.__setattr__(metadata, "paged_mqa_ctx_lens_2d", seqlens_32_2d)
            else:
                metadata.paged_mqa_ctx_lens_2d.copy_(seqlens_32_2d)
            n = seqlens_expanded.shape[0]
            metadata.dsa_cu_seqlens_k[1:1 + n].copy_(torch.cumsum(dsa_cache_seqlens, dim=0, dtype=torch.int32))
            assert self.real_page_size == metadata.page_size
            if self.real_page_size > 1:
                cols = torch.arange(0, max_len, self.real_page_size, dtype=torch.int32)
                real = page_indices[:, cols] // self.real_page_size
                metadata.real_page_table[:real.shape[0], :real.shape[1]].copy_(real)
            self.forward_metadata = metadata

    return Backend


NAMES = ("cache_seqlens_int32", "cu_seqlens_k", "page_table_1", "dsa_cache_seqlens_int32", "dsa_cu_seqlens_k",
         "real_page_table", "paged_mqa_schedule_metadata", "paged_mqa_ctx_lens_2d")


def inputs(bs, pool=9, ctx=300, seed=1):
    g = torch.Generator().manual_seed(seed + bs)
    idx = torch.randperm(pool, generator=g)[:bs].to(torch.int64)
    lens = torch.randint(1, ctx + 1, (bs,), generator=g)
    return idx, lens, lens.clone()


@pytest.fixture
def env():
    dg_ours, dg_ref = FakeDeepGemm(), FakeDeepGemm()
    Ours, Ref = make_backend_cls(dg_ours), make_backend_cls(dg_ref)
    g = {"deep_gemm": dg_ours, "is_cuda": lambda: True}
    return types.SimpleNamespace(dg_ours=dg_ours, dg_ref=dg_ref, Ours=Ours, Ref=Ref, g=g)


def install(env, **kw):
    assert R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False, devices=("cpu",), **kw)
    return env.Ours._apply_cuda_graph_metadata.__glm5_fastpath_route__


@pytest.mark.parametrize("ps", [1, 64])
@pytest.mark.parametrize("bs", [1, 4])
def test_route_writes_sglangs_buffers(env, monkeypatch, bs, ps):
    monkeypatch.setenv(R.ENV, "1")
    route = install(env)
    ours, ref = env.Ours(ps=ps), env.Ref(ps=ps)
    for step in range(3):  # the second call copies into the schedule buffers SGLang created on the first
        idx, lens, lens_cpu = inputs(bs, seed=step)
        ours._apply_cuda_graph_metadata(bs, idx, lens, lens_cpu, Mode(), None)
        ref._apply_cuda_graph_metadata(bs, idx, lens, lens_cpu, Mode(), None)
        mo, mr = ours.decode_cuda_graph_metadata[bs], ref.decode_cuda_graph_metadata[bs]
        for n in NAMES:
            assert torch.equal(getattr(mo, n), getattr(mr, n)), (n, step)
        assert ours.forward_metadata is mo and ours.prefill_impl_calls == step + 1
        assert len(env.dg_ours.calls) == step + 1 and torch.equal(env.dg_ours.calls[-1][0], env.dg_ref.calls[-1][0])
    assert route.routed_bs == {bs}
    R.unpatch_dsa_metadata(env.Ours)


def test_fallbacks_by_reason(env, monkeypatch, caplog):
    monkeypatch.setenv(R.ENV, "1")
    route = install(env)
    ours = env.Ours(bs_list=(4,))
    idx, lens, lens_cpu = inputs(2)
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        ours._apply_cuda_graph_metadata(2, idx, lens, lens_cpu, Mode(), None)  # bs 2 not captured: SGLang builds
        assert ours.built == 1
        idx, lens, lens_cpu = inputs(4)
        ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(decode=False), None)
        kv = env.Ours(bs_list=(4,), impl="flashmla_kv")
        kv._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
        bad = env.Ours(bs_list=(4,))
        bad.decode_cuda_graph_metadata[4].page_size = 32
        with pytest.raises(AssertionError):  # SGLang's own assert, as without the route
            bad._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
        odd = env.Ours(bs_list=(4,))
        odd.decode_cuda_graph_metadata[4].cu_seqlens_k = odd.decode_cuda_graph_metadata[4].cu_seqlens_k.long()
        odd._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)  # our op refuses int64: SGLang's code
        assert odd.decode_cuda_graph_metadata[4].cu_seqlens_k[1:].tolist() == torch.cumsum(lens, 0).tolist()
    for reason in ("capture", "mode", "impl", "page_size", "buffers"):
        assert any(f"-> SGLang ({R.REASONS[reason]})" in m for m in caplog.messages), reason
    assert route.routed_bs == set()
    R.unpatch_dsa_metadata(env.Ours)


def test_kernel_error_falls_back_once_loudly(env, monkeypatch, caplog):
    monkeypatch.setenv(R.ENV, "1")
    route = install(env)
    route.run = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    ours, ref = env.Ours(), env.Ref()
    idx, lens, lens_cpu = inputs(4)
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
        ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    ref._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert sum("raised RuntimeError: boom" in m for m in caplog.messages) == 1
    assert torch.equal(ours.decode_cuda_graph_metadata[4].page_table_1, ref.decode_cuda_graph_metadata[4].page_table_1)
    R.unpatch_dsa_metadata(env.Ours)


def test_check_mode_passes_then_catches_a_mismatch(env, monkeypatch, caplog):
    monkeypatch.setenv(R.ENV, "1")
    monkeypatch.setenv(R.ENV_CHECK, "3")
    route = install(env)
    ours = env.Ours()
    idx, lens, lens_cpu = inputs(4)
    ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert route.checks == [{"bs": 4, "passed": True, "differs": []}]

    def wrong(*a, **k):
        DM.dsa_decode_metadata(*a, **k)
        k["dsa_seqlens"][0] += 1

    route.run = wrong
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert route.checks[-1] == {"bs": 4, "passed": False, "differs": ["dsa_cache_seqlens_int32"]} and route.off
    assert any("route is off for this process" in m for m in caplog.messages)
    calls = len(env.dg_ours.calls)
    ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)  # off: SGLang's code only
    assert len(env.dg_ours.calls) == calls + 1 and len(route.checks) == 2
    R.unpatch_dsa_metadata(env.Ours)


def test_launcher_reused_per_batch_size_and_rebuilt_when_a_buffer_moves(env, monkeypatch):
    monkeypatch.setenv(R.ENV, "1")
    route = install(env)
    assert route.run is None  # the default: FastLauncher per batch size
    ours, ref = env.Ours(), env.Ref()
    idx, lens, lens_cpu = inputs(4)
    ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    ref._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)  # (stale columns past max_len stay alike)
    fl = route._fast[4][1]
    idx2, lens2, lens_cpu2 = inputs(4, seed=9)
    idx.copy_(idx2), lens.copy_(lens2), lens_cpu.copy_(lens_cpu2)  # the static slices, new contents
    ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert route._fast[4][1] is fl
    ref._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert torch.equal(ours.decode_cuda_graph_metadata[4].page_table_1, ref.decode_cuda_graph_metadata[4].page_table_1)
    md = ours.decode_cuda_graph_metadata[4]
    md.page_table_1 = md.page_table_1.clone()  # SGLang re-allocated a buffer: a new launcher
    ours._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)
    assert route._fast[4][1] is not fl
    R.unpatch_dsa_metadata(env.Ours)


def test_a_refused_launcher_is_remembered(env, monkeypatch, caplog):
    monkeypatch.setenv(R.ENV, "1")
    route = install(env)
    odd = env.Ours(bs_list=(4,))
    odd.decode_cuda_graph_metadata[4].cu_seqlens_k = odd.decode_cuda_graph_metadata[4].cu_seqlens_k.long()
    idx, lens, lens_cpu = inputs(4)
    built = []
    orig = DM.FastLauncher
    monkeypatch.setattr(DM, "FastLauncher", lambda *a, **k: built.append(1) or orig(*a, **k))
    for _ in range(3):
        odd._apply_cuda_graph_metadata(4, idx, lens, lens_cpu, Mode(), None)  # SGLang's code each time
    assert len(built) == 1 and isinstance(route._fast[4][1], DM.DsaMetadataInputError)
    R.unpatch_dsa_metadata(env.Ours)


def test_env_switch_install_and_unpatch(env, monkeypatch):
    orig = env.Ours._apply_cuda_graph_metadata
    for off in ("0", "off", "stock", " No "):
        monkeypatch.setenv(R.ENV, off)
        assert not R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False)
        assert env.Ours._apply_cuda_graph_metadata is orig
    monkeypatch.delenv(R.ENV, raising=False)  # default on (on a verified SGLang release)
    assert R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False, version="0.5.14")
    assert R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False,
                                  version="0.5.14")  # idempotent
    assert getattr(env.Ours._apply_cuda_graph_metadata, R.ORIGINAL_ATTR) is orig
    assert R.unpatch_dsa_metadata(env.Ours) and env.Ours._apply_cuda_graph_metadata is orig
    assert not R.unpatch_dsa_metadata(env.Ours)


def test_default_only_on_verified_sglang_releases(env, monkeypatch, caplog):
    """By default the route installs only on VERIFIED_SGLANG releases (logged otherwise, also for an unknown
    version); GLM5_FASTPATH_DSA_METADATA=1 installs it on any release."""
    orig = env.Ours._apply_cuda_graph_metadata
    monkeypatch.delenv(R.ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        for v in ("0.5.23", None):
            assert not R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False, version=v)
            assert env.Ours._apply_cuda_graph_metadata is orig
    assert sum("is not a release this route was checked against" in r.message for r in caplog.records) == 2
    monkeypatch.setattr(R, "sglang_version", lambda: "0.5.23")
    assert not R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False)
    monkeypatch.setenv(R.ENV, "1")
    assert R.install_dsa_metadata(backend_cls=env.Ours, module_globals=env.g, precompile=False)
    assert R.unpatch_dsa_metadata(env.Ours) and env.Ours._apply_cuda_graph_metadata is orig
    assert R.VERIFIED_SGLANG == ("0.5.14",) and R.explicitly_on()
    monkeypatch.setenv(R.ENV, "off")
    assert not R.explicitly_on()


def test_installed_sglang_release_is_declined_unless_verified():
    """On the installed SGLang (CI: 0.5.23, CPU-only): the default declines a release outside VERIFIED_SGLANG, and
    0.5.23's backend would fall back anyway: it has no real_page_size (its decode branch is rewritten and fused)."""
    import importlib.util

    v = R.sglang_version()
    if v is None:
        pytest.skip("sglang not installed")
    spec = importlib.util.find_spec(R.BACKEND_MODULE)
    if spec is None or spec.origin is None:
        pytest.skip(f"{R.BACKEND_MODULE} not in the installed sglang {v}")
    src = Path(spec.origin).read_text(errors="replace")
    if v not in R.VERIFIED_SGLANG:
        assert "_fused_decode_metadata" in src or "real_page_size" not in src, v
    if v == "0.5.23":
        assert "self.real_page_size" not in src and "real_page_size" in R.BACKEND_ATTRS


def test_backend_without_what_the_route_needs(env, monkeypatch):
    monkeypatch.setenv(R.ENV, "1")
    install(env)
    route = env.Ours._apply_cuda_graph_metadata.__glm5_fastpath_route__
    assert R.why_not(types.SimpleNamespace(), 1, None, Mode(), env.g) == "backend"
    assert R.why_not(env.Ours(), 1, torch.zeros(1), Mode(), {"is_cuda": lambda: True}) == "backend"
    assert R.why_not(env.Ours(), 1, torch.zeros(1), Mode(), env.g) == "device"  # CPU tensors, cuda-only route
    assert route.devices == ("cpu",)
    R.unpatch_dsa_metadata(env.Ours)


@pytest.mark.parametrize("raw,want", [("", 0), ("5", 5), ("x", 0), ("-2", 0)])
def test_check_calls_env(monkeypatch, raw, want):
    monkeypatch.setenv(R.ENV_CHECK, raw)
    assert R.check_calls() == want


class FakeIndexer:
    """Stand-in of SGLang 0.5.14's dsa_indexer.Indexer: only the paged top-k, the schedule's reader."""

    def __init__(self):
        self.calls = 0

    def _get_topk_paged(self, forward_batch, layer_id, q_fp8, weights, metadata):
        self.calls += 1
        return ("topk", layer_id)


def _refresh(backend, bs, seed=0):
    idx, lens, lens_cpu = inputs(bs, seed=seed)
    backend._apply_cuda_graph_metadata(bs, idx, lens, lens_cpu, Mode(), None)


def test_schedule_skip_until_sglangs_indexer_runs(env, monkeypatch, caplog):
    """GLM5_FASTPATH_DSA_METADATA_SCHEDULE=skip: no DeepGEMM schedule while SGLang's paged indexer has not run; the
    indexer keeps working through the wrapper; from its first call every refresh rebuilds the schedule again, and the
    rebuilt one is what SGLang's code computes."""
    monkeypatch.setenv(R.ENV, "1")
    monkeypatch.setenv(R.ENV_SCHEDULE, "skip")
    Idx = type("Idx", (FakeIndexer,), {})
    orig = Idx._get_topk_paged
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        route = install(env, indexer_cls=Idx)
        assert route.skip_schedule and not route.paged_indexer_seen
        ours = env.Ours(bs_list=(1, 4))
        for step in range(3):
            _refresh(ours, 4, seed=step)
        assert env.dg_ours.calls == [] and route.schedules_skipped == 3
        assert ours.decode_cuda_graph_metadata[4].paged_mqa_schedule_metadata is None  # left as it was
        assert ours.forward_metadata is ours.decode_cuda_graph_metadata[4]
        assert sum("schedule not refreshed" in r.message for r in caplog.records) == 1
        idx = Idx()
        assert idx._get_topk_paged(None, 3, None, None, None) == ("topk", 3) and idx.calls == 1
        assert route.paged_indexer_seen
        assert sum("refreshed from now on" in r.message for r in caplog.records) == 1
        _refresh(ours, 4, seed=7)
    ref = env.Ref(bs_list=(1, 4))
    for seed in (0, 1, 2, 7):  # the same refreshes (the page table keeps columns past a shorter step's max length)
        _refresh(ref, 4, seed=seed)
    assert len(env.dg_ours.calls) == 1
    for n in NAMES:
        assert torch.equal(getattr(ours.decode_cuda_graph_metadata[4], n), getattr(ref.decode_cuda_graph_metadata[4], n)), n
    assert R.unpatch_dsa_metadata(env.Ours, indexer_cls=Idx) and Idx._get_topk_paged is orig


def test_schedule_refresh_by_default_and_without_the_indexer(env, monkeypatch, caplog):
    """Default (and a bad value): the schedule is rebuilt every step and the indexer is not wrapped; skip without
    SGLang's paged top-k method (another release): rebuilt every step, logged."""
    monkeypatch.setenv(R.ENV, "1")
    Idx = type("Idx", (FakeIndexer,), {})
    orig = Idx._get_topk_paged
    for raw in (None, "sometimes"):
        if raw is None:
            monkeypatch.delenv(R.ENV_SCHEDULE, raising=False)
        else:
            monkeypatch.setenv(R.ENV_SCHEDULE, raw)
        route = install(env, indexer_cls=Idx)
        assert not route.skip_schedule and Idx._get_topk_paged is orig
        before = len(env.dg_ours.calls)
        _refresh(env.Ours(bs_list=(2,)), 2)
        assert len(env.dg_ours.calls) == before + 1
        R.unpatch_dsa_metadata(env.Ours, indexer_cls=Idx)
    monkeypatch.setenv(R.ENV_SCHEDULE, "skip")
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        route = install(env, indexer_cls=type("NoPaged", (), {}))
    assert not route.skip_schedule and any("not found" in r.message for r in caplog.records)
    before = len(env.dg_ours.calls)
    _refresh(env.Ours(bs_list=(2,)), 2)
    assert len(env.dg_ours.calls) == before + 1
    R.unpatch_dsa_metadata(env.Ours, indexer_cls=type("NoPaged", (), {}))


SGL_0514 = os.environ.get("GLM5_FASTPATH_SGLANG_0514_SRC")  # an unpacked sglang==0.5.14 wheel (the dir holding sglang/)


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_sglang_0514_source_schedule_has_one_reader():
    """The schedule skip's premise, on SGLang 0.5.14's source: outside the DSA backend that writes them,
    paged_mqa_schedule_metadata / paged_mqa_ctx_lens_2d are read in one function only, the Indexer's paged top-k
    that watch_indexer wraps (by module, class and name)."""
    root = Path(SGL_0514) / "sglang"
    readers = set()
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "paged_mqa_schedule_metadata" not in text and "paged_mqa_ctx_lens_2d" not in text:
            continue
        rel = path.relative_to(root.parent).with_suffix("")
        tree = ast.parse(text)
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
                src = ast.get_source_segment(text, fn) or ""
                if "paged_mqa_schedule_metadata" in src or "paged_mqa_ctx_lens_2d" in src:
                    readers.add((".".join(rel.parts), cls.name, fn.name))
    backend = {r for r in readers if r[0] == R.BACKEND_MODULE}
    assert readers - backend == {(R.INDEXER_MODULE, R.INDEXER_CLASS, R.INDEXER_METHOD)}
    assert (R.BACKEND_MODULE, R.BACKEND_CLASS, R.METHOD) in backend


def test_sglang_version_prefers_the_imported_package(monkeypatch):
    """The engine's imported sglang decides (its __version__), not whatever metadata sits elsewhere on the path."""
    import sys

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__="0.5.14"))
    assert R.sglang_version() == "0.5.14"
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace())  # no __version__: the package metadata
    from importlib.metadata import PackageNotFoundError, version
    try:
        want = version("sglang")
    except PackageNotFoundError:
        want = None
    assert R.sglang_version() == want
