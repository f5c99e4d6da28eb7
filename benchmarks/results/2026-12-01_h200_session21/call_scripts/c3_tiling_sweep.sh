#!/bin/bash
# Session 21 call 3 (issue #5): the whole prefix in the megakernel (178ae24's kernel) under tilings and both
# schedulers, one run, no rebuild (tilings and placement are host-side). Default first and last (drift).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s21c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s21c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --launches 20 --replays 20"
step default1 40 $B --json "$H200_OUT/default1.json"
step round_robin 40 $B --scheduler round_robin --json "$H200_OUT/round_robin.json"
for v in b1_split_k=4 d1_split_k=2 b1_split_k=4,d1_split_k=2 b1_split_k=2 d1_split_k=1 \
         b1_split_k=4,b0_split_k=3,d1_split_k=2 c0_k_chunk=256,b1_split_k=4 b0_split_k=6; do
  step "t_${v//[=,]/_}" 40 $B --tiling $v --json "$H200_OUT/t_${v//[=,]/_}.json"
done
step default2 40 $B --json "$H200_OUT/default2.json"
h200_pack
