# CPU simulation (2026-11-30): how often does a GLM-5-sized router (256 experts, top-8, N(0, 0.02) weights as in
# the engine benchmark, unit-RMS hidden states) pick a different top-8 set under small perturbations?
# python3 router_flip_sim.py  (CPU, ~10 s)
import torch
torch.manual_seed(0)
H,E,K,N=6144,256,8,4000
W=(torch.randn(E,H)*0.02).to(torch.bfloat16)
h=torch.randn(N,H)
hb=h.to(torch.bfloat16)
def topk(logits):
    s=torch.sigmoid(logits.float())
    return torch.topk(s,K,dim=-1).indices.sort(-1).values
l32=hb.float()@W.float().t()
lb16=(hb@W.t()).float()   # bf16 GEMM output (rounded)
base=topk(l32)
def frac(ids): return float((ids!=base).any(-1).float().mean())
print("logit std", float(l32.std()))
print("bf16 logits vs fp32: tokens with a different top-8 set:", frac(topk(lb16)))
for eps in (1e-3,3e-3,1e-2,3e-2):
    hp=(h*(1+0)+eps*torch.randn(N,H)).to(torch.bfloat16)   # relative perturbation eps of a unit-RMS vector
    print(f"hidden perturbed by {eps:g} rel:", frac(topk(hp.float()@W.float().t())))
