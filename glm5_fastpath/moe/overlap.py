"""The decode MoE layer with the shared expert running while the router routes (opt-in: measured slower, see below).

    routed_mega_moe_overlap(h, x8, x_scale, gate, bias, router_cfg, weights) -> (out [M, H] bf16,
                                                                                 topk_ids [M, k] int32,
                                                                                 topk_weights [M, k] fp32)

Why: in a decode MoE layer the router (~9 us at 1 token on an H200) and MegaMoE's plan (~5 us) are latency-bound
kernels that leave HBM idle, while the shared expert's 37.75 MB (~9 us at 4.27 TB/s) does not depend on the routing
at all. Here the shared expert streams during the routing:

    current stream: plan_S -> MegaMoE_S (shared expert only, `shared_grid` CTAs) ------------------+
    side stream:    (x8 / h ready) -> router -> plan_R (routed pairs only) -------------------------+-> MegaMoE_R

- MegaMoE_S is MegaMoE's persistent kernel on fewer CTAs than SMs (default: all but the SMs the decode router's 128
  CTAs need at 3 per SM), planned with FLAG_SHARED_ONLY (the shared expert's pairs only; topk_ids are not read, so it
  may run before the router has written them). It has its own workspace (tag "<tag>+shared") but writes its slot
  values into MegaMoE_R's slot buffer and counts them on MegaMoE_R's combine counters.
- MegaMoE_R is planned with FLAG_ROUTED_ONLY (the routed pairs only). Its launch waits for plan_R (event) and follows
  MegaMoE_S on the current stream (PDL), so the shared slot values are complete and visible before its combine runs.
  The combine of a (token, row tile) is done by its S-th contributor, which is always in MegaMoE_R, and sums the same
  S slot values in the same order as the one-launch MegaMoE: the output equals mega_moe(x8, xs, moe_route(h)) bit for
  bit wherever both take the same split-K decision per FC1 tile (the same split_max_tiles is passed to both launches;
  tests/moe/test_overlap.py checks it on the GPU).
- The router runs without PDL on the side stream: a PDL router would be launched early, while the producer of h still
  runs, and its CTAs (one per SM) would hold the SMs MegaMoE_S needs.

Measured (H200, `bench moe-layer`, GLM-5 dims, 256 experts): bitwise equal to the one-launch chain and SLOWER by
6.7 / 18.0 us at 1 / 8 tokens (112.1 / 545.5 against 105.4 / 527.6 us; session 33 at ab80dc9) and by
6-44 us at 1 / 8 / 16 tokens with the shared launch on 64 / 88 / 110 CTAs (session 32). Splitting MegaMoE into two
persistent launches adds the second launch's ramp and tail (~8-10 us) while hiding only the router and plan (~8 us)
behind the shared expert. So it stays opt-in (GLM5_FASTPATH_MOE_OVERLAP), as a measured negative result.

Where it applies: the single-GPU MegaMoE builds without the token pool / end combine (the decode configs;
`supported`), with a shared expert, M <= 32 tokens: the decode router in one grid row of 128 CTAs (the ids are the
same bits whatever the row split: ops.moe_router). Not for SGLang's padded rows that must be
masked (expert parallelism): the shared launch does not read the ids that mark them.
"""
from __future__ import annotations

import threading

import torch

from ..ops import moe_router as R
from . import megamoe as MM

OP = "glm5_fastpath.routed_mega_moe_overlap"
SHARED_TAG_SUFFIX = "+shared"
ROUTER_SMS = 44  # SMs left to the router and the plans: the decode router's 128 CTAs at 3 per SM need 43
MAX_TOKENS = R.DECODE_SLICE_MAX  # the decode router in one grid row of 128 CTAs (tokens_per_cta = M)


class OverlapInputError(ValueError):
    pass


def _fail(msg: str) -> OverlapInputError:
    return OverlapInputError(f"{OP}: {msg}")


def default_shared_grid(num_sms: int) -> int:
    """CTAs of the shared-expert launch: every SM but the ROUTER_SMS the routing needs (at least 16)."""
    return max(16, num_sms - ROUTER_SMS)


def supported(m: int, router: R.RouterConfig, config: "MM.MegaMoEConfig", num_shared: int) -> bool:
    """Whether routed_mega_moe_overlap takes this call (module doc)."""
    return (num_shared == 1 and not config.pool and not config.end_combine and not config.diag and not config.pair
            and 1 <= m <= MAX_TOKENS and router.decode_supported)


_lock = threading.Lock()
_side: dict[int, torch.cuda.Stream] = {}


def _side_stream(dev: torch.device) -> torch.cuda.Stream:
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    s = _side.get(idx)
    if s is None:
        with _lock:
            s = _side.get(idx)
            if s is None:
                s = _side[idx] = torch.cuda.Stream(torch.device("cuda", idx))
    return s


def _shared_tag() -> str:
    return MM.current_workspace_tag() + SHARED_TAG_SUFFIX


def workspaces(dev: torch.device, hidden: int, inter: int, num_total: int, num_slots: int,
               m: int) -> tuple["MM.Workspace", "MM.Workspace"]:
    """(routed launch's, shared launch's) workspaces for M tokens under the current workspace tag."""
    args = (dev, hidden, inter, num_total, num_slots, m)
    ws_r = MM.get_workspace(*args)
    with MM.workspace_tag(_shared_tag()):
        ws_s = MM.get_workspace(*args)
    return ws_r, ws_s


@torch.library.custom_op("glm5_fastpath::routed_mega_moe_overlap", mutates_args=())
def _routed_mega_moe_overlap(h: torch.Tensor, x8: torch.Tensor, xs: torch.Tensor, gate: torch.Tensor,
                             bias: torch.Tensor, topk: int, w13: torch.Tensor, w13_scale: torch.Tensor,
                             w2: torch.Tensor, w2_scale: torch.Tensor, num_shared: int, routed_scaling_factor: float,
                             block_n: int, stages: int, group_size: int, split_waves: int, lean_fences: bool,
                             token_major: bool, shared_grid: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = MM.MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), False, 0,
                           bool(token_major), False).validate()
    rc = R._check_inputs(h, gate, bias, topk)
    m, hid = h.shape
    dev = h.device
    ids = torch.empty((m, topk), dtype=torch.int32, device=dev)
    wts = torch.empty((m, topk), dtype=torch.float32, device=dev)
    out = torch.empty((m, hid), dtype=torch.bfloat16, device=dev)
    if m == 0:
        return out, ids, wts
    if tuple(x8.shape) != (m, hid):
        raise _fail(f"x8 must be [M, H] = {[m, hid]} (h's FP8 quant), got {list(x8.shape)}")
    wv = MM._check_inputs(x8, xs, ids, wts, w13, w13_scale, w2, w2_scale, num_shared, routed_scaling_factor,
                          block_n, stages, group_size, split_waves)
    if num_shared != 1:
        raise _fail("the overlap needs the fused shared expert (num_shared=1)")
    if not rc.decode_supported or m > MAX_TOKENS:
        raise _fail(f"M={m}: the overlap routes with the decode router in one grid row (M <= {MAX_TOKENS}, "
                    "a router config it takes)")
    R._check_device(h, gate, bias, x8, xs, w13, w2)
    MM.require_hopper(OP, dev, _fail)
    sms = MM._sms(dev)
    if not 1 <= shared_grid <= sms:
        raise _fail(f"shared_grid={shared_grid} must be in [1, {sms}] (the SM count)")
    rsf = float(routed_scaling_factor)
    logits = torch.empty((m, rc.experts), dtype=torch.float32, device=dev)
    ws_r, ws_s = workspaces(dev, wv.hidden, wv.inter, wv.num_total, topk + num_shared, m)
    plan_k, main_k = MM._kernels_for(cfg, wv.hidden, wv.inter, dev)
    rows = MM.stage_rows(cfg.block_n)
    tm13, tm2 = MM._w13_map(wv.w13, rows), MM._w2_map(wv.w2, rows)
    split = cfg.split_max_tiles(sms)  # both launches: the one-launch kernel's split-K rule (module doc)
    cur = torch.cuda.current_stream(dev)
    side = _side_stream(dev)
    ready = torch.cuda.Event()
    ready.record(cur)  # h, x8, x_scale written
    # the shared expert on the current stream: its plan reads no ids, its persistent kernel holds shared_grid SMs
    p_s = MM._params(x8, xs, ids, wts, wv, out, ws_s, num_shared, rsf, cfg.group_size, split, MM.FLAG_SHARED_ONLY,
                     slots_ws=ws_r)
    plan_k.launch((1, 1, 1), (MM.PLAN_THREADS, 1, 1), [p_s], pdl=True)
    main_k.launch((shared_grid, 1, 1), (MM.THREADS, 1, 1), [tm13, tm2, tm2, tm2, p_s], smem=cfg.smem, pdl=True)
    # the routing on the side stream (no PDL: module doc), then the routed pairs' plan
    side.wait_event(ready)
    p_r = MM._params(x8, xs, ids, wts, wv, out, ws_r, num_shared, rsf, cfg.group_size, split, MM.FLAG_ROUTED_ONLY)
    with torch.cuda.stream(side):
        R._launch(rc, h, gate, bias, logits, ids, wts, None, rsf, False, decode=True, tokens_per_cta=m)
        plan_k.launch((1, 1, 1), (MM.PLAN_THREADS, 1, 1), [p_r], pdl=True)
        routed = torch.cuda.Event()
        routed.record(side)
    cur.wait_event(routed)
    # after MegaMoE_S on the current stream (PDL: its griddepcontrol.wait covers MegaMoE_S's slot stores)
    main_k.launch((sms, 1, 1), (MM.THREADS, 1, 1), [tm13, tm2, tm2, tm2, p_r], smem=cfg.smem, pdl=True)
    return out, ids, wts


@_routed_mega_moe_overlap.register_fake
def _routed_mega_moe_overlap_fake(h, x8, xs, gate, bias, topk, w13, w13_scale, w2, w2_scale, num_shared,
                                  routed_scaling_factor, block_n, stages, group_size, split_waves, lean_fences,
                                  token_major, shared_grid):
    MM.MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), False, 0, bool(token_major),
                     False).validate()
    R._check_inputs(h, gate, bias, topk)
    m, hid = h.shape
    return (h.new_empty((m, hid), dtype=torch.bfloat16), h.new_empty((m, topk), dtype=torch.int32),
            h.new_empty((m, topk), dtype=torch.float32))


def routed_mega_moe_overlap(h: torch.Tensor, x8: torch.Tensor, x_scale: torch.Tensor, gate: torch.Tensor,
                            bias: torch.Tensor, router_cfg, weights: "MM.MegaMoEWeights", *,
                            config: "MM.MegaMoEConfig | None" = None, shared_grid: int | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MoE block of one decode layer from h [M, H] bf16 and its 1x128 FP8 quant (x8, x_scale): (out [M, H] bf16,
    topk_ids [M, k] int32, topk_weights [M, k] fp32 without the routed scaling factor), the shared expert overlapped
    with the routing (module doc). config: the MegaMoE build (default: moe.default_config for M); shared_grid: CTAs of
    the shared-expert launch (default: default_shared_grid). Raises for a call it does not take (`supported`)."""
    k = R._check_cfg(h, router_cfg)
    rc = R._check_inputs(h, gate, bias, k)
    if not isinstance(weights, MM.MegaMoEWeights):
        raise _fail(f"weights must be a MegaMoEWeights (moe.prepare_weights), got {type(weights).__name__}")
    if weights.num_experts != rc.experts or weights.hidden != rc.hidden:
        raise _fail(f"the gate scores {rc.experts} experts of H={rc.hidden}; the expert weights hold "
                    f"{weights.num_experts} routed ones of H={weights.hidden}")
    m = int(h.shape[0])
    sms = MM._sms(h.device) if h.is_cuda else 132
    if config is None:
        config = MM.default_config(max(m, 1), weights.num_experts, k, weights.num_shared, sms, weights.inter)
    if m and not supported(m, rc, config, weights.num_shared):
        raise _fail(f"M={m}, config {config.name}, {weights.num_shared} shared expert(s): not taken (moe.overlap."
                    "supported: a shared expert, no token pool / end combine, the decode router)")
    grid = default_shared_grid(sms) if shared_grid is None else int(shared_grid)
    return torch.ops.glm5_fastpath.routed_mega_moe_overlap(
        h, x8, x_scale, gate, bias, k, weights.w13, weights.w13_scale, weights.w2, weights.w2_scale,
        weights.num_shared, float(router_cfg.routed_scaling_factor), config.block_n, config.stages, config.group_size,
        config.split_waves, config.lean_fences, config.token_major, grid)


def precompile(weights: "MM.MegaMoEWeights", topk: int, configs, max_tokens: int, device=None) -> None:
    """Kernels, both workspaces (routed, shared), the router's and the side stream, outside any CUDA-graph capture."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    MM.precompile(weights, topk, max_tokens=max_tokens, device=dev, configs=list(configs))
    workspaces(dev, weights.hidden, weights.inter, weights.num_total, topk + weights.num_shared, max_tokens)
    R._workspace(R.config_for(weights.hidden, weights.num_experts, topk), dev)
    _side_stream(dev)
