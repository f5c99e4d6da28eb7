"""Nsight Compute probe (session 16 call 6): the prefix's FP8 GEMMs at M tokens with their tuned configs, plain
epilogue (B0's QKV-A 6144 -> 2624, D1's indexer Q 2048 -> 4096, D0's q_b 2048 -> 16384), each launched 3 times.
    python3 gemm_ncu_probe.py M"""
import sys

import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops import fp8_gemm as F
from glm5_fastpath.weights import random_layer

m = int(sys.argv[1])
cfg = Glm5Config.preset("glm5")
w = random_layer(cfg, 3, seed=0, device="cuda").attn
x8 = (torch.randn(m, 6144, device="cuda") * 0.5).to(torch.float8_e4m3fn)
xs = torch.rand(m, 48, device="cuda") + 0.5
x8b, xsb = x8[:, :2048].contiguous(), xs[:, :16].contiguous()
for name, lin, a, s in (("qkv_a", w.qkv_a, x8, xs), ("index_q", w.indexer.wq_b, x8b, xsb), ("q_b", w.q_b, x8b, xsb)):
    cfg_ = F.config_for(m, lin.weight.shape[0], lin.weight.shape[1])
    print(name, cfg_.describe(), flush=True)
    for _ in range(3):
        F.fp8_gemm_skinny(a, s, lin, pdl=False)
torch.cuda.synchronize()
print("done")
