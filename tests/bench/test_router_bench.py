"""bench router on CPU: arguments, the floor, set agreement of ids, the report."""
import pytest
import torch

from glm5_fastpath.bench import router as B
from glm5_fastpath.cli import build_parser


def _args(*extra):
    return build_parser().parse_args(["bench", "router", "--out", "/tmp/x", *extra])


def test_registered_with_defaults(capsys):
    a = _args()
    assert B.parse_tokens(a.tokens) == [1, 2, 4, 8, 16, 32, 64] and a.inputs == 8
    for bad in ("0", "300", "x"):
        with pytest.raises(ValueError, match="--tokens"):
            B.parse_tokens(bad)
    assert B.main(_args("--tokens", "x")) == 2 and "--tokens" in capsys.readouterr().out


def test_floor_bytes():
    assert B.floor_bytes(1) == 256 * 6144 * 2 + 6144 * 2 + 256 * 4 + 3 * 8 * 4


def test_id_agreement_is_order_insensitive():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert B.id_agreement(torch.tensor([[4, 3, 2, 1], [5, 6, 7, 9]]), ref) == pytest.approx((1 + 0.75) / 2)
    assert B.id_agreement(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)) == 1.0


def test_stock_fallback_matches_the_reference_selection():
    """Without SGLang's GPU top-k the stock path is the same math in PyTorch (ids as sets = the reference's)."""
    from glm5_fastpath.config import Glm5Config
    from glm5_fastpath.ref.moe import route

    cfg = Glm5Config.preset("small")
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, cfg.hidden_size, generator=g).to(torch.bfloat16)
    gate = (torch.randn(cfg.n_routed_experts, cfg.hidden_size, generator=g) * 0.05).to(torch.bfloat16)
    bias = torch.randn(cfg.n_routed_experts, generator=g) * 0.01
    stock, name = B._stock(cfg)
    if not name.startswith("ref.moe.route"):
        pytest.skip("sglang's GPU top-k imports here: its path needs CUDA")
    ids, w = stock(h, gate, bias)
    ref_ids, ref_w, _ = route(h, gate, bias, cfg)
    assert B.id_agreement(ids, ref_ids) > 0.9 and torch.allclose(w.sum(-1), torch.ones(5), atol=1e-5)


def test_markdown():
    res = {"gpu": "NVIDIA H200", "date": "d", "commit": "c", "stock": "x",
           "rows": [{"M": 1, "floor_us": 0.8, "split_us": 10.7, "decode_us": 4.1, "stock_us": 30.0,
                     "split_over_decode": 2.61, "split_ids_agree": 1.0, "decode_ids_agree": 1.0,
                     "stock_ids_agree": 0.875},
                    {"M": 64, "split_us": 12.0, "decode_error": "n/a"}]}
    md = B.markdown(res)
    assert "| 1 | 0.80 | 10.70 | 4.10 | 30.00 | 2.61 | 1.000 / 1.000 / 0.875 |" in md and "decode_error" in md


def test_markdown_phases_and_flag():
    """--phases parses; phase rows render per (M, kernel); a phase error is listed with the errors."""
    a = build_parser().parse_args(["bench", "router", "--out", "o", "--phases"])
    assert a.phases is True
    d = {"ctas": 128, "sms": 128, "last_entry_us": 0.9, "wait_released_median_us": 1.0, "wait_released_last_us": 1.2,
         "own_work_median_us": 2.5, "last_part_stored_us": 4.1, "level1_done_last_us": None, "topk_start_us": 5.0,
         "topk_us": 1.7, "topk_end_us": 6.7}
    res = {"gpu": "g", "date": "d", "commit": "c", "stock": "x",
           "rows": [{"M": 1, "decode_phases": d, "split_phases_error": "RuntimeError: no"}]}
    md = B.markdown(res)
    assert "| 1 | decode | 128 | 128 | 0.90 | 1.00 / 1.20 | 2.50 | 4.10 | - | 5.00 | 1.70 | - | 6.70 |" in md
    assert "split_phases_error: RuntimeError: no" in md


def test_markdown_topk_rounds_ab():
    """--topk-rounds parses; the A/B table and the rounds builds' phase rows render."""
    a = build_parser().parse_args(["bench", "router", "--out", "o", "--topk-rounds", "--phases"])
    assert a.topk_rounds is True and a.phases is True
    d = {"ctas": 128, "sms": 128, "last_entry_us": 0.1, "wait_released_median_us": 0.3, "wait_released_last_us": 0.4,
         "own_work_median_us": 1.3, "last_part_stored_us": 1.8, "level1_done_last_us": None, "topk_start_us": 3.0,
         "topk_us": 3.5, "topk_loads_us": 1.25, "topk_end_us": 6.5}
    res = {"gpu": "g", "date": "d", "commit": "c", "stock": "x",
           "rows": [{"M": 1, "split_us": 8.0, "split_rounds_us": 9.0, "decode_us": 6.0, "decode_rounds_us": 7.5,
                     "split_rounds_ids_agree": 1.0, "decode_rounds_ids_agree": 1.0, "decode_rounds_phases": d}]}
    md = B.markdown(res)
    assert "| 1 | 8.00 | 9.00 | 6.00 | 7.50 | 1.000 / 1.000 |" in md
    assert "| 1 | decode_rounds | 128 | 128 | 0.10 | 0.30 / 0.40 | 1.30 | 1.80 | - | 3.00 | 3.50 | 1.25 | 6.50 |" in md
    assert "Top-k epilogue A/B" not in B.markdown({"rows": [{"M": 1, "split_us": 8.0}]})
