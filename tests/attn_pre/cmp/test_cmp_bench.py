"""CMP bench: the derived columns and the markdown (CPU, on a synthetic report)."""
import pytest

from glm5_fastpath.attn_pre.cmp import bench


def test_derive_and_render():
    row = {"M": 16, "bytes": 95e6, "floor_us": 22.0, "sets": 2, "covers_l2": True,
           "modes": {"serial": {"median_us": 60.0}, "multistream": {"median_us": 45.0},
                     "multistream_pdl_entry": {"not_implemented": "needs pdl_wait"}, "full": {"median_us": 33.0}},
           "stock": {"median_us": 66.0, "e2": "sgl_kernel.fast_topk_transform_fused"}}
    bench.derive_row(row)
    assert row["modes"]["full"]["speedup_vs_stock"] == 2.0
    assert row["modes"]["full"]["time_over_floor"] == 1.5
    assert [s["mode"] for s in row["decomposition"]] == ["serial", "multistream", "full"]
    assert row["decomposition"][1]["saved_us"] == 15.0
    rep = {"config": "glm5", "kv_len": 8192, "device": "fake", "modes": ["serial", "multistream",
           "multistream_pdl_entry", "full"], "copy_bandwidth": {"bytes_per_s": 4.27e12}, "rows": [row]}
    md = bench.render_markdown(rep)
    assert "| 16 |" in md and "n/i" in md and "needs pdl_wait" in md and "2.00" in md
    assert "Stock E2 (top-k, step 11): sgl_kernel.fast_topk_transform_fused." in md  # which top-k the stock ran


def test_executors_map_to_modes_and_stock():
    from glm5_fastpath.attn_pre.cmp.bench import DEFAULT_MODES, modes_for_executors

    modes, stock = modes_for_executors(["stock", "serial", "cmp"])
    assert stock and modes == list(DEFAULT_MODES)
    assert modes_for_executors(["serial"]) == (["serial"], False)
    assert modes_for_executors(["megartp"]) == (["megartp"], False)  # every GLM-5 prefix family is in the megakernel
    assert modes_for_executors(["stock", "cmp", "megartp"]) == (list(DEFAULT_MODES[1:]) + ["megartp"], True)
    with pytest.raises(ValueError, match="unknown executor"):
        modes_for_executors(["fast"])


def test_cli_bench_prefix_rejects_unknown_mode(capsys):
    from glm5_fastpath.cli import main

    assert main(["bench", "prefix", "--out", "/tmp/unused", "--modes", "serial,warp"]) == 2
    assert "unknown mode" in capsys.readouterr().err
