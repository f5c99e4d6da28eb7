"""Trace-build comparison of MegaMoE configs on setting (a) (session 11): per-task K-loop time per stage, waits."""
import json, sys, torch
sys.path.insert(0, ".")
from glm5_fastpath.bench import moe as B
from glm5_fastpath.moe import megamoe as M
from glm5_fastpath.ref.fp8 import quant_act_per_token
dev = torch.device("cuda")
tokens = [int(t) for t in sys.argv[1].split(",")]
cfgs = [M.MegaMoEConfig.from_name(n) for n in sys.argv[2].split(",")]
raw = B.make_weights(33, seed=5, dev=dev)
wt = M.prepare_weights(*raw, num_shared=1)
res = {}
for m in tokens:
    x8, xs, ids, wts = B.make_inputs(m, 32, seed=m, dev=dev)
    for c in cfgs:
        M.trace_run(x8, xs, ids, wts, wt, config=c, cap=2048)  # warm (JIT, workspace)
        got = M.trace_run(x8, xs, ids, wts, wt, config=c, cap=2048)
        s = got["summary"]
        r = got["rows"]
        line = {"m": m, "config": c.name, "span_us": s["span_us"]}
        for k in ("fc1", "fc2"):
            d = s.get(k, {})
            if d.get("tasks"):
                line[k] = {kk: (round(v / d["tasks"], 3) if isinstance(v, float) else v) for kk, v in d.items()}
        print(json.dumps(line))
        print(f"  {m} {c.name}: {M.trace_markdown(s)}")
        res[f"{m}_{c.name}"] = line
