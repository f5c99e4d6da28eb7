"""install(model_runner): decide whether and how glm5_fastpath routes the loaded model, then patch it.

Runs inside the SGLang scheduler (TP worker) process, from the ModelRunner.load_model AFTER hook
(plugin.py), i.e. after the weights are loaded and before the KV pool is sized and the decode CUDA
graphs are captured; or, on SGLang releases without the plugin group (0.5.14), from the external
model package (models/). Steps:

1. facts: plain values read from the runner / model (architecture, draft worker, GPU, quantisation,
   TP/EP/DP/PP layout) -> decision.check_model. Any refusal is logged once with its reason and the
   model is left untouched (SGLang's path for everything).
2. the selection table (--glm5-fastpath-config / GLM5_FASTPATH_CONFIG, else the shipped default for
   the GPU): logged, exported as glm5_fastpath_selected_info.
3. kernels the table needs are compiled (or loaded from the JIT cache) now, with progress in the log,
   never inside the first request.
4. patch.py wraps each layer's prefix and MoE seams and model_runner.forward (path counts, step time).
5. when the table selects the prefix executor ("cmp"), prefix_executor prepares every layer now (which
   route each layer takes and why, weight views, the FP8 re-quantized indexer wk, W_UK relaid out,
   static buffers and side streams): before KV-pool sizing and CUDA-graph capture.

WHAT IS ROUTED: decode steps whose bucket the table maps to "cmp" run the attention prefix through our
ops (prefix_executor.py), and those it maps to "megamoe[:<config>]" run the MoE experts through MegaMoE
(moe_executor.py: SGLang's router, MegaMoE on SGLang's own expert tensors); per-layer and per-call
fallbacks are logged once with the reason. MegaRTP is not routed yet (issue #5).

Supported layout today: TP1 only (no EP, no DP attention, no PP): our prefix ops are written for all
64 heads on one GPU. TP8 (H_local = 8) needs the per-rank head split in the executors first.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ... import selection
from . import decision
from .decision import STOCK, ModelFacts, Refusal, check_model

logger = logging.getLogger("glm5_fastpath")
ENV_SWITCH = "GLM5_FASTPATH"
ENV_CONFIG = "GLM5_FASTPATH_CONFIG"
_MARK = "_glm5_fastpath_install"


ENV_LOG_LEVEL = "GLM5_FASTPATH_LOG_LEVEL"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "") == "1"


def configure_logging(log: logging.Logger = logger) -> None:
    """GLM5_FASTPATH_LOG_LEVEL=INFO (or DEBUG, ...) gives the glm5_fastpath logger its own stderr handler at that
    level, so the routing decisions show even where SGLang's level hides INFO (the offline Engine defaults to
    log_level="error"). Unset: the logger follows SGLang's logging configuration."""
    level = os.environ.get(ENV_LOG_LEVEL, "").strip().upper()
    if not level or getattr(log, "_glm5_handler", False):
        return
    if not isinstance(logging.getLevelName(level), int):
        log.warning("glm5_fastpath: %s=%r is not a logging level; ignored", ENV_LOG_LEVEL, level)
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("[%(asctime)s glm5_fastpath] %(message)s", "%Y-%m-%d %H:%M:%S"))
    log.addHandler(h)
    log.setLevel(level)
    log.propagate = False
    log._glm5_handler = True  # type: ignore[attr-defined]


@dataclass
class InstallReport:
    installed: bool
    refusal: Refusal | None = None
    table: Any = None
    patched: dict = field(default_factory=dict)
    compiled: bool = False


# ---- facts ---------------------------------------------------------------------------------------------
def _quant(hf_config: Any, quant_method: str | None) -> tuple[str | None, tuple | None]:
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = getattr(qc, "to_dict", lambda: {})()
    qc = qc or {}
    method = quant_method or qc.get("quant_method")
    block = qc.get("weight_block_size")
    return method, (tuple(block) if block else None)


def _gpu() -> tuple[str | None, tuple[int, int] | None]:
    from ...platform import detect

    info = detect()
    return info.gpu_name, info.capability


def facts_from_model_runner(mr: Any, gpu: tuple | None = None) -> ModelFacts:
    mc = getattr(mr, "model_config", None)
    hf = getattr(mc, "hf_config", None)
    sa = getattr(mr, "server_args", None)
    archs = getattr(hf, "architectures", None) or [None]
    method, block = _quant(hf, getattr(mc, "quantization", None))
    name, cap = gpu if gpu is not None else _gpu()

    def sa_int(attr: str) -> int:
        v = getattr(sa, attr, None)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else 1

    return ModelFacts(architecture=archs[0], is_draft_worker=bool(getattr(mr, "is_draft_worker", False)),
                      gpu_name=name, capability=cap, quant_method=method, weight_block_size=block,
                      tp_size=int(getattr(mr, "tp_size", None) or sa_int("tp_size")), ep_size=sa_int("ep_size"),
                      dp_size=sa_int("dp_size"), pp_size=sa_int("pp_size"),
                      enable_dp_attention=bool(getattr(sa, "enable_dp_attention", False)))


def facts_from_model(model: Any, tp_size: int = 1, gpu: tuple | None = None) -> ModelFacts:
    """For the external-model-package seam, where there is no ModelRunner."""
    hf = getattr(model, "config", None)
    qc = getattr(model, "quant_config", None)
    method, block = _quant(hf, getattr(qc, "get_name", lambda: None)() if qc is not None else None)
    if block is None and qc is not None and getattr(qc, "weight_block_size", None):
        block = tuple(qc.weight_block_size)
    name, cap = gpu if gpu is not None else _gpu()
    archs = getattr(hf, "architectures", None) or [type(model).__name__]
    return ModelFacts(architecture=archs[0], is_draft_worker=False, gpu_name=name, capability=cap,
                      quant_method=method, weight_block_size=block, tp_size=tp_size)


# ---- install -------------------------------------------------------------------------------------------
def _effective_rows(table) -> list[tuple[int, str, str]]:
    bp, bm = decision.BUILT_PREFIX, decision.BUILT_MOE
    return [(b.tokens, b.prefix if b.prefix in bp else STOCK, b.moe if decision.executor_family(b.moe) in bm else STOCK)
            for b in table.buckets]


def _precompile(model_cfg: Any, metrics: Any, log: logging.Logger, table: Any = None) -> None:
    from ...config import Glm5Config
    from ... import ops
    from .prefix_executor import table_pdl_waits

    cfg = None
    try:
        cfg = Glm5Config.from_dict(model_cfg.to_dict()) if model_cfg is not None else None
    except Exception as e:  # noqa: BLE001 - fall back to the GLM-5 preset, say so
        log.info("glm5_fastpath: kernel shapes from the GLM-5 preset (%s)", e)
    log.info("glm5_fastpath: compiling / loading kernels for the selected buckets "
             "(first run compiles with nvcc and caches; later runs load from the cache)...")
    t0 = time.perf_counter()
    waits = table_pdl_waits(table)  # the early-wait cubins the table's CMP modes launch, besides the native ones
    from .qcat_route import enabled as qcat_enabled

    ops.precompile(cfg, pdl_waits=waits, d2_qcat=qcat_enabled())  # D2's q_cat form too when GLM5_FASTPATH_QCAT=1
    dt = time.perf_counter() - t0
    if metrics is not None:
        metrics.observe_jit("attn_prefix_ops", dt)
    log.info("glm5_fastpath: kernels ready in %.1f s", dt)


def install_model(model: Any, facts: ModelFacts, model_runner: Any = None, metrics: Any = "default",
                  log: logging.Logger = logger) -> InstallReport:
    from .patch import Router, StepTimer, patch_layers, patch_step

    prev = model.__dict__.get(_MARK) if hasattr(model, "__dict__") else None
    if prev is not None:
        return prev
    configure_logging(log)
    refusal = check_model(facts)
    if refusal is not None:
        log.info("glm5_fastpath: not routing this model: %s; every forward pass stays on SGLang's path",
                 refusal.message())
        rep = InstallReport(False, refusal)
        model.__dict__[_MARK] = rep
        return rep
    table = selection.resolve(facts.gpu_name, os.environ.get(ENV_CONFIG) or None)
    if metrics == "default":
        from ...metrics import get_metrics

        metrics = get_metrics()
    rows = _effective_rows(table)
    if metrics is not None:
        metrics.set_selected(rows)
    log.info("glm5_fastpath: selection table %s (largest bucket %d): %s", table.source, table.largest,
             ", ".join(f"{b.tokens}:{b.prefix}/{b.moe}" for b in table.buckets))
    needs_kernels = any(p != STOCK or m != STOCK for _, p, m in rows)
    if any(p != STOCK for _, p, _ in rows):
        _precompile(getattr(model, "config", None), metrics, log, table)
    if not needs_kernels:
        log.info("glm5_fastpath: the selection table routes no bucket to a built glm5_fastpath executor: every "
                 "bucket runs SGLang's own kernels; nothing to compile")
    router = Router(table, metrics, log)
    patched = patch_layers(model, router)
    if any(p == "cmp" for _, p, _ in rows):
        _prepare_prefix(model, router, log)
    moe_buckets = [t for t, _, m in rows if decision.executor_family(m) == "megamoe"]
    prepared = _prepare_moe(model, router, moe_buckets, metrics, log) if moe_buckets else None
    if prepared is None or not prepared.routed:  # no MegaMoE layer: prefill MoE stays SGLang's too
        router.prefill_moe_max = 0
    if needs_kernels:  # on unless GLM5_FASTPATH_SPARSE_MLA=sglang: the DSA attention core at small token counts
        from .attn_core import install_sparse_mla

        install_sparse_mla(metrics, log)
        from .linear_route import install_fp8_linear

        install_fp8_linear(model, metrics, log)  # on at <= 16 tokens unless GLM5_FASTPATH_FP8_LINEAR=0 (linear_route.py)
        from .v_up_route import install_v_up

        install_v_up(model, metrics, log)  # W_UV bmm + o_proj's quant in one kernel unless GLM5_FASTPATH_V_UP=0
        from .dsa_metadata_route import install_dsa_metadata

        install_dsa_metadata(metrics, log)  # default on (GLM5_FASTPATH_DSA_METADATA=0: off): per-step DSA metadata, one kernel
        from .qcat_route import install_qcat

        install_qcat(metrics, log)  # opt-in (GLM5_FASTPATH_QCAT=1): no q concat / latent-KV store kernels (qcat_route.py)
        from .norm_route import install_norms

        install_norms(model, metrics, log)  # A0 for the norms whose quant a route consumes (norm_route.py)
    if model_runner is not None:
        timer = None
        if metrics is not None:
            import torch

            ev = (lambda: torch.cuda.Event(enable_timing=True)) if torch.cuda.is_available() else None
            timer = StepTimer(metrics, ev)
        patch_step(model_runner, router, timer)
    routed = sorted({x for _, p, m in rows for x in (p, m) if x != STOCK})
    log.info("glm5_fastpath: installed on %d prefix seams and %d MoE layers; %s", patched["prefix"], patched["moe"],
             f"executors in use: {', '.join(routed)}" if routed else
             "every bucket calls SGLang's original methods (the table selects stock)")
    from . import shadow

    shadow.install(log=log)  # GLM5_FASTPATH_SHADOW_CHECK=N: diagnostics only (shadow.py)
    rep = InstallReport(True, None, table, patched, needs_kernels)
    model.__dict__[_MARK] = rep
    return rep


def _prepare_prefix(model: Any, router: Any, log: logging.Logger) -> Any:
    """Configure the process-wide prefix executor (patch.EXECUTORS["prefix"]["cmp"]) for this model and
    prepare every layer (prefix_executor.PrefixExecutor.prepare_model)."""
    from . import prefix_adapter
    from .prefix_executor import default_executor

    ex = default_executor()
    ex.router, ex.log = router, log
    try:
        ex.cfg = prefix_adapter.config_from_hf(getattr(model, "config", None))
    except Exception as e:  # noqa: BLE001 - a config we cannot parse: every layer stays on SGLang's path
        log.info("glm5_fastpath: prefix: model config not understood (%s); prefix stays on SGLang's path", e)
        ex.cfg = None
        return None
    return ex.prepare_model(model)


def _prepare_moe(model: Any, router: Any, buckets: list[int], metrics: Any, log: logging.Logger) -> Any:
    """Configure the process-wide MoE executor (patch.EXECUTORS["moe"]["megamoe"]): check every MoE layer, build
    MegaMoE's views of SGLang's expert tensors, compile the kernels of the buckets' configs and allocate the
    workspace of the largest bucket, all before the decode CUDA graphs are captured."""
    from .moe_executor import default_executor

    ex = default_executor()
    ex.router, ex.log = router, log
    t0 = time.perf_counter()
    try:
        s = ex.prepare_model(model, buckets, prefill_max=router.prefill_moe_max)
    except Exception as e:  # noqa: BLE001 - e.g. no GPU toolchain: the calls fall back per layer, loudly
        log.warning("glm5_fastpath: MoE: preparing MegaMoE failed (%s: %s); MoE layers will take SGLang's path",
                    type(e).__name__, e)
        return None
    if metrics is not None and s.routed:
        metrics.observe_jit("megamoe", time.perf_counter() - t0)
    return s


def install(model_runner: Any) -> InstallReport:
    """Entry from the ModelRunner.load_model AFTER hook (scheduler process)."""
    return install_model(model_runner.model, facts_from_model_runner(model_runner), model_runner=model_runner)
