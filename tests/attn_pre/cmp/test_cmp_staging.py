"""CMP static inputs: bucket choice, padding rows, validation (CPU)."""
import pytest
import torch

from glm5_fastpath.attn_pre.cmp.staging import StagingError, StaticInputs, check_buckets, pick_bucket
from glm5_fastpath.config import small_config

CFG = small_config()
B = (1, 2, 4, 8)


def test_pick_bucket():
    assert [pick_bucket(m, B) for m in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    with pytest.raises(StagingError, match="exceeds the largest bucket 8"):
        pick_bucket(9, B)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(StagingError):
            pick_bucket(bad, B)
    for bad in ((), (2, 1), (1, 1), (0, 4)):
        with pytest.raises(StagingError):
            check_buckets(bad)


def _step(m, pages=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = CFG.hidden_size
    return {"hidden": torch.randn(m, h, generator=g).bfloat16(), "residual": torch.randn(m, h, generator=g).bfloat16(),
            "positions": torch.arange(m, dtype=torch.int64) + 100, "out_cache_loc": torch.arange(m, dtype=torch.int64) + 700,
            "seq_lens": torch.arange(m, dtype=torch.int32) + 101,
            "block_table": torch.arange(m * pages, dtype=torch.int32).view(m, pages) + 20}


def _assert_pad_rows(st, a, b, pad_slot):
    v = st.buf
    assert (v["hidden"][a:b] == 0).all() and (v["residual"][a:b] == 0).all()
    assert (v["positions"][a:b] == 0).all() and (v["seq_lens"][a:b] == 1).all()
    assert torch.equal(v["out_cache_loc"][a:b], pad_slot + torch.arange(a, b) % 64)


def test_load_pads_and_repads_only_dirty_rows():
    st = StaticInputs(CFG, B, max_pages=5, pad_slot=128, device="cpu")
    assert st.pad_page == 2 and st.max_ctx == 320
    assert (st.buf["block_table"] == 2).all()  # allocation pads the block table too
    _assert_pad_rows(st, 0, 8, 128)
    s3 = _step(3)
    assert st.load(s3, 4) == 3
    for n, t in s3.items():
        if n == "block_table":
            assert torch.equal(st.buf[n][:3, :3], t) and (st.buf[n][:3, 3:] == 2).all()
        else:
            assert torch.equal(st.buf[n][:3], t)
    _assert_pad_rows(st, 3, 8, 128)
    assert torch.equal(st.views(4)["hidden"], st.buf["hidden"][:4])
    s1 = _step(1, seed=1)
    st.load({**s1, "block_table": None}, 1)  # no block table: the bound rows are kept
    assert torch.equal(st.buf["hidden"][:1], s1["hidden"])
    _assert_pad_rows(st, 1, 8, 128)  # rows 1..2 held real data: re-padded
    assert torch.equal(st.buf["block_table"][:3, :3], s3["block_table"])  # block-table rows never re-padded
    assert st.dirty == 1


def test_bind_block_table():
    st = StaticInputs(CFG, B, max_pages=4, pad_slot=0, device="cpu")
    bt = torch.full((2, 3), 9, dtype=torch.int32)
    st.bind_block_table(bt)
    assert (st.buf["block_table"][:2, :3] == 9).all() and (st.buf["block_table"][:2, 3] == 0).all()
    with pytest.raises(StagingError):
        st.bind_block_table(bt.long())
    with pytest.raises(StagingError):
        st.bind_block_table(torch.zeros(2, 5, dtype=torch.int32))


def test_validation_errors():
    st = StaticInputs(CFG, B, max_pages=4, pad_slot=64, device="cpu")
    s = _step(3)
    with pytest.raises(StagingError, match="positions must be torch.int64"):
        st.check({**s, "positions": s["positions"].int()})
    with pytest.raises(StagingError, match="hidden must be torch.bfloat16"):
        st.check({**s, "hidden": s["hidden"].float()})
    with pytest.raises(StagingError, match="rows"):
        st.check({**s, "seq_lens": s["seq_lens"][:2]})
    with pytest.raises(StagingError, match="max_pages"):
        st.check({**s, "block_table": torch.zeros(3, 5, dtype=torch.int32)})
    with pytest.raises(StagingError, match="exceeds the largest bucket"):
        st.check(_step(9))
    with pytest.raises(StagingError, match="is on meta"):
        st.check({**s, "hidden": s["hidden"].to("meta")})
    with pytest.raises(StagingError, match="missing"):
        st.check({k: v for k, v in s.items() if k != "residual"})
    with pytest.raises(StagingError, match="M=3 > bucket 2"):
        st.load(s, 2)
    for bad in (1, -64, 64.0):
        with pytest.raises(StagingError, match="pad_slot"):
            StaticInputs(CFG, B, max_pages=4, pad_slot=bad, device="cpu")


def test_shared_layer_has_topk_input():
    st = StaticInputs(CFG, B, max_pages=4, pad_slot=0, device="cpu", shared_layer=True)
    assert st.buf["topk_slots"].shape == (8, CFG.index_topk) and (st.buf["topk_slots"] == -1).all()
