"""Benchmark support: run metadata (meta.py), CUDA-graph replay timing over rotated inputs (timing.py),
the stock SGLang-equivalent prefix ops (stock_prefix.py), `bench prefix-ops` (prefix_ops.py) and
`bench offline` (offline.py)."""
