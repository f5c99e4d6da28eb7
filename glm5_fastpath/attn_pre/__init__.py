"""Attention-prefix executors beyond the per-op kernels (MegaRTP: the persistent-megakernel plan)."""
