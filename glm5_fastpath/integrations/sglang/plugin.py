"""`sglang.srt.plugins` entry point (SGLang >= 0.5.23): `register()`.

SGLang calls `load_plugins()` in every process it starts (launcher, Engine, scheduler, detokenizer,
DP controller), which calls `register()` and then `HookRegistry.apply_hooks()`. So `register()` only
registers three hooks on light targets; nothing heavy is imported here (no torch, no
prometheus_client, no sglang model modules):

- AFTER  ServerArgs.add_cli_args   adds `--enable-glm5-fastpath` and `--glm5-fastpath-config PATH`.
- AROUND ServerArgs.from_cli_args  sets the canonical switch GLM5_FASTPATH=1 (and GLM5_FASTPATH_CONFIG)
                                   in os.environ, which the spawned scheduler processes inherit.
- AFTER  ModelRunner.load_model    when GLM5_FASTPATH=1: install(model_runner) in the scheduler process,
                                   before KV-pool sizing and CUDA-graph capture.

The environment variable is the switch, so `Engine(...)` and the benchmarks work without the flag:
`GLM5_FASTPATH=1 python -m sglang.benchmark.offline_throughput ...`.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger("glm5_fastpath")

ENV_SWITCH = "GLM5_FASTPATH"
ENV_CONFIG = "GLM5_FASTPATH_CONFIG"
FLAG = "--enable-glm5-fastpath"
CONFIG_FLAG = "--glm5-fastpath-config"

TARGET_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
TARGET_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
TARGET_LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def add_cli_args(result, parser, *args, **kwargs):
    """AFTER hook of the @staticmethod ServerArgs.add_cli_args(parser)."""
    g = parser.add_argument_group("glm5_fastpath")
    g.add_argument(FLAG, action="store_true", default=False,
                   help="Route GLM-5 (GlmMoeDsaForCausalLM) decode through glm5_fastpath (sets GLM5_FASTPATH=1).")
    g.add_argument(CONFIG_FLAG, default=None, metavar="PATH",
                   help="Per-bucket selection table JSON (default: the shipped table for the GPU).")
    return None


def apply_args(args) -> bool:
    """Set the env switch from a parsed argparse namespace; returns whether the fast path is on."""
    on = bool(getattr(args, "enable_glm5_fastpath", False))
    cfg = getattr(args, "glm5_fastpath_config", None)
    if cfg:
        from ...selection import load

        load(cfg)  # fail at parse time, in the launcher, with the file and key named
        os.environ[ENV_CONFIG] = os.path.abspath(cfg)
    if on:
        os.environ[ENV_SWITCH] = "1"
    return on or os.environ.get(ENV_SWITCH) == "1"


def from_cli_args(original, cls, args, *rest, **kwargs):
    """AROUND hook of the @classmethod ServerArgs.from_cli_args(args)."""
    on = apply_args(args)
    server_args = original(cls, args, *rest, **kwargs)
    try:  # bookkeeping attribute: allowed by ServerArgs.__setattr__ and pickled with it (spec 1.7)
        server_args._glm5_fastpath = on
    except Exception:  # noqa: BLE001 - the env var is the switch; this is informational
        pass
    return server_args


def after_load_model(result, model_runner, *args, **kwargs):
    """AFTER hook of ModelRunner.load_model (scheduler / TP-worker process)."""
    if os.environ.get(ENV_SWITCH) == "1":
        from .install import install

        install(model_runner)
    return None


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET_ADD_CLI_ARGS, add_cli_args, HookType.AFTER)
    HookRegistry.register(TARGET_FROM_CLI_ARGS, from_cli_args, HookType.AROUND)
    HookRegistry.register(TARGET_LOAD_MODEL, after_load_model, HookType.AFTER)
