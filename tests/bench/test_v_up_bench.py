"""bench v-up on CPU: arguments, the floor's bytes, the report, --help through the CLI."""
import pytest

from glm5_fastpath.bench import v_up as B
from glm5_fastpath.cli import build_parser


def _args(*extra):
    return build_parser().parse_args(["bench", "v-up", "--out", "/tmp/x", *extra])


def test_registered_with_defaults():
    a = _args()
    assert B.validate(a) == [1, 2, 4, 8, 16, 32, 64] and a.preset == "glm5" and not a.no_chain


@pytest.mark.parametrize("argv, msg", [(["--ts", "0"], "1..64"), (["--ts", "65"], "1..64"), (["--ts", "a"], "integers"),
                                       (["--ts", ","], "empty"), (["--replays", "0"], "--replays")])
def test_invalid_arguments(argv, msg, capsys):
    a = _args(*argv)
    with pytest.raises(ValueError, match=msg):
        B.validate(a)
    assert B.main(a) == 2 and msg in capsys.readouterr().out


def test_ts_sorted_and_deduplicated():
    assert B.parse_ts("8,1,8,3") == [1, 3, 8]


def test_floor_bytes_glm5():
    # 64 heads x 512 x 256 bf16 of W_UV; per token o (64 KB), y (32 KB) + y8 (16 KB), 128 scales
    assert B.floor_bytes(1, 64) == 64 * 512 * 256 * 2 + 64 * 512 * 2 + 64 * 256 * 3 + 128 * 4
    assert B.o_proj_bytes(1, 6144, 16384) == 6144 * 16384 + 48 * 128 * 4 + 6144 * 2


def test_markdown_has_every_row():
    res = {"gpu": "H200", "date": "d", "commit": "c", "preset": "glm5", "copy_bandwidth": {"bytes_per_s": 4.2e12},
           "rows": [{"T": t, "stock_bmm_us": 6.4, "stock_quant_us": 8.2, "ours_us": 5.0, "floor_us": 4.0,
                     "ours_over_floor": 1.25, "speedup_vs_stock_quant": 1.64, "chain_core_us": 12.0,
                     "chain_stock_us": 50.0, "chain_ours_us": 45.0, "chain_floor_us": 28.0, "chain_speedup": 1.11,
                     "ours_y_rel_l2": 1.7e-3, "ours_y_over_1ulp": 0.0, "ours_quant_bitwise": True} for t in (1, 16)]}
    md = B.markdown(res)
    assert "| 1 | 6.40 | 8.20 | 5.00 |" in md and "| 16 |" in md and "4.20 TB/s" in md
    assert md.splitlines()[-1].count("|") == md.splitlines()[-3].count("|")  # every row has the header's columns
