"""`glm5-fastpath bench fp8-linear`: the block-FP8 linears outside the attention prefix at decode sizes, ours vs
SGLang's, vs the bytes floor.

Shapes, from the model config (--preset, default glm5, or --config PATH), each an [M, K] x [N, K]^T linear:
- o_proj:        N = hidden_size,             K = num_attention_heads * v_head_dim;
- dense_gate_up: N = 2 * intermediate_size,   K = hidden_size  (SGLang's merged [gate; up] weight of a dense layer);
- dense_down:    N = hidden_size,             K = intermediate_size.
Weights: layer 0's synthetic-checkpoint tensors (weights.generate_tensor, std K^-0.5, quantised to e4m3 with fp32
128x128 block scales [ceil(N/128), K/128]: what `make-checkpoint` writes for the same --seed), copied to enough
distinct buffers that the weights one graph replay reads exceed 2x L2 (at least 2 copies, so consecutive launches
never read the same weights): they come from HBM as in a decode step. x: random bf16 [M, K] (the first M rows of
one draw per shape, never zeros; the previous kernel's output, small and L2-resident in a real step as here).
- ours:  integrations.sglang.linear_route.ours_linear (our 1x128 act quant + skinny FP8 GEMM: what the FP8-linear
  route runs), kernels compiled for every M <= max(--ms) before timing (act_quant.precompile,
  fp8_gemm.precompile_plain);
- stock: what SGLang's Fp8LinearMethod.apply runs for block-FP8 weights with fp32 scales: the function
  sglang.srt.layers.quantization.fp8_utils.dispatch_w8a8_block_fp8_linear() returns (0.5.14: no arguments; 0.5.23:
  weight_block_size=[128, 128], act_scale_ue8m0=False, GLM-5's e4m3 scale format), called as
  fn(input=x, weight=w, block_size=[128, 128], weight_scale=scale_inv, input_scale=None, bias=None); on Hopper
  with DeepGEMM enabled that is DeepGEMM behind SGLang's per-token-group act quant. Skipped, with the reason,
  where sglang does not import.
Times: median per launch, CUDA-graph replay (bench.timing.time_launches), launch i on weight copy i % copies.
Floor: weight + scale + x + output bytes at the copy bandwidth measured in the same run.
Correctness, same run: each path's output on copy 0 against a float64 reference of the same quantised math
(x quantised per token in 1x128 groups by ref.fp8.quant_act_per_token, both operands dequantised in float64,
matmul in float64), relative L2; the report marks values above ERR_FLAG.
Output: OUT/fp8_linear.json, OUT/fp8_linear.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

SHAPES = ("o_proj", "dense_gate_up", "dense_down")
DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64)
BLOCK = 128
MAX_M = 256  # ops.fp8_gemm.MAX_M: the largest M the skinny GEMM takes
ERR_FLAG = 0.02  # rel L2 above this is marked in the report: that path does not compute the quantised math
MIN_COPIES = 2
DEFAULT_PRESET = "glm5"
PRESETS = ("glm5", "glm5.2", "small")
WEIGHT_NAMES = {  # layer 0 (dense in GLM-5) of the synthetic checkpoint: the tensors each shape is built from
    "o_proj": ("model.layers.0.self_attn.o_proj.weight",),
    "dense_gate_up": ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    "dense_down": ("model.layers.0.mlp.down_proj.weight",),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for fp8_linear.json / .md")
    p.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)), help=f"comma list of token counts M (1..{MAX_M})")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma subset of {', '.join(SHAPES)}")
    p.add_argument("--preset", choices=PRESETS, default=None, help=f"model config preset (default {DEFAULT_PRESET})")
    p.add_argument("--config", default=None, help="a model config.json (or its folder) instead of --preset")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--max-copies", type=int, default=256, help="cap on the weight copies rotated over per shape")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="", help="comma subset of " + ", ".join(VARIANTS) + ": extra columns of our "
                   "GEMM at other launch options, same weights and run (the default config is the ours column)")


# Extra columns (--variants): our GEMM with one launch option changed against config_for's choice.
#   persist  the persistent launch (one CTA per SM takes the (n tile, split, token block) units through one TMA
#            ring), same tm / splits / stages; applies where the units need more than one wave
#   pipe2    the wgmma consumer issuing stage pairs (pipe=2), the rest as config_for chose
VARIANTS = ("persist", "pipe2")


def variant_config(name: str, cfg: Any, num_sms: int = 132) -> Any:
    """config_for's choice `cfg` with variant `name`'s option changed (None: the variant does not apply)."""
    import dataclasses

    if name == "persist":
        ok = cfg.impl == "wgmma" and (cfg.reduce == "global" or cfg.splits == 1) and not cfg.persist
        return dataclasses.replace(cfg, reduce="global", persist=num_sms) if ok and cfg.units > num_sms else None
    if name == "pipe2":
        ok = cfg.impl == "wgmma" and cfg.tm <= 64 and cfg.pipe != 2
        return dataclasses.replace(cfg, pipe=2) if ok else None
    raise ValueError(f"bench fp8-linear: unknown variant {name!r} (one of {', '.join(VARIANTS)})")


def variant_path(name: str, ours: Callable, config: Callable[[int, int, int], Any], num_sms: int = 132) -> Callable:
    """ours(x, w, s) under forced_config(variant_config(name, config(M, N, K))); raises when it does not apply."""
    from ..ops import fp8_gemm

    def fn(x, w, s):
        c = variant_config(name, config(x.shape[0], w.shape[0], w.shape[1]), num_sms)
        if c is None:
            raise RuntimeError(f"variant {name} does not apply to this config")
        with fp8_gemm.forced_config(c.tm, c.splits, c.stages, c.minb, 0, c.impl, c.pipe, c.reduce, c.persist):
            return ours(x, w, s)
    return fn


def parse_ms(s: str) -> list[int]:
    try:
        ms = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bench fp8-linear: --ms must be a comma list of integers, got {s!r}") from None
    if not ms:
        raise ValueError(f"bench fp8-linear: --ms is empty ({s!r})")
    if ms[0] < 1 or ms[-1] > MAX_M:
        raise ValueError(f"bench fp8-linear: --ms entries must be in 1..{MAX_M} (the skinny GEMM's range), got {s!r}")
    return ms


def parse_shapes(s: str) -> list[str]:
    names = [x.strip() for x in s.split(",") if x.strip()]
    if not names:
        raise ValueError(f"bench fp8-linear: --shapes is empty ({s!r}); choose from {', '.join(SHAPES)}")
    bad = [x for x in names if x not in SHAPES]
    if bad:
        raise ValueError(f"bench fp8-linear: unknown --shapes {', '.join(bad)}; choose from {', '.join(SHAPES)}")
    return [x for x in SHAPES if x in names]  # fixed order, no duplicates


def load_config(a: argparse.Namespace):
    from ..config import ConfigError, Glm5Config

    preset, path = getattr(a, "preset", None), getattr(a, "config", None)
    if preset and path:
        raise ValueError("bench fp8-linear: give --preset or --config, not both")
    try:
        return Glm5Config.from_file(path) if path else Glm5Config.preset(preset or DEFAULT_PRESET)
    except ConfigError as e:  # names the file and the field
        raise ValueError(f"bench fp8-linear: --config: {e}") from None


def config_label(a: argparse.Namespace, cfg: Any = None) -> str:
    """Where the shapes came from, for the report."""
    if getattr(a, "config", None):
        return f"--config {getattr(cfg, 'source', None) or a.config}"
    return f"preset {getattr(a, 'preset', None) or DEFAULT_PRESET}"


def shapes_from_config(cfg, names=SHAPES) -> list[tuple[str, int, int]]:
    """[(name, N, K)] of the selected linears (module doc), checked against what both GEMMs take."""
    all_ = {"o_proj": (cfg.hidden_size, cfg.num_attention_heads * cfg.v_head_dim),
            "dense_gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
            "dense_down": (cfg.hidden_size, cfg.intermediate_size)}
    out = []
    for name in names:
        n, k = all_[name]
        if k % BLOCK:
            raise ValueError(f"bench fp8-linear: {name} has K={k}, not a multiple of {BLOCK} (1x128 act quant)")
        if name == "dense_gate_up" and cfg.intermediate_size % BLOCK:
            raise ValueError(f"bench fp8-linear: dense_gate_up needs intermediate_size ({cfg.intermediate_size}) a "
                             f"multiple of {BLOCK} (gate and up block scales stacked into one weight)")
        out.append((name, n, k))
    return out


def validate(a: argparse.Namespace) -> tuple[list[int], list[tuple[str, int, int]]]:
    ms = parse_ms(a.ms)
    names = parse_shapes(a.shapes)
    if a.replays < 1:
        raise ValueError(f"bench fp8-linear: --replays must be >= 1, got {a.replays}")
    if a.max_copies < 1:
        raise ValueError(f"bench fp8-linear: --max-copies must be >= 1, got {a.max_copies}")
    return ms, shapes_from_config(load_config(a), names)


def weight_bytes(n: int, k: int) -> int:
    """e4m3 weight + fp32 block scales [ceil(N/128), K/128]."""
    return n * k + -(-n // BLOCK) * (k // BLOCK) * 4


def floor_bytes(n: int, k: int, m: int) -> int:
    """Bytes one call must move: the weights and their scales, x [M, K] bf16 and the output [M, N] bf16."""
    return weight_bytes(n, k) + m * k * 2 + m * n * 2


def rotation(set_bytes: int, l2_bytes: int, max_copies: int):
    """bench.timing.plan_rotation over weight copies (> 2x L2), with at least MIN_COPIES copies (capped by
    max_copies) so two consecutive launches never read the same weights."""
    from .timing import plan_rotation

    plan = plan_rotation(set_bytes, l2_bytes, factor=2.0, max_sets=max_copies)
    want = min(MIN_COPIES, max_copies)
    if plan.sets < want:
        plan = dataclasses.replace(plan, sets=want, launches=want * math.ceil(plan.launches / want))
    return plan


def make_weight(name: str, n: int, k: int, seed: int):
    """(w8 [N, K] e4m3, scale_inv [ceil(N/128), K/128] fp32) on the CPU: layer 0's synthetic-checkpoint tensors
    (weights.generate_tensor, the magnitudes `make-checkpoint` writes); dense_gate_up stacks gate over up as
    SGLang's merged column linear holds them."""
    import torch

    from ..weights import _lin, generate_tensor

    parts = []
    for hf in WEIGHT_NAMES[name]:
        pn = n // len(WEIGHT_NAMES[name])
        t = generate_tensor(_lin(hf, pn, k), seed)
        parts.append((t[hf], t[hf.removesuffix("weight") + "weight_scale_inv"]))
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]).contiguous(), torch.cat([p[1] for p in parts]).contiguous()


def _dequant_w64(w8, ws):
    n, k = w8.shape
    s = ws.double().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return w8.double() * s


def reference(x, w8, ws, chunk: int = 4096):
    """float64 [M, N] of the quantised math both paths compute: x quantised per token in 1x128 groups
    (ref.fp8.quant_act_per_token), x and the weights dequantised in float64 (an e4m3 value times its fp32 scale is
    exact there, not in fp32), matmul in float64; N in chunks to bound the float64 weight copy."""
    import torch

    from ..ref.fp8 import quant_act_per_token

    if chunk < BLOCK or chunk % BLOCK:
        raise ValueError(f"reference: chunk must be a positive multiple of {BLOCK} (scale rows), got {chunk}")
    x8, xs = quant_act_per_token(x)
    m, k = x8.shape
    xd = (x8.double().view(m, k // BLOCK, BLOCK) * xs.double()[..., None]).view(m, k)
    n = w8.shape[0]
    out = torch.empty(m, n, dtype=torch.float64, device=x.device)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        out[:, a:b] = xd @ _dequant_w64(w8[a:b], ws[a // BLOCK: -(-b // BLOCK)]).t()
    return out


def _stock_fn() -> tuple[Callable | None, str, str]:
    """(fn(x, w, scale_inv) -> y, what it runs, why not): SGLang's block-FP8 linear as Fp8LinearMethod.apply
    dispatches it (module doc); fn None with the reason where sglang does not import."""
    import functools
    import inspect

    try:
        from sglang.srt.layers.quantization import fp8_utils
    except Exception as e:  # noqa: BLE001 - report why the stock column is empty
        return None, "", f"sglang.srt.layers.quantization.fp8_utils not importable: {type(e).__name__}: {str(e)[:300]}"
    try:
        import sglang

        version = str(getattr(sglang, "__version__", "?"))
    except Exception:  # noqa: BLE001
        version = "?"
    disp = fp8_utils.dispatch_w8a8_block_fp8_linear
    try:
        params = inspect.signature(disp).parameters
        kw: dict[str, Any] = {}
        if "weight_block_size" in params:  # 0.5.23: dispatch on the layer's block size and scale format
            kw["weight_block_size"] = [BLOCK, BLOCK]
        if "act_scale_ue8m0" in params:
            kw["act_scale_ue8m0"] = False  # GLM-5's checkpoint: e4m3 with fp32 scales, no ue8m0 scale_fmt
        linear = disp(**kw)
    except Exception as e:  # noqa: BLE001
        return None, "", f"dispatch_w8a8_block_fp8_linear() raised {type(e).__name__}: {str(e)[:300]}"
    inner = linear.func if isinstance(linear, functools.partial) else linear
    bound = f" with {linear.keywords}" if isinstance(linear, functools.partial) and linear.keywords else ""
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    name = (f"sglang {version}: fp8_utils.dispatch_w8a8_block_fp8_linear({args})"
            f" -> {getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}{bound}")

    def stock(x, w, s):
        return linear(input=x, weight=w, block_size=[BLOCK, BLOCK], weight_scale=s, input_scale=None, bias=None)

    return stock, name, ""


def _ratios(row: dict[str, Any]) -> None:
    o, s, f = row.get("ours_us"), row.get("stock_us"), row.get("floor_us")
    if o and s:
        row["stock_over_ours"] = s / o
    if o and f:
        row["ours_over_floor"] = o / f
    if s and f:
        row["stock_over_floor"] = s / f


def measure_shape(name: str, n: int, k: int, ms: list[int], paths: dict[str, Callable], dev: Any, *, seed: int,
                  replays: int, max_copies: int, bw: dict[str, Any], l2: int, stream: int = 0,
                  ours_config: Callable[[int], Any] | None = None,
                  log: Callable[[str], None] = lambda s: print(s, flush=True)
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """One shape at every M: weights (rotated copies), x, the float64 reference, then per path a check on copy 0
    and the timing. Returns (shape info, rows, why the run must stop ("" to go on)). paths: name ->
    fn(x, weight, scale_inv) -> [M, N] bf16; ours_config(m): the GEMM config ours resolves to (JSON only)."""
    import torch

    from ..testing.numerics import rel_err
    from .timing import CudaContextLost, assert_not_all_zero, cuda_context_error, time_launches

    w8, ws = make_weight(name, n, k, seed)
    w8, ws = w8.to(dev), ws.to(dev)
    g = torch.Generator(device=dev).manual_seed(seed * 1009 + stream)
    x_all = torch.randn(max(ms), k, device=dev, generator=g).to(torch.bfloat16)
    assert_not_all_zero({"x": x_all, "weight": w8}, f"bench fp8-linear {name}")
    ref = reference(x_all, w8, ws)  # per-token quant: rows are independent, so ref[:M] is the reference at M
    plan = rotation(weight_bytes(n, k), l2, max_copies)
    copies = [(w8, ws)] + [(w8.clone(), ws.clone()) for _ in range(plan.sets - 1)]
    info = {"shape": name, "N": n, "K": k, "weight_bytes": weight_bytes(n, k), "rotation": plan.to_dict(),
            "weights": list(WEIGHT_NAMES[name])}
    rows: list[dict[str, Any]] = []
    aborted = ""
    for m in ms:
        x = x_all[:m].contiguous()
        row: dict[str, Any] = {"shape": name, "M": m, "N": n, "K": k, "floor_bytes": floor_bytes(n, k, m)}
        row["floor_us"] = row["floor_bytes"] / bw["bytes_per_s"] * 1e6 if bw.get("bytes_per_s") else None
        if ours_config is not None:
            try:
                row["ours_config"] = ours_config(m)
            except Exception as e:  # noqa: BLE001 - informational only
                row["ours_config"] = f"{type(e).__name__}: {str(e)[:200]}"
        for path, fn in paths.items():
            try:
                out = fn(x, *copies[0])
                if tuple(out.shape) != (m, n) or out.dtype != torch.bfloat16:
                    raise RuntimeError(f"output {tuple(out.shape)} {out.dtype}, expected ({m}, {n}) bf16")
                row[f"{path}_rel_l2"] = rel_err(out, ref[:m])
                del out
                tm = time_launches(lambda i, fn=fn: fn(x, *copies[i % len(copies)]), plan.launches, device=dev,
                                   replays=replays)
                row[f"{path}_us"] = tm.median_us
                row[f"{path}_timing"] = tm.to_dict()
            except Exception as e:  # noqa: BLE001 - one failing path must not lose the other's numbers
                row[f"{path}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                lost = str(e) if isinstance(e, CudaContextLost) else cuda_context_error(dev)
                if lost is not None:  # a sticky error: every later launch in this process would fail
                    aborted = f"{name} M={m} {path}: CUDA context lost ({lost[:200]}); the run stopped here"
                    break
        _ratios(row)
        rows.append(row)
        log(f"[fp8-linear] {name} M={m}: " + ", ".join(
            f"{key}={v:.4g}" if isinstance(v, float) else f"{key}={v}" for key, v in row.items()
            if key not in ("shape", "M", "ours_config") and not key.endswith("_timing")))
        if aborted:
            break
    return info, rows, aborted


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..integrations.sglang.linear_route import ours_linear
    from ..ops import act_quant, fp8_gemm
    from .meta import git_commit, utc_now
    from .timing import l2_cache_bytes, measure_copy_bandwidth

    ms, shapes = validate(a)
    variants = [v for v in getattr(a, "variants", "").split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"bench fp8-linear: unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    cfg = load_config(a)
    dev = torch.device("cuda", torch.cuda.current_device())
    bw = measure_copy_bandwidth(dev)
    l2 = l2_cache_bytes(dev)
    stock, stock_name, stock_reason = _stock_fn()
    ours_reason = ""
    try:
        act_quant.precompile(dev)
        fp8_gemm.precompile_plain([(n, k) for _, n, k in shapes], max_m=max(ms), device=dev)
    except Exception as e:  # noqa: BLE001 - no kernels: the ours column is empty, with the reason
        ours_reason = f"precompile failed: {type(e).__name__}: {str(e)[:300]}"
    paths: dict[str, Callable] = {}
    if not ours_reason:
        paths["ours"] = ours_linear
    if stock is not None:
        paths["stock"] = stock
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cc = tuple(torch.cuda.get_device_capability(dev))
    if not ours_reason:
        for v in variants:
            paths[f"ours_{v}"] = variant_path(v, ours_linear, lambda m, n, k: fp8_gemm.config_for(
                m, n, k, fp8_gemm.EPI_PLAIN, sms, fp8_gemm.env_impl(), cc), sms)
    rows: list[dict[str, Any]] = []
    shape_info: list[dict[str, Any]] = []
    aborted = ""
    for si, (name, n, k) in enumerate(shapes):
        info, shape_rows, aborted = measure_shape(
            name, n, k, ms, paths, dev, seed=a.seed, replays=a.replays, max_copies=a.max_copies, bw=bw, l2=l2,
            stream=si, ours_config=lambda m, n=n, k=k: fp8_gemm.config_for(
                m, n, k, fp8_gemm.EPI_PLAIN, sms, fp8_gemm.env_impl(), cc).describe())
        shape_info.append(info)
        rows += shape_rows
        torch.cuda.empty_cache()
        if aborted:
            break
    return {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(),
            "config": config_label(a, cfg),
            "ours": "integrations.sglang.linear_route.ours_linear (act_quant_fp8 + fp8_gemm_skinny)",
            "ours_reason": ours_reason, "stock": stock_name, "stock_reason": stock_reason,
            "fp8_gemm_impl_env": _env_impl(), "copy_bandwidth": bw, "l2_bytes": l2, "err_flag": ERR_FLAG,
            "seed": a.seed, "replays": a.replays, "shapes": shape_info, "rows": rows, "aborted": aborted}


def _env_impl() -> str | None:
    try:
        from ..ops.fp8_gemm import env_impl

        return env_impl()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _config_text(c: Any) -> str:
    if not isinstance(c, dict):
        return "-" if c is None else str(c)[:60]
    t = f"{c.get('impl')} tm{c.get('tm')} s{c.get('splits')} st{c.get('stages')}"
    if c.get("pipe"):
        t += f" pipe{c['pipe']}"
    if c.get("persist"):
        t += f" persist{c['persist']}"
    return t


def markdown(res: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 2) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (
            f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    flag = float(res.get("err_flag", ERR_FLAG))

    def e(x: Any) -> str:
        if x is None:
            return "-"
        return f"**{x:.4f} !**" if not x <= flag else f"{x:.4f}"  # NaN / inf flagged too

    bw = (res.get("copy_bandwidth") or {}).get("bytes_per_s")
    stock = (f"`{res.get('stock')}`" if res.get("stock")
             else f"not run, the stock columns are empty: {res.get('stock_reason') or 'no reason recorded'}")
    ours = (f"`{res.get('ours')}`" if not res.get("ours_reason")
            else f"not run, the ours columns are empty: {res.get('ours_reason')}")
    lines = [f"# Block-FP8 linears outside the prefix: ours vs SGLang ({res.get('gpu')}, {res.get('date')}, "
             f"commit {res.get('commit')})", "",
             f"- Config: {res.get('config')}. Weights: layer 0 of the synthetic checkpoint (seed {res.get('seed')}), "
             "e4m3 with fp32 128x128 block scales; x random bf16 [M, K].",
             f"- Ours: {ours}.",
             f"- Stock: {stock}.",
             "- Time: CUDA-graph replay median per launch, launches rotating over weight copies (> 2x L2 of "
             f"{f((res.get('l2_bytes') or 0) / 2**20, 0)} MiB, so weights come from HBM). Floor: weights + scales + "
             f"x + output bytes at the measured copy bandwidth ({f(bw / 1e12 if bw else None)} TB/s).",
             f"- Rel err: relative L2 against a float64 reference of the same quantised math (1x128 per-token act "
             f"quant, block-scaled weights); **bold with !** = above {flag:g}: that path's output is wrong and its "
             "time does not count."]
    if res.get("aborted"):
        lines += ["", f"**Run aborted:** {res['aborted']}."]
    rows = res.get("rows", [])
    extra = [f"ours_{v}" for v in VARIANTS if any(f"ours_{v}_us" in r or f"ours_{v}_error" in r for r in rows)]
    if extra:
        lines += ["- Variant columns (us): " + "; ".join(
            f"`{x}` = ours with " + ("the persistent launch, one CTA per SM" if x == "ours_persist" else
                                     "stage pairs in the wgmma consumer (pipe=2)") for x in extra)
                  + "; '-' where the variant does not apply to the chosen config."]
    for sh in res.get("shapes", []):
        rot = sh.get("rotation") or {}
        lines += ["", f"## {sh['shape']} (N={sh['N']}, K={sh['K']}; {f(sh['weight_bytes'] / 1e6, 1)} MB of weights + "
                  f"scales, {rot.get('sets', '-')} copies)", "",
                  "| M | floor us | ours us | stock us | stock/ours | ours/floor | stock/floor | ours rel err | "
                  "stock rel err |" + "".join(f" {x} us |" for x in extra) + " ours config |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra) + "---|"]
        for r in (r for r in rows if r.get("shape") == sh["shape"]):
            lines.append(f"| {r['M']} | {f(r.get('floor_us'))} | {f(r.get('ours_us'))} | {f(r.get('stock_us'))} | "
                         f"{f(r.get('stock_over_ours'))} | {f(r.get('ours_over_floor'))} | "
                         f"{f(r.get('stock_over_floor'))} | {e(r.get('ours_rel_l2'))} | {e(r.get('stock_rel_l2'))} |"
                         + "".join(f" {f(r.get(x + '_us'))} |" for x in extra) + f" {_config_text(r.get('ours_config'))} |")
    errs = [f"- {r.get('shape')} M={r.get('M')} {k}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")]
    if errs:
        lines += ["", "Errors (the cell is empty where a path raised):", *errs]
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    try:
        validate(a)
    except ValueError as e:
        print(e)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench fp8-linear: needs a CUDA GPU (Hopper)")
        return 2
    res = run(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_linear.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "fp8_linear.md").write_text(markdown(res))
    print(markdown(res))
    return 0
