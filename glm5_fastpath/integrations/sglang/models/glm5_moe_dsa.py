"""GlmMoeDsaForCausalLM for SGLANG_EXTERNAL_MODEL_PACKAGE (see the package docstring)."""
from __future__ import annotations

import logging
import sys

from sglang.srt.models.glm4_moe import GlmMoeDsaForCausalLM as _StockGlmMoeDsa

logger = logging.getLogger("glm5_fastpath")


def _tp_size() -> int:
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 - not initialised (tests): assume TP1
        return 1


def maybe_install(model) -> None:
    from ..install import enabled, facts_from_model, install_model

    if enabled():
        install_model(model, facts_from_model(model, tp_size=_tp_size()))


def maybe_realistic_dummy(model) -> None:
    """Benchmark only (GLM5_FASTPATH_BENCH_REALISTIC_DUMMY=1, set by `bench offline --realistic-dummy` for both
    modes): dummy weights with O(1) activations (glm5_fastpath/bench/dummy_weights.py). Runs before SGLang's
    post-load (W_UK / W_UV from kv_b_proj) and before our install, so both see the final values."""
    from ....bench import dummy_weights as D

    if D.enabled():
        line = f"glm5_fastpath: {D.summary_line(D.realistic_dummy(model))} ({D.ENV}=1: benchmark only)"
        logger.warning(line)
        # also on stderr: a stock-mode worker runs without our log handler, and its log must show it too
        print(line, file=sys.stderr, flush=True)


def maybe_layer_dump(model) -> None:
    """Benchmark only (GLM5_FASTPATH_BENCH_LAYER_DUMP=DIR): per-layer records of the first decode step(s), in both
    modes (glm5_fastpath/bench/layer_dump.py); once per model (SGLang may call post_load_weights again)."""
    import os

    from ....bench import layer_dump as LD

    if os.environ.get(LD.ENV) and not getattr(model, "_glm5_layer_dump", None):
        model._glm5_layer_dump = LD.maybe_install(model)


class GlmMoeDsaForCausalLM(_StockGlmMoeDsa):
    """SGLang's GlmMoeDsaForCausalLM + glm5_fastpath install after loading (idempotent)."""

    def post_load_weights(self, *args, **kwargs):
        maybe_realistic_dummy(self)
        maybe_layer_dump(self)
        out = super().post_load_weights(*args, **kwargs)
        maybe_install(self)
        return out


EntryClass = [GlmMoeDsaForCausalLM]
