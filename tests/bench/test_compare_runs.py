"""bench/compare_runs.py on CPU: argument parsing, medians / ranges / separation across engine processes, host-loop
columns, the report and the CLI."""
import json

import pytest

from glm5_fastpath.bench import compare_runs as C
from glm5_fastpath import cli


def run(itl, tok=400.0, batch=1, host=None):
    br = {"batch": batch, "itl_ms": {"p50": itl}, "output_tok_s": tok, "calls": 3}
    r = {"mode": "fastpath", "batches": {str(batch): br}}
    if host is not None:
        r["host_timing"] = {str(batch): {"timed": {"iter_us_p50": host, "host_busy_share": 0.99}}}
    return r


def test_parse_groups():
    g = C.parse_groups(["a=x,y", "b = z"])
    assert [(lab, [str(p) for p in ds]) for lab, ds in g] == [("a", ["x", "y"]), ("b", ["z"])]
    for bad in (["a"], ["=x"], ["a="], ["a=x", "a=y"], []):
        with pytest.raises(ValueError):
            C.parse_groups(bad)


def test_medians_delta_and_separation():
    cmp = C.compare([("base", [run(2.0), run(2.2), run(2.1)]), ("new", [run(1.8), run(1.9)]),
                     ("noisy", [run(1.95), run(2.3)]), ("one", [run(1.5)])])
    b = cmp["batches"]["1"]
    assert b["base"]["itl_median"] == pytest.approx(2.1) and b["base"]["itl_range"] == [2.0, 2.2]
    assert b["new"]["itl_delta_ms"] == pytest.approx(-0.25) and b["new"]["separated"] is True
    assert b["noisy"]["separated"] is False
    assert b["one"]["separated"] is None  # a single run shows no spread
    assert "separated" not in b["base"]


def test_missing_or_failed_batches_are_skipped():
    bad = {"batches": {"1": {"error": "boom"}}}
    cmp = C.compare([("a", [run(2.0), bad]), ("b", [bad])])
    assert cmp["batches"]["1"]["a"]["n"] == 1 and "b" not in cmp["batches"]["1"]


def test_render_and_host_loop_columns():
    cmp = C.compare([("base", [run(2.0, host=1990.0), run(2.1, host=2090.0)]), ("w8", [run(2.3), run(2.4)])])
    md = C.render(cmp, "T")
    assert "| 1 | base | 2 | 2.000, 2.100 | 2.050 | - | - | 400.0 | 1990, 2090 | 99 %, 99 % |" in md
    assert "| 1 | w8 | 2 | 2.300, 2.400 | 2.350 | +0.300 | yes | 400.0 | - | - |" in md


def test_cli_reads_dirs_and_writes(tmp_path, capsys):
    for name, itl in (("a1", 2.0), ("a2", 2.1), ("b1", 1.9)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mode-fastpath.json").write_text(json.dumps(run(itl)))
    out = tmp_path / "o"
    rc = cli.main(["bench", "compare-runs", f"a={tmp_path / 'a1'},{tmp_path / 'a2'}", f"b={tmp_path / 'b1'}",
                   "--out", str(out)])
    assert rc == 0 and (out / "compare_runs.md").exists()
    assert json.loads((out / "compare_runs.json").read_text())["runs"] == {"a": 2, "b": 1}
    assert "| 1 | b | 1 | 1.900 |" in capsys.readouterr().out
    assert C.main([f"a={tmp_path / 'nope'}"]) == 2
