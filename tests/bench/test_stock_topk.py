"""bench.stock_prefix.stock_topk: the one place the stock E2 is chosen (prefix-ops and the CMP stock chain)."""
import dataclasses

from glm5_fastpath.bench import stock_prefix as SP
from glm5_fastpath.config import Glm5Config


def test_other_topk_sizes_take_the_labelled_stand_in(monkeypatch):
    monkeypatch.setattr(SP, "sglang_fused_topk", lambda: (object(), ""))
    cfg = Glm5Config.preset("glm5")
    fn, label = SP.stock_topk(cfg)
    assert fn is not None and label == SP.E2_SGLANG
    fn, label = SP.stock_topk(dataclasses.replace(cfg, index_topk=512))
    assert fn is None and label.startswith(SP.E2_STANDIN) and "index_topk 512 != 2048" in label


def test_missing_sgl_kernel_names_the_reason(monkeypatch):
    monkeypatch.setattr(SP, "sglang_fused_topk", lambda: (None, "ImportError: no sgl_kernel"))
    fn, label = SP.stock_topk(Glm5Config.preset("glm5"))
    assert fn is None and "ImportError: no sgl_kernel" in label
