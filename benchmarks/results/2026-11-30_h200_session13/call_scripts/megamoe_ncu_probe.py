"""One MegaMoE launch per config at setting (a) (32 routed experts, top-8, no shared expert) for Nsight Compute:
`ncu -k regex:^glm5_megamoe$ --launch-skip 2 --launch-count 1 ... python3 megamoe_ncu_probe.py TOKENS CONFIG`
(two warm-up launches, then the profiled one). Session 12 diagnostic, not a benchmark."""
import sys

import torch

from glm5_fastpath.bench.moe import make_inputs, make_weights
from glm5_fastpath.moe import megamoe as MM

m, name = int(sys.argv[1]), sys.argv[2]
dev = torch.device("cuda")
raw = make_weights(32, seed=32, dev=dev)
w = MM.prepare_weights(*raw, num_shared=0)
x8, xs, ids, wts = make_inputs(m, 32, seed=1000 + m, dev=dev)
cfg = MM.MegaMoEConfig.from_name(name)
for _ in range(3):
    MM.mega_moe(x8, xs, ids, wts, w, config=cfg)
torch.cuda.synchronize()
print("done", name, m)
