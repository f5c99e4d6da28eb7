"""The SGLang plugin (issue #7).

- plugin.py   `register()`, the `sglang.srt.plugins` entry point (SGLang >= 0.5.23): server flags, env switch,
              the ModelRunner.load_model AFTER hook that calls install.
- decision.py pure routing decisions over plain values (model checks, per-step classification).
- install.py  reads the loaded model's facts, decides, logs, precompiles, then patches (patch.py).
- patch.py    the per-layer wrappers (today they call SGLang's original method on every path).
- models/     SGLANG_EXTERNAL_MODEL_PACKAGE seam for releases without the plugin group (0.5.14).

Nothing here imports sglang, torch or prometheus_client at import time.
"""
