#!/usr/bin/env python3
"""MegaMoE (ours) vs DeepGEMM fp8_mega_moe vs the weight-bytes floor: `glm5-fastpath bench moe` (glm5_fastpath/bench/moe.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from glm5_fastpath.bench.moe import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
