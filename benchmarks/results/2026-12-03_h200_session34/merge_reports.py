"""Merge session 34's engine runs into stock-vs-fastpath reports (bench.offline.build_report), same machine and session:
stock = c4 (batch 1 / 8, 4 calls; batch 16 / 32, 1 call), fastpath = c3b's V-up on (vup_on2) and off (vup_off2), and
c3's (vup_on / vup_off, batch 1-32, 1 call). Run from the repo root: python3 benchmarks/results/2026-12-03_h200_session34/merge_reports.py
(needs the dummy model's config.json: python3 -m glm5_fastpath.bench.offline make-dummy-model /tmp/dm --layers 8
--dense-layers 1)."""
import json
import sys
from pathlib import Path

from glm5_fastpath.bench import offline as O

D = Path(__file__).resolve().parent
cfg = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/dm/config.json").read_text())


def load(p):
    return json.loads((D / p).read_text())


stock18 = load("c4_ccb248f_engine_stock/h200-offline-stock/mode-stock.json")
stock1632 = load("c4_ccb248f_engine_stock/h200-offline-stock1632/mode-stock.json")
stock = dict(stock18)
stock["batches"] = {**stock18["batches"], **stock1632["batches"]}
for name, fp in (("vup_on2", "c3b_ccb248f_engine_v_up_ba/h200-offline-vup_on2"),
                 ("vup_off2", "c3b_ccb248f_engine_v_up_ba/h200-offline-vup_off2"),
                 ("vup_on", "c3_ccb248f_engine_v_up_ab/h200-offline-vup_on"),
                 ("vup_off", "c3_ccb248f_engine_v_up_ab/h200-offline-vup_off")):
    f = load(f"{fp}/mode-fastpath.json")
    bs = sorted(int(b) for b in f["batches"])
    meta = {"gpu": f.get("gpu"), "date": "2026-12-03", "commit": "ccb248f", "sglang_version": f.get("sglang_version"),
            "input_len": 128, "output_len": 256, "batch_sizes": bs,
            "note": f"stock: c4 (batch 1 / 8: 4 calls, 16 / 32: 1 call); fastpath: {fp}"}
    rep = O.build_report({"stock": stock, "fastpath": f}, floors=O.floor_per_batch(cfg, bs, 128 + 128), meta=meta)
    (D / f"merged_stock_vs_{name}.json").write_text(json.dumps(rep, indent=1))
    (D / f"merged_stock_vs_{name}.md").write_text(O.render_markdown(rep))
    print(f"## stock vs {name}\n" + O.render_markdown(rep))
