"""The stock E2 row: SGLang's fused top-k (sgl_kernel) when it imports, else the labelled torch.topk stand-in;
the page-size-1 table it needs is built from the 64-token block table exactly as SGLang's metadata holds it."""
import torch

from glm5_fastpath.bench import stock_prefix as S


def test_page_table_1_from_the_block_table():
    bt = torch.tensor([[3, 7, -1], [0, 1, 2]], dtype=torch.int32)
    pt = S.page_table_1(bt, 130)
    assert pt.dtype == torch.int32 and pt.shape == (2, 130)
    assert pt[0, :2].tolist() == [192, 193] and pt[0, 64:66].tolist() == [448, 449]
    assert pt[0, 128:].tolist() == [-1, -1] and pt[1, 129].item() == 129


def test_page_table_1_matches_topk_translate_slots():
    """The stand-in's translation and the page-size-1 table agree on every live position."""
    g = torch.Generator().manual_seed(0)
    bt = torch.randperm(40, generator=g)[:12].view(3, 4).to(torch.int32)
    seq = torch.tensor([70, 200, 256])
    logits = torch.randn(3, 256, generator=g)
    slots = S.topk_translate(logits, seq, bt, 2048)
    pt = S.page_table_1(bt, 256)
    for b in range(3):
        live = slots[b][slots[b] >= 0]
        assert set(live.tolist()) == set(pt[b, : seq[b]].tolist())


def test_fused_topk_absent_on_cpu_gives_the_reason():
    fn, why = S.sglang_fused_topk()
    assert (fn is None) == bool(why)
