"""MoE router: logits, sigmoid + correction-bias top-k and renormalised weights in one kernel, as a
torch.library custom op (the reference is glm5_fastpath.ref.moe.route, same signature).

Math (spec/glm5_layer.md section 6; n_group = topk_group = 1, so there is no group stage):

    l[m, e]  = sum_k fp32(h[m, k]) * fp32(gate[e, k])          fp32 accumulation, written as `logits`
    s        = sigmoid(l) (fp32)          choice = s + bias   (the bias only steers the selection)
    ids      = top-k of choice by descending choice; exact ties: the lower expert id first
    w        = s[ids] / (sum s[ids] + 1e-20)   (UNBIASED scores; norm_topk_prob)
    scaled   = fp32(w * routed_scaling_factor)  (2.5 for GLM-5; only from moe_route_scaled)

`topk_weights` is the reference's w WITHOUT routed_scaling_factor: like SGLang's moe_sum_reduce, the
consumer applies x2.5 in the combine. `moe_route_scaled` additionally returns `scaled` = w * 2.5 (one
fp32 multiply in the kernel, bitwise equal to torch's `w * 2.5`) for a consumer that folds the factor
into the routing weight; such a consumer must NOT scale again in its combine (and the fused shared
expert then takes weight 1.0, not 1/2.5).

Inputs: h [M, H] bf16 contiguous, gate [E, H] bf16 contiguous, bias [E] fp32 contiguous, all on one
sm_90+ device; H a multiple of 256 (GLM-5 6144, small preset 512); E a multiple of 32, or a multiple
of 4 up to 32 (GLM-5 256, small 16); 1 <= top-k <= min(32, E); 0 <= M <= 256. cfg.norm_topk_prob must be
True (GLM-5's setting; the kernel always renormalises). M is capped at 256 (decode batches): the
split-K workspace holds 8 token tiles (6.3 MB of fp32 partials for GLM-5), and past 256 tokens every
extra 32-token tile re-streams the 3.15 MB gate from L2, where a tiled GEMM (cuBLAS) plus a separate
top-k kernel is the better tool.

Kernel (csrc/moe/router.{cuh,cu}): grid (H/256 K chunks, E/32 expert groups, ceil(M/32) token
tiles) of 256-thread CTAs running C0's split-K bf16 mma.sync tile (csrc/attn_pre/c0_head_gate.cuh) on
32 experts; two levels of last-arriving-CTA reduction (splits -> logits columns, then expert groups
-> the top-k epilogue of a token tile), in fixed orders: bitwise deterministic. The gate weights are
loaded before griddepcontrol.wait (PDL), h and everything else after it. No host synchronisation:
capture-safe in CUDA graphs.

Decode variant (glm5_moe_router_decode, RouterDecodeTile in the same .cuh / cubin), for 1 <= M <= 32: one
CTA per E / (8 / min(4, H/256)) experts (128 CTAs for GLM-5) computes whole-K dot products (CUDA-core fp32
FMAs) and the last CTA to arrive runs the same top-k epilogue: one arrival level instead of two plus the split
partials (the engine profile showed ~11 us per layer at 1 token for the split-K kernel). Bitwise deterministic,
but another summation order than the split-K kernel. GPU-tested on an H200 (2026-11-30); `bench router` there
(benchmarks/results/2026-11-30_h200_session6/run1_3292de4/router): 8.7 / 9.6 / 11.6 / 15.9 us against the split-K
kernel's 9.9 / 10.0 / 10.2 / 10.7 us at M = 1 / 2 / 4 / 8 (its per-token loop is serial), so decode=None takes
it for M <= DECODE_AUTO_MAX_TOKENS only; GLM5_FASTPATH_ROUTER_DECODE=1 takes it up to 32 tokens, =0 never.
Since session 7 the decode kernel deals the tokens over up to DECODE_SLICES grid rows (decode_tokens_per_cta:
3 x 128 CTAs, one wave), so its per-token loop runs ceil(M / 3) tokens instead of M; the logits are bitwise those of
one row. Timed on the H200 (2026-11-30, session 8, benchmarks/results/2026-11-30_h200_session8/): 8.77 / 9.11 /
9.54 / 11.05 us against split-K's 10.14 / 10.21 / 10.33 / 10.93 at M = 1 / 2 / 4 / 8, so DECODE_AUTO_MAX_TOKENS
is 4 (was 2). From 16 tokens both are slower than the stock F.linear + biased_grouped_topk (17.4 / 16.2 vs 12.8 us
at 16, 31.2 / 27.0 vs 13.4 at 32): the top-k epilogue of the last CTA is serial per token; SGLang's own decode
router in the engine (~35 us per layer, the 2026-11-29 profile) is slower still.

Top-k epilogue (session 9): branch-free keyed selection (RouterTile::select_key: a u64 whose unsigned order is
the selection order; per round the lane max, a butterfly max, the owner zeroes the winner), 2 tokens per warp
pass in the split-K kernel and 1 in the decode kernel (register caps). Same ids / weights as the branchy loop it
replaced (GPU tests 79/79, H200). Same run (benchmarks/results/2026-11-30_h200_session9/c5_7861ab5), split-K
8.73 / 8.86 / 9.50 / 12.79 / 20.90 / 23.50 / 27.37 us against 9.94 / 10.25 / 10.77 / 16.04 / 26.77 / 28.13 /
33.69 at M = 1 / 4 / 8 / 16 / 32 / 64 / 128; decode 7.88 / 8.62 / 10.19 / 15.55 / 27.35 against 8.61 / 9.38 /
10.88 / 17.20 / 30.99 at M = 1 / 4 / 8 / 16 / 32 (stock 11.6-13.5 flat). Interleaving the old branchy loop over
4 tokens was slower (each extra token slot ~4.5 us of one warp; c4_9a43f1f). Still open: the split-K kernel
grows ~4 us per extra token per warp from 16 tokens (stock is flat), so from 32 tokens it trails the stock
F.linear + biased_grouped_topk by 7.6-13.9 us; where that time goes is not measured yet.

Workspace: one per (device, H, E, k): fp32 partials [8][E/32][H/256][32][32] + uint32 counters
[8 * E/32 + 8 + 1] (the last: the decode kernel's arrival counter), allocated and zeroed once on first use (or by precompile()). Counters return to zero at
the end of every launch. As for C0, launches on one device must not run concurrently on two streams;
a PDL-overlapped next launch on the same stream is safe.

Router + MegaMoE input quant (moe_route_quant, op glm5_fastpath::moe_router_quant): both kernels can also write
h's per-token 1x128 FP8 quant (x8 [M, H] e4m3 + x_scale [M, H/128] fp32) with act_quant.cuh's group tile, bit for
bit act_quant_fp8(h): the split-K kernel's expert-group-0 CTAs quantize their (token tile, 256-column) slice, the
decode kernel deals the M x H/128 groups over all CTAs. The MoE executor takes it with GLM5_FASTPATH_ROUTER_QUANT=1
(off until its GPU test has run): one kernel less per MoE layer.

Ops: torch.ops.glm5_fastpath.moe_router(h, gate, bias, topk, routed_scaling_factor, pdl=True, decode=None)
-> (topk_ids [M, k] int32, topk_weights [M, k] fp32, logits [M, E] fp32, scaled [M, k] fp32), functional,
with a fake implementation. Python entry points: moe_route(h, gate, bias, cfg, *, pdl=True) ->
(topk_ids, topk_weights, logits) and moe_route_scaled(...) -> (topk_ids, topk_weights, logits, scaled).
"""
from __future__ import annotations

import ctypes
import functools
import statistics
import threading
from dataclasses import dataclass

import torch

from ._device import device_index as _device_index, require_aligned, require_hopper
from ..config import ACT_QUANT_EPS
from ..jit import KernelSpec, env

OP = "glm5_fastpath.moe_router"
SOURCE = "moe/router.cu"
FUNCTION = "glm5_moe_router"
FUNCTION_DECODE = "glm5_moe_router_decode"
DECODE_MAX_TOKENS = 32  # the largest M the decode kernel is chosen for (its grid rows deal up to 256 tokens)
DECODE_SLICE_MAX = 32  # RouterDecodeTile::kMaxTokens: tokens of one grid row
DECODE_SLICES = 3  # grid rows of the decode kernel at most (decode_tokens_per_cta)
DECODE_AUTO_MAX_TOKENS = 4  # decode=None, env unset: measured faster than split-K up to here (module doc)
ENV_DECODE = "GLM5_FASTPATH_ROUTER_DECODE"
MAX_TOKENS = 256
K_CHUNK = 256  # columns per CTA (RouterTile::kKChunk)
TOK_TILE = 32  # tokens per CTA (RouterTile::kTokTile)
GROUP = 32  # experts per CTA (RouterTile::kGroupExperts when E >= 32)
THREADS = 256
MAX_TILES = MAX_TOKENS // TOK_TILE  # RouterTile::kMaxTiles
MAX_SPLITS = 64  # the C0 tile's static_assert (the last CTA holds one float4 per split in registers)


@dataclass(frozen=True)
class RouterConfig:
    hidden: int
    experts: int
    topk: int

    @property
    def splits(self) -> int:
        return self.hidden // K_CHUNK

    @property
    def group_experts(self) -> int:
        return min(GROUP, self.experts)

    @property
    def groups(self) -> int:
        return self.experts // self.group_experts

    @property
    def partial_floats(self) -> int:
        return MAX_TILES * self.groups * self.splits * TOK_TILE * self.group_experts

    @property
    def counter_words(self) -> int:  # RouterTile::kCounterWords + the decode kernel's arrival counter
        return MAX_TILES * self.groups + MAX_TILES + 1

    @property
    def decode_experts_per_cta(self) -> int:  # RouterDecodeTile::kEpc = 8 / kKParts
        chunks = self.hidden // K_CHUNK
        parts = 4 if chunks % 4 == 0 else (2 if chunks % 2 == 0 else 1)
        return 8 // parts

    @property
    def decode_supported(self) -> bool:  # RouterDecodeTile::kSupported
        return self.experts % self.decode_experts_per_cta == 0

    @property
    def decode_ctas(self) -> int:  # RouterDecodeTile::kCtas
        return self.experts // self.decode_experts_per_cta if self.decode_supported else 1

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE, functions=(FUNCTION, FUNCTION_DECODE),
                          defines=(("GLM5_ROUTER_HIDDEN", str(self.hidden)), ("GLM5_ROUTER_EXPERTS", str(self.experts)),
                                   ("GLM5_ROUTER_TOPK", str(self.topk))))

    @functools.cached_property
    def phase_spec(self) -> KernelSpec:
        """The diagnostic build with per-CTA phase marks (GLM5_ROUTER_PHASES; phase_build / read_phases)."""
        return self.variant_spec(phases=True)

    def variant_spec(self, phases: bool = False, rounds: bool = False) -> KernelSpec:
        """Diagnostic builds: phases = per-CTA phase marks (GLM5_ROUTER_PHASES); rounds = the top-k epilogue's round
        loop instead of the bitonic merge (GLM5_ROUTER_TOPK_ROUNDS, router.cuh topk_pass), for A/B and bitwise tests."""
        extra = (("GLM5_ROUTER_PHASES", "1"),) if phases else ()
        extra += (("GLM5_ROUTER_TOPK_ROUNDS", "1"),) if rounds else ()
        if not extra:
            return self.spec
        return KernelSpec(FUNCTION, source=SOURCE, functions=(FUNCTION, FUNCTION_DECODE),
                          defines=self.spec.defines + extra)


def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def config_for(hidden: int, experts: int, topk: int) -> RouterConfig:
    if hidden <= 0 or hidden % K_CHUNK or hidden // K_CHUNK > MAX_SPLITS:
        raise _fail(f"hidden size H={hidden} is not supported: H must be a positive multiple of {K_CHUNK} "
                    f"and at most {K_CHUNK * MAX_SPLITS} (GLM-5: 6144, small preset: 512)")
    if experts < 4 or (experts > GROUP and experts % GROUP) or (experts <= GROUP and experts % 4):
        raise _fail(f"{experts} routed experts are not supported: need a multiple of {GROUP}, or a multiple of 4 "
                    f"up to {GROUP} (GLM-5: 256, small preset: 16)")
    if topk < 1 or topk > min(32, experts):
        raise _fail(f"top-k={topk} is not supported: need 1 <= top-k <= min(32, experts={experts}) (GLM-5: 8)")
    return RouterConfig(int(hidden), int(experts), int(topk))


def decode_enabled() -> bool | None:
    """GLM5_FASTPATH_ROUTER_DECODE: 1 = the decode kernel for M <= 32, 0 = never, unset = auto (M <= 2)."""
    import os

    v = os.environ.get(ENV_DECODE, "").strip().lower()
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no"):
        return False
    if v and v not in ("auto",):
        _warn_bad_decode_env(v)
    return None


@functools.lru_cache(maxsize=None)
def _warn_bad_decode_env(value: str) -> None:
    import logging

    logging.getLogger("glm5_fastpath").warning(
        "glm5_fastpath: %s=%r is not one of 1 / 0 / auto; using auto (the decode router kernel at 1-%d tokens)",
        ENV_DECODE, value, DECODE_AUTO_MAX_TOKENS)


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _check_tensor(name: str, t: object, dtype: torch.dtype, dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise _fail(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise _fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise _fail(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
    return t


def _check_inputs(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, topk: int) -> RouterConfig:
    _check_tensor("h", h, torch.bfloat16, 2)
    _check_tensor("gate", gate, torch.bfloat16, 2)
    _check_tensor("bias (e_score_correction_bias)", bias, torch.float32, 1)
    m, hid = h.shape
    e, hg = gate.shape
    if hg != hid:
        raise _fail(f"gate has {hg} columns but h has H={hid} (gate must be [experts, H])")
    if bias.shape[0] != e:
        raise _fail(f"bias has {bias.shape[0]} entries but gate has {e} experts")
    if m > MAX_TOKENS:
        raise _fail(f"M={m} tokens exceeds the supported maximum of {MAX_TOKENS} (decode batch; use a tiled GEMM "
                    "and a separate top-k for prefill)")
    devs = {h.device, gate.device, bias.device}
    if len(devs) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    return config_for(int(hid), int(e), int(topk))


def _check_cfg(h: torch.Tensor, cfg) -> int:
    if not getattr(cfg, "norm_topk_prob", True):
        raise _fail("cfg.norm_topk_prob=False is not supported (the kernel always renormalises; GLM-5 sets True)")
    if int(getattr(cfg, "n_group", 1) or 1) != 1 or int(getattr(cfg, "topk_group", 1) or 1) != 1:
        raise _fail("grouped top-k (n_group/topk_group > 1) is not supported (GLM-5 uses n_group = topk_group = 1)")
    if isinstance(h, torch.Tensor) and h.dim() == 2 and h.shape[1] != cfg.hidden_size:
        raise _fail(f"h has H={h.shape[1]} columns but cfg.hidden_size={cfg.hidden_size}")
    return int(cfg.num_experts_per_tok)


def _check_device(*ts: torch.Tensor) -> None:
    dev = ts[0].device
    require_hopper(OP, dev, _fail)
    require_aligned(_fail, {f"tensor {i}": t for i, t in enumerate(ts)})


# ---- workspace and kernels (cached per device) ----------------------------------------------------

@dataclass
class _Workspace:
    partials: torch.Tensor  # fp32 [MAX_TILES * groups * splits * 32 * group_experts]
    counters: torch.Tensor  # int32 (uint32 in the kernel) [counter_words], zero between launches


_lock = threading.Lock()
_workspaces: dict[tuple[int, RouterConfig], _Workspace] = {}
_kernels: dict[tuple[RouterConfig, int, str], object] = {}


def _workspace(cfg: RouterConfig, device: torch.device) -> _Workspace:
    idx = _device_index(device)
    key = (idx, cfg)
    ws = _workspaces.get(key)
    if ws is None:
        with _lock:
            ws = _workspaces.get(key)
            if ws is None:
                dev = torch.device("cuda", idx)
                ws = _Workspace(torch.empty(cfg.partial_floats, dtype=torch.float32, device=dev),
                                torch.zeros(cfg.counter_words, dtype=torch.int32, device=dev))
                _workspaces[key] = ws
    return ws


def _kernel(cfg: RouterConfig, device: torch.device, function: str = FUNCTION, phases: bool | None = None):
    """phases None: this thread's phase_build setting; the top-k variant: this thread's topk_rounds_build setting or
    GLM5_FASTPATH_ROUTER_TOPK_ROUNDS=1."""
    idx = _device_index(device)
    ph = bool(getattr(_phase, "on", False)) if phases is None else phases
    rounds = bool(getattr(_phase, "rounds", False)) or env.flag("GLM5_FASTPATH_ROUTER_TOPK_ROUNDS")
    tag = function + ("+phases" if ph else "") + ("+rounds" if rounds else "")
    k = _kernels.get((cfg, idx, tag))
    if k is None:
        env.print_config("moe_router", {"H": cfg.hidden, "experts": cfg.experts, "topk": cfg.topk},
                         {"threads": THREADS, "k_chunk": K_CHUNK, "splits": cfg.splits, "groups": cfg.groups,
                          "tok_tile": TOK_TILE, "grid": f"({cfg.splits}, {cfg.groups}, ceil(M/{TOK_TILE}))"})
        from ..jit.runtime import get_kernel
        k = get_kernel(cfg.variant_spec(phases=ph, rounds=rounds), function, device=torch.device("cuda", idx))
        _kernels[(cfg, idx, tag)] = k
    return k


# ---- phase marks (diagnostics) ----------------------------------------------------------------------------------

_phase = threading.local()
PHASE_NAMES = ("entry", "past_wait", "part_stored", "won_last", "topk_done", "level1_done",
               "topk_keys_built")  # router.cuh's marks
MAX_PHASE_CTAS = 1024  # kMaxPhaseCtas of router.cu


class phase_build:
    """Context manager (diagnostics): router launches of this thread inside run the GLM5_ROUTER_PHASES build, whose
    thread 0 of every CTA records %globaltimer at router.cuh's marks; read them with read_phases(cfg, device, function)
    after the launch (reset_phases before it). Same outputs as the normal build."""

    def __enter__(self) -> "phase_build":
        self._prev = getattr(_phase, "on", False)
        _phase.on = True
        return self

    def __exit__(self, *exc: object) -> None:
        _phase.on = self._prev


class topk_rounds_build:
    """Context manager (diagnostics): router launches of this thread inside run the GLM5_ROUTER_TOPK_ROUNDS build, the
    top-k epilogue's round loop that the bitonic merge replaced (same ids, weights, logits: the GPU tests check it
    bitwise; `glm5-fastpath bench router --topk-rounds` times it against the default). Composes with phase_build."""

    def __enter__(self) -> "topk_rounds_build":
        self._prev = getattr(_phase, "rounds", False)
        _phase.rounds = True
        return self

    def __exit__(self, *exc: object) -> None:
        _phase.rounds = self._prev


def reset_phases(cfg: RouterConfig, device=None, function: str = FUNCTION_DECODE) -> None:
    """Zero the phase build's marks (before the launch read_phases will read); the build this thread's
    topk_rounds_build setting selects."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    _kernel(cfg, dev, function, phases=True).module.copy_global("router_phase_ns")


def read_phases(cfg: RouterConfig, ctas: int, device=None, function: str = FUNCTION_DECODE) -> torch.Tensor:
    """[min(ctas, MAX_PHASE_CTAS), 8] int64 of the phase build's last launch: columns PHASE_NAMES in ns of
    %globaltimer (0 where a CTA did not reach a mark), column 7 the SM id; from the build this thread's topk_rounds_build
    setting selects (call it inside the same context as the launch)."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    out = torch.zeros(min(ctas, MAX_PHASE_CTAS), 8, dtype=torch.int64, device=dev)
    _kernel(cfg, dev, function, phases=True).module.copy_global("router_phase_ns", out)
    return out


def phase_summary(marks) -> dict:
    """Where one router launch's time went, from read_phases' rows (a [ctas, 8] tensor or nested lists; us, relative
    to the first CTA's entry): launch spread (last entry), wait released (median / last past_wait), the CTAs' own work
    (median of part_stored - past_wait), the last arrival (the latest part_stored), the winner's start and end of
    the top-k epilogue, its load part (topk_loads_us: won_last to keys built), and the whole launch (top-k end). Rows
    that never reached entry are ignored."""
    rows = [list(map(int, r)) for r in (marks.tolist() if hasattr(marks, "tolist") else marks)]
    rows = [r for r in rows if r[0] > 0]
    if not rows:
        return {"ctas": 0}
    t0 = min(r[0] for r in rows)
    us = lambda v: (v - t0) / 1e3  # noqa: E731

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    waited = [r for r in rows if r[1] > 0]
    stored = [r for r in rows if r[2] > 0]
    won = [r for r in rows if r[3] > 0]
    done = [r for r in rows if r[4] > 0]
    l1 = [r for r in rows if r[5] > 0]
    out: dict = {"ctas": len(rows), "sms": len({r[7] for r in rows}),
                 "last_entry_us": max(us(r[0]) for r in rows),
                 "wait_released_median_us": med([us(r[1]) for r in waited]),
                 "wait_released_last_us": max((us(r[1]) for r in waited), default=None),
                 "own_work_median_us": med([(r[2] - r[1]) / 1e3 for r in stored if r[1] > 0]),
                 "last_part_stored_us": max((us(r[2]) for r in stored), default=None),
                 "level1_done_last_us": max((us(r[5]) for r in l1), default=None),
                 "topk_start_us": max((us(r[3]) for r in won), default=None),
                 "topk_end_us": max((us(r[4]) for r in done), default=None)}
    if out["topk_start_us"] is not None and out["topk_end_us"] is not None:
        out["topk_us"] = out["topk_end_us"] - out["topk_start_us"]
    keys = [r for r in won if len(r) > 6 and r[6] > 0]
    if keys:  # the winner's load part of the epilogue (mark 6: logits and bias loaded, keys built)
        out["topk_loads_us"] = (keys[0][6] - keys[0][3]) / 1e3
    return out


def _kernel_args(h, gate, bias, logits, ids, weights, scaled, ws: _Workspace, rsf: float, x8=None,
                 x_scale=None, tokens_per_cta: int = 0) -> tuple:
    """The kernels' parameter list, in csrc/moe/router.cu order (checked at load). x8 / x_scale None: no quant.
    tokens_per_cta: the decode kernel's token slice per grid row (ignored by the split-K kernel)."""
    return (h, gate, bias, logits, ids, weights, scaled, ws.partials, ws.counters,
            ctypes.c_int32(h.shape[0]), ctypes.c_float(rsf), x8, x_scale, ctypes.c_float(ACT_QUANT_EPS),
            ctypes.c_int32(tokens_per_cta))


def decode_tokens_per_cta(m: int) -> int:
    """Tokens of one decode-kernel grid row (RouterDecodeTile::run deals them in y): at most DECODE_SLICES rows
    (3 x 128 CTAs of 256 threads at ~73 registers: one wave at 3 CTAs per SM, so every CTA loads its gate weights
    before griddepcontrol.wait), each row a whole number of the kernel's two-token passes where possible."""
    m = max(m, 1)
    rows = min(DECODE_SLICES, -(-m // 2))
    t = -(-m // rows)
    return min(DECODE_SLICE_MAX, t + (t & 1) if m > 1 else 1)  # even: whole two-token passes (m=7: 2 rows of 4)


def use_decode(m: int, decode: bool | None, cfg: RouterConfig | None = None) -> bool:
    """Which kernel a call with M tokens runs: the decode one for 1 <= M <= 32 when asked (decode=True) or, with
    decode=None, when GLM5_FASTPATH_ROUTER_DECODE=1, or for M <= DECODE_AUTO_MAX_TOKENS when that variable is
    unset; only if the config is one it takes (cfg.decode_supported); the split-K one otherwise."""
    if decode is None:
        env = decode_enabled()
        limit = DECODE_MAX_TOKENS if env else (DECODE_AUTO_MAX_TOKENS if env is None else 0)
    else:
        limit = DECODE_MAX_TOKENS if decode else 0
    return 1 <= m <= limit and (cfg is None or cfg.decode_supported)


def _launch(cfg: RouterConfig, h, gate, bias, logits, ids, weights, scaled, rsf: float, pdl: bool,
            decode: bool | None = None, x8=None, x_scale=None, tokens_per_cta: int | None = None) -> None:
    """tokens_per_cta (decode kernel only): tokens per grid row instead of decode_tokens_per_cta(M) (moe/overlap.py
    asks for one row: 128 CTAs, so the routing fits beside the shared expert's launch)."""
    _check_device(h, gate, bias, logits, ids, weights, *(t for t in (scaled, x8, x_scale) if t is not None))
    m = h.shape[0]
    if m == 0:
        return
    ws = _workspace(cfg, h.device)
    if use_decode(m, decode, cfg):
        tpc = decode_tokens_per_cta(m) if tokens_per_cta is None else int(tokens_per_cta)
        if not 1 <= tpc <= DECODE_SLICE_MAX:
            raise _fail(f"tokens_per_cta={tpc} must be in [1, {DECODE_SLICE_MAX}] (RouterDecodeTile::kMaxTokens)")
        args = _kernel_args(h, gate, bias, logits, ids, weights, scaled, ws, rsf, x8, x_scale, tpc)
        _kernel(cfg, h.device, FUNCTION_DECODE).launch((cfg.decode_ctas, -(-m // tpc), 1), (THREADS, 1, 1), args,
                                                       pdl=pdl)
        return
    args = _kernel_args(h, gate, bias, logits, ids, weights, scaled, ws, rsf, x8, x_scale)
    _kernel(cfg, h.device).launch((cfg.splits, cfg.groups, -(-m // TOK_TILE)), (THREADS, 1, 1), args, pdl=pdl)


# ---- custom op --------------------------------------------------------------------------------------

def _outputs(h: torch.Tensor, cfg: RouterConfig):
    m, dev = h.shape[0], h.device
    return (torch.empty((m, cfg.topk), dtype=torch.int32, device=dev),
            torch.empty((m, cfg.topk), dtype=torch.float32, device=dev),
            torch.empty((m, cfg.experts), dtype=torch.float32, device=dev),
            torch.empty((m, cfg.topk), dtype=torch.float32, device=dev))


@torch.library.custom_op("glm5_fastpath::moe_router", mutates_args=())
def _moe_router(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, topk: int, routed_scaling_factor: float,
                pdl: bool = True, decode: bool | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _check_inputs(h, gate, bias, topk)
    ids, w, logits, scaled = _outputs(h, cfg)
    _launch(cfg, h, gate, bias, logits, ids, w, scaled, float(routed_scaling_factor), pdl, decode)
    return ids, w, logits, scaled


@_moe_router.register_fake
def _moe_router_fake(h, gate, bias, topk, routed_scaling_factor, pdl=True, decode=None):
    cfg = _check_inputs(h, gate, bias, topk)
    m = h.shape[0]
    return (h.new_empty((m, cfg.topk), dtype=torch.int32), h.new_empty((m, cfg.topk), dtype=torch.float32),
            h.new_empty((m, cfg.experts), dtype=torch.float32), h.new_empty((m, cfg.topk), dtype=torch.float32))


@torch.library.custom_op("glm5_fastpath::moe_router_quant", mutates_args=())
def _moe_router_quant(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, topk: int,
                      routed_scaling_factor: float, pdl: bool = True, decode: bool | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _check_inputs(h, gate, bias, topk)
    ids, w, logits, scaled = _outputs(h, cfg)
    x8, xs = _quant_outputs(h)
    _launch(cfg, h, gate, bias, logits, ids, w, scaled, float(routed_scaling_factor), pdl, decode, x8, xs)
    return ids, w, logits, scaled, x8, xs


@_moe_router_quant.register_fake
def _moe_router_quant_fake(h, gate, bias, topk, routed_scaling_factor, pdl=True, decode=None):
    ids, w, logits, scaled = _moe_router_fake(h, gate, bias, topk, routed_scaling_factor, pdl, decode)
    m, hid = h.shape
    return (ids, w, logits, scaled, h.new_empty((m, hid), dtype=torch.float8_e4m3fn),
            h.new_empty((m, hid // 128), dtype=torch.float32))


def _quant_outputs(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from .act_quant import _new_outputs  # act_quant_fp8's own output shapes: the same tile writes them

    return _new_outputs(h)


def moe_route_quant(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, cfg, *, pdl: bool = True,
                    decode: bool | None = None) -> tuple[torch.Tensor, ...]:
    """moe_route plus h's per-token 1x128 FP8 quant from the same kernel (what MegaMoE takes as its input):
    (topk_ids [M, k] int32, topk_weights [M, k] fp32, logits [M, E] fp32, x8 [M, H] e4m3, x_scale [M, H/128] fp32).
    x8 / x_scale are bit for bit ops.act_quant.act_quant_fp8(h) (the same group tile, csrc/moe/act_quant.cuh)."""
    k = _check_cfg(h, cfg)
    _check_inputs(h, gate, bias, k)
    if decode is not None and not isinstance(decode, bool):
        raise _fail(f"decode must be None or a bool, got {decode!r}")
    ids, w, logits, _, x8, xs = torch.ops.glm5_fastpath.moe_router_quant(h, gate, bias, k,
                                                                         float(cfg.routed_scaling_factor), pdl, decode)
    return ids, w, logits, x8, xs


def moe_route_scaled(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, cfg, *, pdl: bool = True,
                     decode: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(topk_ids [M, k] int32, topk_weights [M, k] fp32 (no rsf), logits [M, E] fp32,
    scaled [M, k] fp32 = topk_weights * cfg.routed_scaling_factor). decode: None (GLM5_FASTPATH_ROUTER_DECODE,
    unset: the decode kernel at 1-2 tokens), True / False: the decode kernel for M <= 32 or not (use_decode)."""
    k = _check_cfg(h, cfg)
    _check_inputs(h, gate, bias, k)  # before the dispatcher, so errors name this op even for odd inputs
    if decode is not None and not isinstance(decode, bool):
        raise _fail(f"decode must be None or a bool, got {decode!r}")
    return torch.ops.glm5_fastpath.moe_router(h, gate, bias, k, float(cfg.routed_scaling_factor), pdl, decode)


def moe_route(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, cfg, *, pdl: bool = True,
              decode: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ref.moe.route on the GPU: (topk_ids [M, k] int32 by descending choice, topk_weights [M, k] fp32
    normalised WITHOUT routed_scaling_factor, logits [M, E] fp32)."""
    ids, w, logits, _ = moe_route_scaled(h, gate, bias, cfg, pdl=pdl, decode=decode)
    return ids, w, logits


def precompile(device: object = None, shapes: tuple[tuple[int, int, int], ...] = ((6144, 256, 8),)) -> None:
    """Compile (or fetch from cache) and load the kernel for these (H, experts, top-k) on `device`, and
    allocate its workspace, ahead of first use (and outside any CUDA-graph capture)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h, e, k in shapes:
        cfg = config_for(h, e, k)
        _kernel(cfg, dev)
        _kernel(cfg, dev, FUNCTION_DECODE)
        _workspace(cfg, dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: GLM-5 (6144, 256 experts, top-8), the small preset (512, 16
    experts, top-4) and GLM-5's phase-mark build."""
    return [config_for(6144, 256, 8).spec, config_for(512, 16, 4).spec, config_for(6144, 256, 8).phase_spec]
