"""The SGLang plugin (issue #7).

- plugin.py   `register()`, the `sglang.srt.plugins` entry point (SGLang >= 0.5.23): server flags, env switch,
              the ModelRunner.load_model AFTER hook that calls install.
- decision.py pure routing decisions over plain values (model checks, per-step classification).
- install.py  reads the loaded model's facts, decides, logs, precompiles, then patches (patch.py).
- patch.py    the per-layer wrappers and the executor registry (EXECUTORS["prefix"]["cmp"]).
- prefix_adapter.py / prefix_executor.py / prefix_check.py
              the attention-prefix route: SGLang -> our weight/cache views, our ops behind
              forward_absorb_prepare (docs/sglang_prefix_contract.md), and its shadow check.
- models/     SGLANG_EXTERNAL_MODEL_PACKAGE seam for releases without the plugin group (0.5.14).

Importing this package, plugin.py, decision.py or patch.py imports no sglang, torch or prometheus_client;
the prefix_* modules (torch) are loaded by install() or the first routed call.
"""
