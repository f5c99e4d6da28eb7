"""ops.dsa_metadata: the DSA decode metadata op against SGLang 0.5.14's own torch sequence (written out here from
dsa_backend._apply_cuda_graph_metadata's decode branch), poisoned buffers (what the op must not touch stays), odd
sizes, both index dtypes, page sizes 1 and 64; validation; the fake; the GPU kernel bitwise (marked gpu)."""
import pytest
import torch

from glm5_fastpath.ops import dsa_metadata as DM

POISON = -7


def sglang_decode_metadata(req_to_token, req_pool_indices, seq_lens, seq_lens_cpu, topk, page_size, bufs):
    """SGLang 0.5.14's decode branch, line for line (dsa_backend.py _apply_cuda_graph_metadata)."""
    max_len = int(seq_lens_cpu.max().item())
    cache_seqlens = seq_lens.to(torch.int32)
    bufs["cache_seqlens"].copy_(cache_seqlens)
    bufs["cu_seqlens_k"][1:].copy_(torch.cumsum(cache_seqlens, dim=0, dtype=torch.int32))
    page_indices = req_to_token[req_pool_indices, :max_len]
    bufs["page_table_1"][:, :max_len].copy_(page_indices)
    dsa_cache_seqlens = cache_seqlens.clamp(max=topk)
    bufs["dsa_seqlens"].copy_(dsa_cache_seqlens)
    n = cache_seqlens.shape[0]
    bufs["dsa_cu"][1:1 + n].copy_(torch.cumsum(dsa_cache_seqlens, dim=0, dtype=torch.int32))
    if page_size > 1:
        strided = torch.arange(0, max_len, page_size, device=page_indices.device, dtype=torch.int32)
        real = page_indices[:, strided] // page_size
        bufs["real_table"][:real.shape[0], :real.shape[1]].copy_(real)
    return max_len


def make(bs, ctx, page_size, idx_dtype=torch.int64, len_dtype=torch.int64, topk=2048, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    pool = bs + 5
    req_to_token = torch.randint(0, 1 << 20, (pool, ctx + 3), generator=g, dtype=torch.int32)
    req_pool_indices = torch.randperm(pool, generator=g)[:bs].to(idx_dtype)
    seq_lens = torch.randint(1, ctx + 1, (bs,), generator=g).to(len_dtype)
    seq_lens[0] = ctx  # the longest row sets max_len
    if bs > 1:
        seq_lens[1] = min(ctx, topk + 3)  # around the top-k clamp
    bufs = {"cache_seqlens": torch.full((bs,), POISON, dtype=torch.int32),
            "cu_seqlens_k": torch.full((bs + 1,), POISON, dtype=torch.int32),
            "dsa_seqlens": torch.full((bs,), POISON, dtype=torch.int32),
            "dsa_cu": torch.full((bs + 1,), POISON, dtype=torch.int32),
            "page_table_1": torch.full((bs, ctx + 9), POISON, dtype=torch.int32),
            "real_table": torch.full((bs, DM.real_cols(ctx + 9, page_size) + 1), POISON, dtype=torch.int32)
            if page_size > 1 else None}
    ins = [t.to(device) for t in (req_to_token, req_pool_indices, seq_lens)]
    bufs = {k: (v.to(device) if v is not None else None) for k, v in bufs.items()}
    return ins, seq_lens, bufs


def run_op(ins, seq_lens_cpu, topk, page_size, bufs):
    max_len = int(seq_lens_cpu.max().item())
    DM.dsa_decode_metadata(*ins, max_len, topk, page_size, **bufs)
    return max_len


def clone(bufs):
    return {k: (v.clone() if v is not None else None) for k, v in bufs.items()}


CASES = [(1, 1, 1), (1, 383, 64), (3, 129, 64), (8, 2100, 64), (17, 500, 1), (5, 64, 64), (2, 65, 64)]


@pytest.mark.parametrize("bs,ctx,ps", CASES)
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int32)])
def test_cpu_op_is_sglangs_sequence(bs, ctx, ps, dtypes):
    ins, lens_cpu, bufs = make(bs, ctx, ps, *dtypes, seed=bs * 31 + ctx)
    want = clone(bufs)
    sglang_decode_metadata(*ins, lens_cpu, 2048, ps, want)
    run_op(ins, lens_cpu, 2048, ps, bufs)
    for k in bufs:
        if bufs[k] is not None:
            assert torch.equal(bufs[k], want[k]), k
    # what SGLang does not write stays: index 0 of the cumulative buffers, the columns past max_len
    assert bufs["cu_seqlens_k"][0] == POISON and bufs["dsa_cu"][0] == POISON
    assert (bufs["page_table_1"][:, ctx:] == POISON).all()


def test_topk_clamp_and_cumsums():
    ins, lens_cpu, bufs = make(4, 3000, 64, topk=2048)
    run_op(ins, lens_cpu, 2048, 64, bufs)
    s = ins[2].to(torch.int32)
    assert torch.equal(bufs["dsa_seqlens"], s.clamp(max=2048))
    assert torch.equal(bufs["cu_seqlens_k"][1:], torch.cumsum(s, 0, dtype=torch.int32))
    assert bufs["dsa_seqlens"].max() == 2048


def test_real_table_floor_division_of_negative_entries():
    ins, lens_cpu, bufs = make(2, 130, 64)
    ins[0][ins[1][0], 0] = -5  # SGLang's // is a floor: -5 // 64 = -1
    run_op(ins, lens_cpu, 2048, 64, bufs)
    assert bufs["real_table"][0, 0] == -1


def test_validation_names_the_op():
    ins, lens_cpu, bufs = make(3, 100, 64)
    ml = 100
    bad = [
        (dict(bufs, cache_seqlens=bufs["cache_seqlens"].long()), "cache_seqlens must be torch.int32"),
        (dict(bufs, cu_seqlens_k=bufs["cu_seqlens_k"][:3]), "cu_seqlens_k has 3 entries, the batch needs 4"),
        (dict(bufs, page_table_1=bufs["page_table_1"][:, :50]), "page_table_1 (3, 50) is smaller"),
        (dict(bufs, real_table=None), "real_table must be a torch.Tensor"),
        (dict(bufs, page_table_1=bufs["page_table_1"].t()), "contiguous last dim"),
    ]
    for b, msg in bad:
        with pytest.raises(DM.DsaMetadataInputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            DM.dsa_decode_metadata(*ins, ml, 2048, 64, **b)
    with pytest.raises(DM.DsaMetadataInputError, match="page_size >= 1"):
        DM.dsa_decode_metadata(*ins, ml, 2048, 0, **bufs)
    with pytest.raises(DM.DsaMetadataInputError, match="real_table must be None when page_size == 1"):
        DM.dsa_decode_metadata(*ins, ml, 2048, 1, **bufs)
    with pytest.raises(DM.DsaMetadataInputError, match="seq_lens has 2 entries"):
        DM.dsa_decode_metadata(ins[0], ins[1], ins[2][:2], ml, 2048, 64, **bufs)
    with pytest.raises(DM.DsaMetadataInputError, match="req_to_token has 103 columns, max_len is 200"):
        DM.dsa_decode_metadata(*ins, 200, 2048, 64, **dict(bufs, page_table_1=torch.zeros(3, 300, dtype=torch.int32),
                                                          real_table=torch.zeros(3, 9, dtype=torch.int32)))
    with pytest.raises(DM.DsaMetadataInputError, match="max_len must be an int"):
        DM.dsa_decode_metadata(*ins, 1.5, 2048, 64, **bufs)


def test_empty_batch_is_a_no_op():
    ins, lens_cpu, bufs = make(1, 10, 64)
    e = [ins[0], ins[1][:0], ins[2][:0]]
    b = {k: (v[:0] if k in ("cache_seqlens", "dsa_seqlens") else v) for k, v in bufs.items()}
    before = clone(b)
    DM.dsa_decode_metadata(*e, 0, 2048, 64, **b)
    assert all(torch.equal(b[k], before[k]) for k in b if b[k] is not None)


def test_opcheck_schema_and_fake():
    ins, lens_cpu, bufs = make(3, 100, 64)
    args = (*ins, 100, 2048, 64, bufs["cache_seqlens"], bufs["cu_seqlens_k"], bufs["dsa_seqlens"], bufs["dsa_cu"],
            bufs["page_table_1"], bufs["real_table"])
    torch.library.opcheck(torch.ops.glm5_fastpath.dsa_decode_metadata.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_registered_for_compile_check():
    from glm5_fastpath import ops
    assert any(s.source == DM.SOURCE for s in ops.compile_check_specs())


# ---- GPU ---------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("bs,ctx,ps", CASES + [(64, 8193, 64), (1, 100_001, 64)])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int64)])
def test_gpu_kernel_bitwise_sglangs_sequence(bs, ctx, ps, dtypes):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ins, lens_cpu, bufs = make(bs, ctx, ps, *dtypes, seed=bs + ctx, device="cuda")
    want = clone(bufs)
    sglang_decode_metadata(*ins, lens_cpu, 2048, ps, want)
    run_op(ins, lens_cpu, 2048, ps, bufs)
    torch.cuda.synchronize()
    for k in bufs:
        if bufs[k] is not None:
            assert torch.equal(bufs[k], want[k]), k


# ---- FastLauncher (the route's per-step path) ---------------------------------------------------------------

def test_fast_launcher_cpu_matches_the_op_and_checks_max_len():
    ins, lens_cpu, bufs = make(3, 200, 64)
    want = clone(bufs)
    sglang_decode_metadata(*ins, lens_cpu, 2048, 64, want)
    fl = DM.FastLauncher(*ins, 2048, 64, **bufs)
    assert fl.max_cols == 200 + 3 and fl.bs == 3  # req_to_token's columns bound it here
    fl(int(lens_cpu.max()))
    assert all(torch.equal(bufs[k], want[k]) for k in bufs)
    for bad in (-1, 204, 2.0, True):
        with pytest.raises(DM.DsaMetadataInputError, match="max_len"):
            fl(bad)
    assert fl.key == DM.key_of(*ins, *bufs.values())
    with pytest.raises(DM.DsaMetadataInputError, match="cache_seqlens must be torch.int32"):
        DM.FastLauncher(*ins, 2048, 64, **dict(bufs, cache_seqlens=bufs["cache_seqlens"].float()))


@pytest.mark.gpu
@pytest.mark.parametrize("ps", [1, 64])
def test_gpu_fast_launcher_across_steps(ps):
    """One launcher, new contents in the same input buffers each step (what a graph's static slices see), max_len
    varying: every step bitwise SGLang's sequence."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ins, lens_cpu, bufs = make(8, 3000, ps, device="cuda")
    fl = DM.FastLauncher(*ins, 2048, ps, **bufs)
    g = torch.Generator().manual_seed(5)
    for step in range(6):
        lens = torch.randint(1, 3000, (8,), generator=g)
        ins[2].copy_(lens)
        ins[1].copy_(torch.randperm(13, generator=g)[:8])
        want = clone(bufs)
        max_len = sglang_decode_metadata(*ins, lens, 2048, ps, want)
        fl(max_len)
        torch.cuda.synchronize()
        for k in bufs:
            if bufs[k] is not None:
                assert torch.equal(bufs[k], want[k]), (k, step)
