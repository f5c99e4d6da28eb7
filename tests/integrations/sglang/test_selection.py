"""Selection tables: shipped defaults, strict validation (errors name the file and the key), lookup, override."""
import json

import pytest

from glm5_fastpath import selection as s

ENTRY = {"tokens": 1, "prefix": "stock", "moe": "stock"}


def _write(tmp_path, doc, name="t.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_shipped_defaults_are_valid_and_only_the_measured_h200_routes():
    tables = {t.source.rsplit("/", 1)[-1]: t for t in s.shipped_tables()}
    assert set(tables) == {"default.json", "h100.json", "h200.json"}
    for name, t in tables.items():
        assert [b.tokens for b in t.buckets] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
        if name != "h200.json":  # nothing measured on these GPUs: SGLang's path, and the comment says to tune
            assert all(b.prefix == "stock" and b.moe == "stock" for b in t.buckets), t.source
            assert "glm5-fastpath tune" in t.comment
    h200 = tables["h200.json"]  # measured on an H200 (2026-11-29): CMP everywhere, MegaMoE up to 128 tokens
    assert all(b.prefix == "cmp" and s.valid_cmp_mode(b.cmp_mode) for b in h200.buckets)
    assert [b.moe for b in h200.buckets] == ["megamoe"] * 8 + ["stock"]
    assert "2026-11-29" in h200.comment


def test_default_for_gpu():
    assert s.default_for_gpu("NVIDIA H200").source.endswith("h200.json")
    assert s.default_for_gpu("NVIDIA H100 80GB HBM3").source.endswith("h100.json")
    assert s.default_for_gpu("NVIDIA H800").source.endswith("h100.json")
    assert s.default_for_gpu("NVIDIA A100-SXM4-80GB").source.endswith("default.json")
    assert s.default_for_gpu(None).source.endswith("default.json")


def test_lookup_smallest_bucket_at_least_m():
    t = s.default_for_gpu("H200")
    assert [t.lookup(m).choice.tokens for m in (1, 2, 3, 5, 16, 17, 200, 256)] == [1, 2, 4, 8, 16, 32, 256, 256]
    assert t.lookup(257) == s.Lookup(257, None, "above_largest_bucket")
    assert t.lookup(0).reason == "empty_batch" and t.largest == 256


def test_override_wins(tmp_path):
    p = _write(tmp_path, {"version": 1, "gpu": ["H200"], "buckets": [
        {"tokens": 4, "prefix": "cmp", "moe": "megamoe:m4"}, {"tokens": 64, "prefix": "megartp", "moe": "stock"}]})
    t = s.resolve("NVIDIA H200", p)
    assert t.source == str(p) and t.lookup(3).choice == s.BucketChoice(4, "cmp", "megamoe:m4")
    assert t.lookup(5).choice.prefix == "megartp" and t.lookup(65).choice is None
    assert s.parse(t.to_dict(), "x") == s.SelectionTable(t.buckets, t.gpu, "x", t.comment)


@pytest.mark.parametrize("doc,key,msg", [
    ("{not json", None, "not valid JSON"),
    ([1, 2], "<top level>", "must be a JSON object"),
    ({"version": 1, "buckets": [ENTRY], "bucket": []}, "bucket", "unknown key"),
    ({"version": 2, "buckets": [ENTRY]}, "version", "must be 1"),
    ({"buckets": [ENTRY]}, "version", "must be 1"),
    ({"version": 1}, "buckets", "non-empty list"),
    ({"version": 1, "buckets": []}, "buckets", "non-empty list"),
    ({"version": 1, "gpu": "H200", "buckets": [ENTRY]}, "gpu", "list of non-empty strings"),
    ({"version": 1, "buckets": [ENTRY, {"tokens": 2, "prefx": "stock", "moe": "stock"}]}, r"buckets\[1\]\.prefx", "unknown key"),
    ({"version": 1, "buckets": [{"tokens": 2, "prefix": "stock"}]}, r"buckets\[0\]\.moe", "missing"),
    ({"version": 1, "buckets": [{"tokens": 0, "prefix": "stock", "moe": "stock"}]}, r"buckets\[0\]\.tokens", "positive integer"),
    ({"version": 1, "buckets": [{"tokens": "8", "prefix": "stock", "moe": "stock"}]}, r"buckets\[0\]\.tokens", "positive integer"),
    ({"version": 1, "buckets": [{"tokens": 8, "prefix": "stock", "moe": "stock"}, ENTRY]}, r"buckets\[1\]\.tokens", "strictly increasing"),
    ({"version": 1, "buckets": [ENTRY, dict(ENTRY)]}, r"buckets\[1\]\.tokens", "strictly increasing"),
    ({"version": 1, "buckets": [{"tokens": 1, "prefix": "flash", "moe": "stock"}]}, r"buckets\[0\]\.prefix", "unknown executor 'flash'"),
    ({"version": 1, "buckets": [{"tokens": 1, "prefix": "cmp", "moe": "triton"}]}, r"buckets\[0\]\.moe", "unknown MoE config 'triton'"),
    ({"version": 1, "buckets": [{"tokens": 1, "prefix": "cmp", "moe": "megamoe:"}]}, r"buckets\[0\]\.moe", "unknown MoE config"),
])
def test_validation_errors_name_file_and_key(tmp_path, doc, key, msg):
    p = _write(tmp_path, doc)
    with pytest.raises(s.SelectionError) as e:
        s.load(p)
    text = str(e.value)
    assert text.startswith(str(p) + ": "), text
    if key:
        import re
        assert re.search(f": {key}: ", text), text
    assert msg in text


def test_missing_file(tmp_path):
    with pytest.raises(s.SelectionError, match="no such selection table"):
        s.load(tmp_path / "nope.json")


def test_shipped_h200_table_entries_resolve_to_runnable_configs():
    """Every CMP mode of the shipped H200 table can be realised by the ops' wait-point switches, and every MegaMoE
    bucket has a valid default config for GLM-5's dims (what install precompiles)."""
    from glm5_fastpath import ops
    from glm5_fastpath.attn_pre.cmp.modes import NATIVE_WAIT_POINTS, get_mode, resolve_wait_points, wait_support
    from glm5_fastpath.moe import megamoe as MM

    t = next(t for t in s.shipped_tables() if t.source.endswith("h200.json"))
    names = list(NATIVE_WAIT_POINTS)
    support = wait_support(ops, names)
    for b in t.buckets:
        if b.prefix == "cmp":
            plans = resolve_wait_points(get_mode(b.cmp_mode), names, support)
            assert set(plans) == set(names)
        if b.moe.startswith("megamoe"):
            cfg = MM.default_config(b.tokens, 256, 8, 1, inter=2048)
            assert cfg.validate() == cfg and cfg.block_n <= 32  # bn capped at 32 up to 128 tokens
