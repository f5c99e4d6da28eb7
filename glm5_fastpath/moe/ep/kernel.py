"""The in-kernel expert-parallel MegaMoE (issue #8): one MegaMoE kernel per rank, dispatch and combine inside it.

    bufs = EPBuffers.symmetric(layout, group)          # torch symmetric memory (one GPU per process)
    moe = EPMegaMoE(local_weights, bufs, num_experts=256, topk=8)
    out = moe(x8, x_scale, topk_ids, topk_weights)    # [M, H] bf16 for this rank's tokens; every rank calls

What the kernel does per call (megamoe.cuh, GLM5_MEGAMOE_EP; docs/megamoe_ep.md "Implementation"):
- the host copies this rank's inputs (x8, x_scale, topk ids as int32, topk weights) into its symmetric buffer;
- the plan kernel bumps the epoch, publishes the token count, releases ready[me] at every rank and acquires every
  rank's ready (entry barrier), gathers every rank's routing and plans the pairs this rank owns: the routed pairs
  whose global expert id is in [rank * E_local, (rank + 1) * E_local) and the shared-expert pairs of its own tokens;
- the persistent kernel pulls each pair's token row from its source rank into the local token pool (the pool build's
  copy, reading a peer's symmetric buffer over NVLink), runs FC1 / FC2 as on one GPU, and stores each pair's weighted
  FC2 output straight into the SOURCE rank's symmetric slot buffer (combine mode A: 16-byte remote stores);
- exit barrier: the last CTA of a rank releases done[me] at every rank; every rank then sums its own tokens' S slots in
  slot order (the single-GPU end combine): bitwise the single-GPU kernel's result on the gathered batch.

Routed expert ids are GLOBAL ([0, num_experts)); rank r owns [r E_local, (r + 1) E_local) as local ids 0..E_local-1,
and the shared expert (replicated) is local id E_local. No host synchronisation; CUDA-graph capturable (the epoch lives
in device memory). All ranks must make the same sequence of calls, a rank with no tokens included (M = 0 still launches:
the barriers need it).

EPBuffers.simulated(layout, n, device) gives N ranks' buffers on ONE GPU (peer pointers = the other buffers); launch
the ranks' calls on N streams with `grid` = SMs / N each (`simulate` does): the whole cross-rank protocol on one GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .. import megamoe as M

SIG_WORDS = 2 + 2 * M.EP_MAX_RANKS  # megamoe.cuh kSigWords: epoch, num_tokens, ready[8], done[8]
EP_TOK_BITS = 20                    # megamoe.cuh kEpTokBits: pair code token part = src << 20 | t
MAX_TOKENS_PER_RANK = 1 << EP_TOK_BITS
_ALIGN = 256


class EPKernelError(ValueError):
    """Bad arguments to the EP MegaMoE (shapes, dtypes, capacities, configuration)."""


def _align(n: int, a: int = _ALIGN) -> int:
    return (n + a - 1) // a * a


MODES = {"A": 0, "B": 1}  # megamoe.cuh Params.ep_mode


@dataclass(frozen=True)
class SymLayout:
    """Byte layout of one rank's symmetric buffer (identical at every rank; megamoe.cuh Params.sym_*).

    Combine mode A (the default): each pair's weighted FC2 output goes straight into the source rank's slot buffer
    [T, S, H] (remote 16-byte stores from the FC2 epilogue); the source sums its slots after the exit barrier.
    Mode B: the owner keeps its outputs in its own out_pool [pairs_cap, H] (pair-row order, local stores) and writes
    each slot's location (owner << 24 | pair row) into the source's pair_loc [T, S]; after the exit barrier the source
    reads its slots from the owners' pools (NVLink loads). pairs_cap is the owner's workspace capacity
    (megamoe.WorkspaceShape over world x T tokens)."""

    max_tokens: int  # T: rows of the per-token fields (tokens per rank per call)
    hidden: int
    topk: int
    num_slots: int   # S = topk + num_shared
    mode: str = "A"
    pairs_cap: int = 0  # mode B: rows of out_pool

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= MAX_TOKENS_PER_RANK:
            raise EPKernelError(f"max_tokens={self.max_tokens} must be in 1..{MAX_TOKENS_PER_RANK}")
        if self.mode not in MODES:
            raise EPKernelError(f"combine mode {self.mode!r} must be one of {sorted(MODES)}")
        if self.mode == "B" and not 0 < self.pairs_cap < 1 << 24:
            raise EPKernelError(f"mode B needs pairs_cap in 1..2^24 - 1 (24-bit row of pair_loc), got {self.pairs_cap}")

    @classmethod
    def for_group(cls, max_tokens: int, hidden: int, inter: int, topk: int, num_shared: int, world: int,
                  num_experts: int, mode: str = "A") -> "SymLayout":
        """The layout for `world` ranks of num_experts routed experts (+ num_shared replicated) each holding up to
        max_tokens tokens per call."""
        S = topk + num_shared
        cap = M.WorkspaceShape(hidden, inter, num_experts // world + num_shared, S, world * max_tokens).pairs_cap
        return cls(max_tokens, hidden, topk, S, mode, cap if mode == "B" else 0)

    @property
    def offsets(self) -> dict[str, int]:
        T, H, k, S = self.max_tokens, self.hidden, self.topk, self.num_slots
        a, b = self.mode == "A", self.mode == "B"
        sizes = [("x", T * H), ("xs", T * (H // 128) * 4), ("w", T * k * 4), ("ids", T * k * 4), ("sig", SIG_WORDS * 4),
                 ("slots", T * S * H * 2 if a else 0), ("loc", T * S * 4 if b else 0),
                 ("opool", self.pairs_cap * H * 2 if b else 0)]
        off, out = 0, {}
        for name, n in sizes:
            out[name] = off
            off = _align(off + n)
        out["_end"] = off
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets["_end"]

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed views of a uint8 buffer laid out like this."""
        o, T, H, k, S = self.offsets, self.max_tokens, self.hidden, self.topk, self.num_slots

        def v(name: str, n: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
            return buf[o[name]:o[name] + n].view(dtype).view(shape)
        return {"x": v("x", T * H, M.FP8, (T, H)), "xs": v("xs", T * H // 128 * 4, torch.float32, (T, H // 128)),
                "w": v("w", T * k * 4, torch.float32, (T, k)), "ids": v("ids", T * k * 4, torch.int32, (T, k)),
                "sig": v("sig", SIG_WORDS * 4, torch.int32, (SIG_WORDS,)),
                "slots": v("slots", T * S * H * 2 if self.mode == "A" else 0, torch.bfloat16,
                           (T, S, H) if self.mode == "A" else (0, S, H)),
                "loc": v("loc", T * S * 4 if self.mode == "B" else 0, torch.int32, (T, S) if self.mode == "B" else (0, S)),
                "opool": v("opool", self.pairs_cap * H * 2, torch.bfloat16, (self.pairs_cap, H))}


@dataclass
class EPBuffers:
    """One rank's view of the group's symmetric buffers: its own buffer (typed views) and every rank's base address."""

    layout: SymLayout
    rank: int
    world: int
    peers: list[int]          # base address of every rank's buffer, as mapped in this process / device
    buf: torch.Tensor         # this rank's buffer (uint8)
    views: dict[str, torch.Tensor]
    handle: Any = None        # the symmetric-memory handle (keeps the mapping alive)

    @classmethod
    def symmetric(cls, layout: SymLayout, group=None) -> "EPBuffers":
        """torch symmetric memory over `group` (one GPU per process; collective: every rank calls it). NVLink
        multicast stays off (launch.NO_MULTICAST_ENV)."""
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
        group = group or dist.group.WORLD
        dev = torch.device("cuda", torch.cuda.current_device())
        buf = symm_mem.empty(layout.nbytes, dtype=torch.uint8, device=dev)
        try:
            h = symm_mem.rendezvous(buf, group)
        except TypeError:  # older torch: the group name
            h = symm_mem.rendezvous(buf, group.group_name)
        buf.zero_()
        torch.cuda.synchronize(dev)
        dist.barrier(group=group)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return cls(layout, rank, world, [int(p) for p in h.buffer_ptrs], buf, layout.views(buf), h)

    @classmethod
    def simulated(cls, layout: SymLayout, world: int, device: Any = None) -> list["EPBuffers"]:
        """N ranks' buffers on one GPU (plain allocations; each rank's peer table points at all of them)."""
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        bufs = [torch.zeros(layout.nbytes, dtype=torch.uint8, device=dev) for _ in range(world)]
        peers = [b.data_ptr() for b in bufs]
        return [cls(layout, r, world, peers, b, layout.views(b)) for r, b in enumerate(bufs)]


def _check(name: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise EPKernelError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise EPKernelError(f"{name} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise EPKernelError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def default_ep_config(tokens_per_rank: int, world: int, num_experts: int, topk: int) -> M.MegaMoEConfig:
    """The pool build the EP kernel runs (it needs the token pool and the end combine), from the expected largest
    per-expert load (every rank's tokens over num_experts): the token-major bn64 pool build from the single-GPU
    threshold (M.TOKEN_MAJOR_POOL_MIN_LOAD) on, below it the smallest swapAB block that holds the load (8 / 16 / 32 /
    64 tokens), whole-K FC1 tiles (split-K did not help at 1 token per rank: 119-123 vs 117 us, EP2, 2026-11-30)."""
    load = M.expected_max_load(max(1, tokens_per_rank * world), num_experts, topk)
    if load >= M.TOKEN_MAJOR_POOL_MIN_LOAD:
        return M.MegaMoEConfig(64, M.max_stages(64), M.MAX_EXPERTS, 0, lean_fences=True, pool=True, token_major=True,
                               end_combine=True).validate()
    bn = next(b for b in (8, 16, 32, 64) if load <= b)
    return M.MegaMoEConfig(bn, M.max_stages(bn), M.MAX_EXPERTS, 0, lean_fences=True, pool=True,
                           end_combine=True).validate()


# EPMegaMoE instances by handle: the torch.library op (ep_mega_moe) takes the handle, as DeepGEMM's fp8_mega_moe takes
# its symmetric buffer object (an op cannot take arbitrary Python objects).
_INSTANCES: dict[int, "EPMegaMoE"] = {}
_next_handle = [1]


class EPMegaMoE:
    """This rank's EP MegaMoE: local weights (the routed experts it owns, then the shared one), its EPBuffers, a local
    workspace sized for every rank's tokens routed here (world x T tokens).

    moe(x8, x_scale, topk_ids, topk_weights) runs it directly; moe.op(...) goes through the torch.library op
    torch.ops.glm5_fastpath.ep_mega_moe (fake implementation for tracing: [M, H] bf16)."""

    def __init__(self, weights: M.MegaMoEWeights, bufs: EPBuffers, *, num_experts: int, topk: int,
                 config: M.MegaMoEConfig | None = None, grid: int | None = None,
                 routed_scaling_factor: float = 2.5) -> None:
        if not isinstance(weights, M.MegaMoEWeights):
            raise EPKernelError(f"weights must be a MegaMoEWeights, got {type(weights).__name__}")
        lay = bufs.layout
        self.world, self.rank = bufs.world, bufs.rank
        if not 1 <= self.world <= M.EP_MAX_RANKS:
            raise EPKernelError(f"world size {self.world} must be in 1..{M.EP_MAX_RANKS}")
        if num_experts % self.world or weights.num_experts != num_experts // self.world:
            raise EPKernelError(f"rank {self.rank}: {weights.num_experts} local routed experts, expected num_experts / "
                                f"world = {num_experts} / {self.world}")
        if lay.topk != topk or lay.num_slots != topk + weights.num_shared or lay.hidden != weights.hidden:
            raise EPKernelError(f"buffer layout {lay} does not match topk={topk}, shared={weights.num_shared}, "
                                f"hidden={weights.hidden}")
        self.weights, self.bufs, self.num_experts, self.topk = weights, bufs, num_experts, topk
        self.rsf = float(routed_scaling_factor)
        dev = bufs.buf.device
        self.device = dev
        self.config = (config or default_ep_config(lay.max_tokens, self.world, num_experts, topk))
        if not self.config.pool:
            raise EPKernelError(f"config {self.config.name}: the EP kernel needs a pool build (suffix _p)")
        self.config = dataclasses.replace(self.config, end_combine=True).validate()
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.grid = grid or sms
        T = lay.max_tokens
        shape = M.WorkspaceShape(weights.hidden, weights.inter, weights.num_total, lay.num_slots, self.world * T, sms)
        if lay.mode == "B" and lay.pairs_cap != shape.pairs_cap:
            raise EPKernelError(f"mode B: the layout's out_pool has {lay.pairs_cap} rows, this rank's workspace "
                                f"{shape.pairs_cap} (build the layout with SymLayout.for_group)")
        self.ws = M._alloc_workspace(shape, dev)
        self.ws.slots = torch.empty(0, dtype=torch.bfloat16, device=dev)  # the slots live in the symmetric buffer
        M._ensure_pool(self.ws)
        self.g_ids = torch.zeros(self.world * T * topk, dtype=torch.int32, device=dev)
        self.g_w = torch.zeros(self.world * T * topk, dtype=torch.float32, device=dev)
        self.pair_weight = torch.zeros(shape.pairs_cap, dtype=torch.float32, device=dev)
        from ...jit.runtime import get_kernel
        c = self.config
        spec = c.spec(weights.hidden, weights.inter, ep=True)
        self.plan_k, self.main_k = get_kernel(spec, M.PLAN_FUNCTION, dev), get_kernel(spec, M.FUNCTION, dev)
        rows = M.stage_rows(c.block_n)
        self.maps = (M._w13_map(weights.w13, rows), M._w2_map(weights.w2, rows),
                     M._rows_map(self.ws.pool, c.block_n, "pool"), M._rows_map(self.ws.act, c.block_n, "act"))
        self.handle = _register(self)

    def op(self, x8: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor,
           topk_weights: torch.Tensor) -> torch.Tensor:
        """The same call through torch.ops.glm5_fastpath.ep_mega_moe."""
        return torch.ops.glm5_fastpath.ep_mega_moe(x8, x_scale, topk_ids, topk_weights, self.handle)

    def close(self) -> None:
        """Drop the op's reference to this instance (its buffers are freed with the last reference)."""
        _INSTANCES.pop(getattr(self, "handle", 0), None)

    def __call__(self, x8: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
        lay, wt = self.bufs.layout, self.weights
        m = int(x8.shape[0]) if isinstance(x8, torch.Tensor) and x8.dim() == 2 else -1
        H, k = wt.hidden, self.topk
        if not 0 <= m <= lay.max_tokens:
            raise EPKernelError(f"rank {self.rank}: {m} tokens; the symmetric buffers hold {lay.max_tokens} per rank")
        _check("x (FP8 activations)", x8, (M.FP8,), (m, H))
        _check("x_scale", x_scale, (torch.float32,), (m, H // 128))
        _check("topk_ids", topk_ids, (torch.int32, torch.int64), (m, k))
        _check("topk_weights", topk_weights, (torch.float32,), (m, k))
        for t in (x8, x_scale, topk_ids, topk_weights):
            if t.device != self.device:
                raise EPKernelError(f"rank {self.rank}: inputs must be on {self.device}, got {t.device}")
        self.stage(x8, x_scale, topk_ids, topk_weights)
        out = torch.empty(m, H, dtype=torch.bfloat16, device=self.device)
        self._launch(m, out)
        return out

    def stage(self, x8: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """Copy this rank's inputs into its symmetric buffer, where the peers read them (stream-ordered before the plan
        kernel). A producer that writes x8 / x_scale straight into bufs.views can skip it."""
        m = int(x8.shape[0])
        if m:
            v = self.bufs.views
            v["x"][:m].copy_(x8)
            v["xs"][:m].copy_(x_scale)
            v["ids"][:m].copy_(topk_ids)
            v["w"][:m].copy_(topk_weights)

    def run_staged(self, m: int, out: torch.Tensor) -> torch.Tensor:
        """The kernels only, on inputs already in the symmetric buffer (stage): what the benchmark times, as DeepGEMM's
        fp8_mega_moe is timed without its input copy."""
        if not 0 <= m <= self.bufs.layout.max_tokens or tuple(out.shape) != (m, self.weights.hidden):
            raise EPKernelError(f"run_staged: m={m}, out {list(out.shape)}")
        self._launch(m, out)
        return out

    def params(self, m: int, out: torch.Tensor) -> M._Params:
        wt, ws, lay, v = self.weights, self.ws, self.bufs.layout, self.bufs.views
        wv = M._WeightViews(wt.w13, wt.w13_scale, wt.w2, wt.w2_scale, wt.hidden, wt.inter, wt.num_total)
        p = M._params(v["x"], v["xs"], v["ids"][:max(m, 1)], v["w"], wv, out, ws, wt.num_shared, self.rsf,
                      self.config.group_size, self.config.split_max_tiles(self.grid), M.FLAG_END_COMBINE)
        p.num_tokens = m
        o = lay.offsets
        for r, ptr in enumerate(self.bufs.peers):
            p.peer[r] = ptr
        p.sym_x, p.sym_xs, p.sym_w, p.sym_ids, p.sym_sig, p.sym_slots, p.sym_loc, p.sym_opool = (
            o[n] for n in ("x", "xs", "w", "ids", "sig", "slots", "loc", "opool"))
        p.ep_mode = MODES[lay.mode]
        p.slots = v["slots"].data_ptr()
        p.g_ids, p.g_w, p.pair_weight = self.g_ids.data_ptr(), self.g_w.data_ptr(), self.pair_weight.data_ptr()
        p.rank, p.world, p.ep_max_tokens = self.rank, self.world, lay.max_tokens
        return p

    def _launch(self, m: int, out: torch.Tensor) -> None:
        p = self.params(m, out)
        self.plan_k.launch((1, 1, 1), (M.PLAN_THREADS, 1, 1), [p], pdl=True)
        self.main_k.launch((self.grid, 1, 1), (M.THREADS, 1, 1), [*self.maps, p], smem=self.config.smem, pdl=True)

    def ctrl(self) -> dict[str, int]:
        c = self.ws.ctrl.tolist()
        return {"num_tasks": c[M.CTRL_NUM_TASKS], "claims": c[M.CTRL_CLAIMS], "tasks_done": c[M.CTRL_TASKS_DONE],
                "pool_rows": c[M.CTRL_POOL_ROWS], "pool_done": c[M.CTRL_POOL_DONE], "end_done": c[M.CTRL_END_DONE]}

    def epoch(self) -> int:
        return int(self.bufs.views["sig"][0])


def _register(inst: Any) -> int:
    h = _next_handle[0]
    _next_handle[0] += 1
    _INSTANCES[h] = inst
    return h


def _instance(handle: int) -> "EPMegaMoE":
    inst = _INSTANCES.get(int(handle))
    if inst is None:
        raise EPKernelError(f"ep_mega_moe: no EPMegaMoE with handle {handle} in this process (closed, or made in another)")
    return inst


@torch.library.custom_op("glm5_fastpath::ep_mega_moe", mutates_args=())
def _ep_mega_moe(x: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 handle: int) -> torch.Tensor:
    return _instance(handle)(x, x_scale, topk_ids, topk_weights)


@_ep_mega_moe.register_fake
def _ep_mega_moe_fake(x, x_scale, topk_ids, topk_weights, handle):
    inst = _instance(handle)
    if x.dim() != 2:
        raise EPKernelError(f"ep_mega_moe: x must be 2-D [M, H], got shape {list(x.shape)}")
    return x.new_empty((x.shape[0], inst.weights.hidden), dtype=torch.bfloat16)


def local_weight_stack(w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, rank: int, world: int,
                       num_shared: int = 1) -> M.MegaMoEWeights:
    """Rank r's MegaMoEWeights from a global checkpoint-layout stack [routed..., shared] (gate||up w13): its routed
    block, then the shared expert(s) (copied: the kernel's tensor maps need one contiguous stack)."""
    e = w13.shape[0] - num_shared
    if e % world:
        raise EPKernelError(f"{e} routed experts do not split over {world} ranks")
    epr = e // world
    sel = list(range(rank * epr, (rank + 1) * epr)) + list(range(e, e + num_shared))
    idx = torch.tensor(sel, device=w13.device)
    return M.prepare_weights(w13[idx], s13[idx], w2[idx], s2[idx], num_shared)


def simulate(ranks: Sequence[EPMegaMoE], inputs: Sequence[Sequence[torch.Tensor]],
             streams: Sequence[torch.cuda.Stream] | None = None) -> list[torch.Tensor]:
    """Run N simulated ranks on one GPU: rank r's call on stream r (they must run concurrently: the barriers spin);
    returns the outputs after a device synchronisation. N is limited by the device's hardware work queues
    (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): with more streams than queues two ranks' kernels could be queued one
    behind the other, and the first one's barrier would then wait (and trap) for a rank that cannot start."""
    import os
    queues = int(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8"))
    if len(ranks) > queues:
        raise EPKernelError(f"simulate: {len(ranks)} ranks > CUDA_DEVICE_MAX_CONNECTIONS={queues} hardware queues")
    streams = streams or [torch.cuda.Stream(ranks[0].device) for _ in ranks]
    cur = torch.cuda.current_stream(ranks[0].device)
    outs = []
    for r, (moe, inp) in enumerate(zip(ranks, inputs)):
        streams[r].wait_stream(cur)
        with torch.cuda.stream(streams[r]):
            outs.append(moe(*inp))
    torch.cuda.synchronize(ranks[0].device)
    return outs


def simulated_grid(world: int, num_sms: int) -> int:
    """CTAs per simulated rank: all ranks' persistent kernels plus their 1-CTA plan kernels must be resident at once."""
    return max(1, (num_sms - world) // world)


__all__ = ["EPBuffers", "EPKernelError", "EPMegaMoE", "MODES", "SymLayout", "default_ep_config", "local_weight_stack", "simulate",
           "simulated_grid", "SIG_WORDS", "EP_TOK_BITS"]
