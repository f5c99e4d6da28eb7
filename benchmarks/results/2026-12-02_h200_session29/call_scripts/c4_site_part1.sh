#!/bin/bash
# Session 29 call 4 (issue #9): a second machine. c3's "norm" run did not run the norm route (install_norms reached
# glm5_fastpath.ops.add_rmsnorm_quant, which is the function, not the module: AttributeError, logged, SGLang's norms),
# so c3's two fastpath runs were the same code. This call parks the site's first part again for c5 / c6.
# run: C=<commit> bash this   (carry .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts && nvidia-smi -L
