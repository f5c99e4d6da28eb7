"""Synthetic decode-step inputs: M sequences with their context already in the (paged) caches.

Shared by the demo, tests and benchmarks so they all exercise the same realistic layout:
scattered physical pages (shuffled block table), caches filled with data of the right magnitude,
the current token's slot at the end of each sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import INDEX_K_PAGE_TOKENS, Glm5Config
from ..ref.fp8 import index_k_cache_store, new_index_k_cache, quant_per_row


@dataclass
class DecodeStep:
    hidden: torch.Tensor  # [M, H] bf16: previous layer's output
    residual: torch.Tensor  # [M, H] bf16
    positions: torch.Tensor  # [M] int64: position of the current token (= seq_len - 1)
    seq_lens: torch.Tensor  # [M] int32: context length including the current token
    block_table: torch.Tensor  # [M, max_pages] int32: logical page -> physical page
    out_cache_loc: torch.Tensor  # [M] int64: physical slot of the current token
    kv_cache: torch.Tensor  # [num_pages * 64, kv_lora + rope] bf16 (MLA latent cache)
    index_k_cache: torch.Tensor  # [num_pages, 64 * (D + 4)] uint8 (index-K cache)

    @property
    def M(self) -> int:  # noqa: N802
        return self.hidden.shape[0]


def make_decode_step(cfg: Glm5Config, seq_lens: list[int], *, seed: int = 0, device=None,
                     spare_pages: int = 3, fill_index_k: bool = True) -> DecodeStep:
    """Caches hold random entries for every earlier token of every sequence (the current one is empty)."""
    g = torch.Generator().manual_seed(seed)
    m, page = len(seq_lens), INDEX_K_PAGE_TOKENS
    pages_per = [-(-L // page) for L in seq_lens]
    num_pages = sum(pages_per) + spare_pages
    perm = torch.randperm(num_pages, generator=g)
    max_pages = max(pages_per)
    block_table = torch.full((m, max_pages), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages_per):
        block_table[i, :n] = perm[at:at + n].int()
        at += n
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    pos = (lens - 1).long()
    loc = block_table[torch.arange(m), pos // page].long() * page + pos % page
    h = cfg.hidden_size
    # hidden states of a real model have a few large channels; a heavy-ish tail exercises fp8 scaling
    hidden = (torch.randn(m, h, generator=g) * (1 + 3 * torch.rand(1, h, generator=g) ** 8)).to(torch.bfloat16)
    residual = (torch.randn(m, h, generator=g) * 2).to(torch.bfloat16)
    kv_cache = torch.randn(num_pages * page, cfg.kv_cache_dim, generator=g).to(torch.bfloat16)
    index_k = new_index_k_cache(num_pages, cfg.index_head_dim)
    if fill_index_k:
        slots = torch.cat([block_table[i, torch.arange(L - 1) // page].long() * page + torch.arange(L - 1) % page
                           for i, L in enumerate(seq_lens) if L > 1] or [torch.zeros(0, dtype=torch.long)])
        if slots.numel():
            k8, ks = quant_per_row(torch.randn(slots.numel(), cfg.index_head_dim, generator=g))
            index_k_cache_store(index_k, slots, k8, ks)
    step = DecodeStep(hidden, residual, pos, lens, block_table, loc, kv_cache, index_k)
    if device is not None:
        step = DecodeStep(*(t.to(device) for t in (step.hidden, step.residual, step.positions, step.seq_lens,
                                                    step.block_table, step.out_cache_loc, step.kv_cache,
                                                    step.index_k_cache)))
    return step
