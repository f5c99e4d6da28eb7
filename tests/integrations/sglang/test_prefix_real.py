"""The prefix adapter's contract against the real sglang package (0.5.23 in CI, CPU only, --no-deps import chain):
every attribute the adapter and prefix_fakes.py read exists in the real classes' source, the seam signatures
and the prepare tuple's element order are what prefix_adapter assumes (AST of the real forward_absorb_prepare),
and the index-K page layout is SGLang's: a real DSATokenToKVPool built on CPU takes our writes, and SGLang's own
index-K store kernel (Triton, run by the Triton CPU interpreter) writes the same bytes.

SGLang 0.5.14 (the H200's release) when GLM5_FASTPATH_SGLANG_0514_SRC points at an unpacked 0.5.14 wheel (the
directory holding sglang/): its seam and indexer read as text / AST, and, in a subprocess whose sys.path puts
that sglang first (its other dependencies: the installed 0.5.23's CPU import chain), its real classes: the
rotating Indexer recognised by prefix_adapter.indexer_rotates, and the full route with the Hadamard rotation
writing a real 0.5.14 DSATokenToKVPool in SGLang's own bytes.

Each check runs in a fresh interpreter (test_sglang_real._run: import cost, process-wide SGLang state)."""
import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

from glm5_fastpath.integrations.sglang import prefix_adapter as A
from test_sglang_real import _run

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")

HERE = str(Path(__file__).parent)


@needs_sglang
def test_adapter_attributes_and_seam_match_real_classes():
    out = _run(f"""
import ast, inspect, sys
sys.path.insert(0, {HERE!r})
import prefix_fakes as F
from glm5_fastpath.integrations.sglang import prefix_adapter as A
from sglang.srt.models.deepseek_v2 import DeepseekV2AttentionMLA
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.layers.layernorm import LayerNorm, RMSNorm
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.layers.attention import dsa_backend

def has(cls, names):
    src = inspect.getsource(cls)
    missing = [n for n in names if f"self.{{n}} =" not in src and f"self.{{n}}:" not in src]
    assert not missing, (cls.__name__, missing)

has(DeepseekV2AttentionMLA, ["layer_id", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "num_heads", "num_local_heads", "dcp_size", "fused_qkv_a_proj_with_mqa", "q_a_layernorm", "kv_a_layernorm",
    "q_b_proj", "w_kc", "rotary_emb", "indexer", "skip_topk", "is_nextn", "attn_mqa", "w_kc_qrep"])
has(Indexer, ["n_heads", "head_dim", "index_topk", "use_dsa_indexer_fusion", "wq_b", "wk_weights_proj", "k_norm",
    "rotary_emb", "num_init_tokens", "num_local_tokens"])
has(LayerNorm, ["weight", "bias", "variance_epsilon"])
has(RMSNorm, ["weight", "variance_epsilon"])
has(RotaryEmbedding, ["base", "rotary_dim", "is_neox_style"])
has(DSATokenToKVPool, ["index_page_size", "index_kpool", "index_head_dim"])
has(dsa_backend.DeepseekSparseAttnBackend, ["use_fused_topk", "hisparse_coordinator", "dsa_index_kpool"])
# 0.5.23's non-fused fallback rotates through _maybe_rotate (a switch): not recognised as 0.5.14's indexer ("partial")
assert not A.indexer_rotates(Indexer.__new__(Indexer))
assert DSATokenToKVPool.quant_block_size == 128
for cls, meth in [(DSATokenToKVPool, "get_index_k_with_scale_buffer"),
                  (dsa_backend.DeepseekSparseAttnBackend, "get_indexer_metadata"),
                  (dsa_backend.DSAIndexerMetadata, "get_seqlens_int32"), (dsa_backend.DSAIndexerMetadata, "get_page_table_64")]:
    assert callable(getattr(cls, meth)), (cls, meth)
# fakes carry the real class names the adapter checks by name
for fake, real in [(F.DSATokenToKVPool, DSATokenToKVPool), (F.Indexer, Indexer), (F.LayerNorm, LayerNorm),
                   (F.RotaryEmbedding, RotaryEmbedding), (F.DeepseekV2AttentionMLA, DeepseekV2AttentionMLA)]:
    assert fake.__name__ == real.__name__, (fake, real)
# the fused indexer (GLM-5 on CUDA) writes Hadamard-free keys; anything else rotates (our "partial" route)
src = inspect.getsource(Indexer._maybe_rotate)
assert "use_dsa_indexer_fusion" in src and "rotate_activation" in src
# seam signature as prefix_adapter expects it (0.5.23: 10-tuple with fusion_plan)
sig = A.seam_signature(DeepseekV2AttentionMLA.__new__(DeepseekV2AttentionMLA))
assert not isinstance(sig, A.Refusal) and sig.arity == 10 and sig.has_fusion_plan, sig
# the prepare's return tuple, element by element, from the real source
mod = sys.modules[DeepseekV2AttentionMLA.forward_absorb_prepare.__module__]
tree = ast.parse(inspect.getsource(mod))
fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward_absorb_prepare")
ret = [n for n in ast.walk(fn) if isinstance(n, ast.Return)][-1]
names = [e.id if isinstance(e, ast.Name) else type(e).__name__ for e in ret.value.elts]
assert names == list(A.CORE_PARAMS_0514) + ["fusion_plan", "Starred"], names
# the core writes the latent KV itself (save_kv_cache hard-coded True), the backend stores k_nope/k_pe
core = inspect.getsource(mod.DeepseekMLAForwardMixin.forward_absorb_core)
assert "save_kv_cache = True" in core
dec = inspect.getsource(dsa_backend.DeepseekSparseAttnBackend.forward_decode)
assert "set_mla_kv_buffer" in dec and "use_fused_topk" in dec and "transform_index_page_table_decode" in dec
# the QKV-A latent is computed lazily: not fetching it skips SGLang's GEMM
from sglang.srt.layers.layer_boundary.adapters import attention as la
assert "if self.qkv_latent_ is not None" in inspect.getsource(la.AttentionInputs.fetch_qkv_latent)
print("OK")
""", timeout=400)
    assert "OK" in out


@needs_sglang
def test_real_pool_takes_our_index_k_writes_in_sglang_layout():
    out = _run(f"""
import sys, types, torch
sys.path.insert(0, {HERE!r})
import prefix_fakes as F
from glm5_fastpath.integrations.sglang import prefix_adapter as A
from glm5_fastpath.integrations.sglang.prefix_executor import PrefixExecutor
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.ref.fp8 import index_k_cache_load
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

cfg = F.small_cfg(index_head_dim=128)   # SGLang's pool asserts a 128-dim index head
step, x, fb = F.make_batch(cfg, [5, 70, 130])
pages = step.index_k_cache.shape[0]
pool = DSATokenToKVPool(size=64 * pages, page_size=64, kv_lora_rank=cfg.kv_lora_rank, dtype=torch.bfloat16,
                        qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=2, device="cpu", index_head_dim=128,
                        enable_memory_saver=False, kv_cache_dim=cfg.kv_cache_dim, index_buf_size=64 * pages)
assert A.check_pool(pool, cfg) is None, A.check_pool(pool, cfg)
buf = pool.get_index_k_with_scale_buffer(1)
assert buf.dtype == torch.uint8 and buf.shape[1] == 64 * (128 + 4) and buf.shape[0] >= pages, buf.shape
buf[:pages].copy_(step.index_k_cache)
fb.attn_backend.token_to_kv_pool = fb.token_to_kv_pool = pool
attn = F.DeepseekV2AttentionMLA(cfg)
ex = PrefixExecutor(impl=P, mode="serial", cfg=cfg)
out = ex(attn.forward_absorb_prepare, step.positions, x, fb, None)
assert ex.layer_route(attn).kind == "full" and len(out) == 10
loc = step.out_cache_loc
k8, s = index_k_cache_load(buf, loc, 128)
written = buf.clone()
# SGLang's own store of the same entries (its Triton kernel, interpreted on CPU) changes no byte
pool.set_index_k_scale_buffer(1, loc, k8.contiguous(), s.contiguous().view(-1, 1))
assert torch.equal(buf, written)
# and the entries are the reference prefix's
w = types.SimpleNamespace(**{{**vars(ex.layer_route(attn).weights), "input_norm": torch.ones(cfg.hidden_size, dtype=torch.bfloat16)}})
ik = step.index_k_cache.clone()
P.attention_prefix(step.hidden, step.residual, step.positions, loc, step.seq_lens, step.block_table, w, cfg,
                   step.kv_cache.clone(), ik)
assert torch.equal(buf[:pages], ik)
print("OK")
""", {"TRITON_INTERPRET": "1"}, timeout=400)
    assert "OK" in out


SGL_0514 = os.environ.get("GLM5_FASTPATH_SGLANG_0514_SRC")  # an unpacked sglang==0.5.14 wheel (the dir holding sglang/)


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_sglang_0514_seam_source():
    """The 0.5.14 seam (the H200's release), read as text/AST without importing it (docs/sglang_prefix_contract.md)."""
    import ast

    root = Path(SGL_0514) / "sglang" / "srt"
    assert "__version__ = version = '0.5.14'" in (root.parent / "_version.py").read_text()
    fm = (root / "models/deepseek_common/attention_forward_methods/forward_mla.py").read_text()
    tree = ast.parse(fm)
    fns = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    ret = [n for n in ast.walk(fns["forward_absorb_prepare"]) if isinstance(n, ast.Return)][-1]
    assert [e.id for e in ret.value.elts] == list(A.CORE_PARAMS_0514)
    assert [a.arg for a in fns["forward_absorb_prepare"].args.args][1:] == list(A.PREPARE_PARAMS)
    assert [a.arg for a in fns["forward_absorb_core"].args.args][1:] == list(A.CORE_PARAMS_0514)
    idx = (root / "layers/attention/dsa/dsa_indexer.py").read_text()
    qk = ast.get_source_segment(idx, next(n for n in ast.walk(ast.parse(idx))
                                          if isinstance(n, ast.FunctionDef) and n.name == "_get_q_k_bf16"))
    assert "rotate_activation(key)" in qk and "use_dsa_indexer_fusion" not in idx  # keys Hadamard-rotated
    # what prefix_adapter.indexer_rotates reads (the full route with rotate=True), and the formats around it
    fns = {n.name: n for n in ast.walk(ast.parse(idx)) if isinstance(n, ast.FunctionDef)}
    seg = {k: "".join(ast.get_source_segment(idx, fns[k]).split()) for k in ("rotate_activation", "_get_q_k_bf16",
                                                                              "_get_k_bf16", "_store_index_k_cache")}
    assert "hadamard_transform(x,scale=hidden_size**-0.5)" in seg["rotate_activation"]
    assert "rotate_activation(query)" in seg["_get_q_k_bf16"] and "rotate_activation(key)" in seg["_get_q_k_bf16"]
    assert "rotate_activation(key)" in seg["_get_k_bf16"] and "_maybe_rotate" not in idx
    assert "key=self.k_norm(key)" in seg["_get_q_k_bf16"] and "q_rope,k_rope=self.rotary_emb(positions,q_rope,k_rope)" \
        in seg["_get_q_k_bf16"]  # LayerNorm, then RoPE, then the rotation, then the quant / store
    assert "fused_store_index_k_cache(" in seg["_store_index_k_cache"]
    assert 'scale_fmt="ue8m0"' in (root / "models/deepseek_v2.py").read_text()  # q: UE8M0 scales (act_quant)
    store = (root.parent / "jit_kernel/csrc/dsa/fused_store_index_cache.cuh").read_text()
    assert "const auto scale = fmaxf(1e-4f, abs_max) / math::FP8_E4M3_MAX;" in store  # k: fp32 amax/448, as our B1
    assert "self.wk = ReplicatedLinear(" in idx and "self.weights_proj = ReplicatedLinear(" in idx
    pool = (root / "mem_cache/memory_pool.py").read_text()
    assert "index_head_dim + index_head_dim // self.quant_block_size * 4" in pool and "assert self.page_size == 64" in pool
    be = (root / "layers/attention/dsa_backend.py").read_text()
    assert "elif envs.SGLANG_DSA_FUSE_TOPK.get():" in be and "set_mla_kv_buffer" in be
    wl = (root / "models/deepseek_common/deepseek_weight_loader.py").read_text()
    assert "w_kc.transpose(1, 2).contiguous().transpose(1, 2)" in wl
    comm = (root / "layers/communicator.py").read_text()
    assert "if self.qkv_latent_ is not None:" in comm


def _sglang_0514_path() -> str:
    """A directory holding only a `sglang` link to the 0.5.14 package (the wheel directory also holds compiled
    dependencies for another Python)."""
    d = Path(tempfile.mkdtemp(prefix="sgl0514_"))
    (d / "sglang").symlink_to(Path(SGL_0514).resolve() / "sglang")
    return str(d)


_IMPORT_0514 = """
import sys, transformers
_reg = transformers.AutoConfig.register  # 0.5.14 registers configs newer transformers already ship
transformers.AutoConfig.register = staticmethod(lambda t, c, exist_ok=False: _reg(t, c, exist_ok=True))
try:
    import sglang
    from sglang.srt.layers.attention.dsa import dsa_indexer as DI
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.layers.layernorm import LayerNorm
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
except ImportError as e:
    print("IMPORT_FAILED", repr(e))
    raise SystemExit(0)
from sglang.version import __version__
assert __version__ == "0.5.14", __version__
"""


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_sglang_0514_real_indexer_takes_the_rotated_full_route():
    out = _run(_IMPORT_0514 + f"""
import inspect, torch
sys.path.insert(0, {HERE!r})
import prefix_fakes as F, prefix_fakes_0514 as F14
from glm5_fastpath.integrations.sglang import prefix_adapter as A
from glm5_fastpath.integrations.sglang.prefix_executor import PrefixExecutor
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.ref.fp8 import index_k_cache_load

def has(cls, names):
    src = inspect.getsource(cls)
    missing = [n for n in names if f"self.{{n}} =" not in src and f"self.{{n}}:" not in src]
    assert not missing, (cls.__name__, missing)

# the real 0.5.14 class is recognised from its source; the attributes the adapter reads exist
assert A.indexer_rotates(DI.Indexer.__new__(DI.Indexer))
has(DI.Indexer, ["n_heads", "head_dim", "index_topk", "wq_b", "wk", "weights_proj", "k_norm", "rotary_emb"])
has(LayerNorm, ["weight", "bias", "variance_epsilon"])
has(RotaryEmbedding, ["base", "rotary_dim", "is_neox_style"])
has(DSATokenToKVPool, ["index_head_dim"])
has(dsa_backend.DeepseekSparseAttnBackend, ["token_to_kv_pool", "hisparse_coordinator"])
assert DSATokenToKVPool.quant_block_size == 128 and not hasattr(dsa_backend.DeepseekSparseAttnBackend, "use_fused_topk")
for cls, meth in [(DSATokenToKVPool, "get_index_k_with_scale_buffer"), (DSATokenToKVPool, "set_index_k_scale_buffer"),
                  (dsa_backend.DeepseekSparseAttnBackend, "get_indexer_metadata"),
                  (dsa_backend.DSAIndexerMetadata, "get_seqlens_int32"), (dsa_backend.DSAIndexerMetadata, "get_page_table_64")]:
    assert callable(getattr(cls, meth)), (cls, meth)

# a layer whose indexer is a real 0.5.14 Indexer (attributes as its __init__ sets them; real LayerNorm and
# RotaryEmbedding modules; the projections as plain weight holders) -> full route, rotated
cfg = F.small_cfg(index_head_dim=128)   # SGLang's pool asserts a 128-dim index head
attn = F14.attn_0514(cfg)
fake = attn.indexer
real = DI.Indexer.__new__(DI.Indexer)
torch.nn.Module.__init__(real)
for k in ("n_heads", "head_dim", "rope_head_dim", "index_topk", "q_lora_rank", "wq_b", "wk", "weights_proj"):
    setattr(real, k, getattr(fake, k))
real.k_norm = LayerNorm(cfg.index_head_dim, eps=1e-6)
with torch.no_grad():
    real.k_norm.weight.copy_(fake.k_norm.weight)
    real.k_norm.bias.copy_(fake.k_norm.bias)
rope = RotaryEmbedding.__new__(RotaryEmbedding)  # its __init__ needs SGLang's global server args
torch.nn.Module.__init__(rope)
rope.head_size = rope.rotary_dim = cfg.qk_rope_head_dim
rope.base, rope.is_neox_style, rope.max_position_embeddings = cfg.rope_theta, False, cfg.max_position_embeddings
real.rotary_emb = rope
attn.indexer = real
assert A.check_layer(attn, cfg) == ("full", None) and A.layer_rotate(attn), A.check_layer(attn, cfg)

step, x, fb = F.make_batch(cfg, [5, 70, 130])
pages = step.index_k_cache.shape[0]
pool = DSATokenToKVPool(size=64 * pages, page_size=64, kv_lora_rank=cfg.kv_lora_rank, dtype=torch.bfloat16,
                        qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=2, device="cpu", index_head_dim=128,
                        enable_memory_saver=False, kv_cache_dim=cfg.kv_cache_dim, index_buf_size=64 * pages)
assert A.check_pool(pool, cfg) is None, A.check_pool(pool, cfg)
buf = pool.get_index_k_with_scale_buffer(1)
buf[:pages].copy_(step.index_k_cache)
fb.attn_backend.token_to_kv_pool = fb.token_to_kv_pool = pool
ex = PrefixExecutor(impl=P, mode="full", cfg=cfg)
out = ex(attn.forward_absorb_prepare, step.positions, x, fb, None)
route = ex.layer_route(attn)
assert route.kind == "full" and route.rotate and len(out) == 9
loc = step.out_cache_loc
k8, s = index_k_cache_load(buf, loc, 128)
written = buf.clone()
# SGLang 0.5.14's own store of the same entries (its Triton kernel, interpreted on CPU) changes no byte
pool.set_index_k_scale_buffer(1, loc, k8.contiguous(), s.contiguous().view(-1, 1))
assert torch.equal(buf, written)
# and the entries are the rotated reference prefix's
import types
w = types.SimpleNamespace(**{{**vars(route.weights), "input_norm": torch.ones(cfg.hidden_size, dtype=torch.bfloat16)}})
ik = step.index_k_cache.clone()
P.attention_prefix(step.hidden, step.residual, step.positions, loc, step.seq_lens, step.block_table, w, cfg,
                   step.kv_cache.clone(), ik, indexer_rotate=True)
assert torch.equal(buf[:pages], ik)
print("OK")
""", {"PYTHONPATH": _sglang_0514_path(), "TRITON_INTERPRET": "1"}, timeout=400)
    if "IMPORT_FAILED" in out:
        pytest.skip(f"sglang 0.5.14 does not import here: {out.strip()[-300:]}")
    assert "OK" in out
