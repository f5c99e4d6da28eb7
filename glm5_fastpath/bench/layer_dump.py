"""Benchmark-only: where do stock and glm5_fastpath part ways inside the engine? Per-layer dumps of the first
decode step(s), and their diff.

Why. With realistic dummy weights the two engines pick different greedy tokens from the first decode step
(benchmarks/results/2026-11-30_h200_session6, section 2). The prefill is SGLang's path in both modes, so the
first decode step starts from the same KV cache and the same token: any difference at that step comes from our
routes. Per layer it is either rounding noise (relative differences of ~1e-2, growing slowly, with a router
choice flipping where two scores nearly tie) or a wrong result (a jump at one layer's attention or MoE output,
with no near-tie to explain it). This module records what is needed to tell which.

Record (GLM5_FASTPATH_BENCH_LAYER_DUMP=DIR, read by the SGLANG_EXTERNAL_MODEL_PACKAGE subclass after loading;
needs eager decode, `--engine-arg disable_cuda_graph=true`, because hooks do not run in graph replays): for the
first DUMP_STEPS (GLM5_FASTPATH_BENCH_LAYER_DUMP_STEPS, default 1) decode forward passes of batch 1, per decoder
layer: the attention output (self_attn's return), the MLP input and output, the layer's (hidden, residual)
outputs, all as fp32 on the CPU, and for MoE layers the would-be router choice computed from that run's own MLP
input in fp32 (sigmoid + correction bias, top-k) with the score margin between the k-th and (k+1)-th choice.
Saved once to DIR/<mode>.pt (mode: fastpath when GLM5_FASTPATH is set, else stock).

Diff: `python3 -m glm5_fastpath.bench.layer_dump diff STOCK.pt FASTPATH.pt [--out FILE.md]`: per step and layer
the relative L2 difference of each record and the top-k overlap with the smallest margin; the first layer whose
difference jumps by more than JUMP x without a router flip before it is flagged.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ENV = "GLM5_FASTPATH_BENCH_LAYER_DUMP"
ENV_STEPS = "GLM5_FASTPATH_BENCH_LAYER_DUMP_STEPS"
RECORDS = ("attn_out", "mlp_in", "mlp_out", "hidden_out", "residual_out")
JUMP = 5.0  # a record's relative difference growing this much from one layer to the next is flagged


def _mode() -> str:
    from ..integrations.sglang.install import enabled  # the plugin's own reading of GLM5_FASTPATH

    return "fastpath" if enabled() else "stock"


def _forward_batch(args: tuple, kwargs: dict) -> Any:
    for a in list(args) + list(kwargs.values()):
        if hasattr(a, "forward_mode"):
            return a
    return None


def _is_decode(fb: Any) -> bool:
    fm = getattr(fb, "forward_mode", None)
    f = getattr(fm, "is_decode", None)
    return bool(f()) if callable(f) else False


def router_choice(x: Any, gate_w: Any, bias: Any, topk: int) -> dict[str, Any]:
    """fp32 noaux_tc choice from one token's MoE input x [H]: ids (top-k by sigmoid + bias, ties to the lower
    id) and the margin between the k-th and (k+1)-th biased score. Not ref.moe.route: that one checks a
    Glm5Config's dims and exact dtypes and returns no margin; this takes whatever the engine's gate holds."""
    import torch

    logits = x.float().reshape(1, -1) @ gate_w.float().t()
    choice = torch.sigmoid(logits)[0] + (bias.float() if bias is not None else 0.0)
    order = torch.argsort(choice, descending=True, stable=True)
    return {"ids": sorted(order[:topk].tolist()), "margin": float(choice[order[topk - 1]] - choice[order[topk]])}


class LayerDump:
    """The hooks' state: which decode step each layer is at, what was recorded, where it goes."""

    def __init__(self, out: Path, steps: int, num_layers: int) -> None:
        self.out, self.steps, self.num_layers = out, steps, num_layers
        self.step = [0] * num_layers  # decode calls of batch 1 seen per layer
        self.data: dict[str, Any] = {"mode": _mode(), "steps": {}}
        self.written = False
        self.hooks: list[Any] = []  # removed once the dump is written: later steps run without them

    def active(self, layer: int) -> bool:
        return self.step[layer] < self.steps

    def put(self, layer: int, name: str, value: Any) -> None:
        import torch

        rec = self.data["steps"].setdefault(self.step[layer], {}).setdefault(layer, {})
        rec[name] = value.detach().float().cpu().clone() if isinstance(value, torch.Tensor) else value

    def layer_done(self, layer: int) -> None:
        self.step[layer] += 1
        if not self.written and all(s >= self.steps for s in self.step):
            import torch

            self.out.mkdir(parents=True, exist_ok=True)
            path = self.out / f"{self.data['mode']}.pt"
            torch.save(self.data, path)
            self.written = True
            for h in self.hooks:
                h.remove()
            self.hooks.clear()
            print(f"glm5_fastpath: layer dump of {self.steps} decode step(s) written to {path}", file=sys.stderr,
                  flush=True)


def install(model: Any, out: str | os.PathLike, steps: int = 1) -> LayerDump | None:
    """Register the recording hooks on `model.model.layers` (module doc). Returns the state, or None when the
    model has no such layer list."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return None
    dump = LayerDump(Path(out), steps, len(layers))
    ctx: dict[int, bool] = {}  # layer -> this call is recorded

    for i, layer in enumerate(layers):
        def pre(mod, args, kwargs, i=i):
            fb = _forward_batch(args, kwargs)
            hs = kwargs.get("hidden_states", args[1] if len(args) > 1 else None)
            ctx[i] = (dump.active(i) and _is_decode(fb) and hs is not None and hs.dim() == 2 and hs.shape[0] == 1)

        def post(mod, args, kwargs, output, i=i):
            if not ctx.get(i):
                return
            if isinstance(output, (tuple, list)) and len(output) >= 2:
                dump.put(i, "hidden_out", output[0])
                if output[1] is not None:
                    dump.put(i, "residual_out", output[1])
            dump.layer_done(i)

        dump.hooks += [layer.register_forward_pre_hook(pre, with_kwargs=True),
                       layer.register_forward_hook(post, with_kwargs=True)]

        attn = getattr(layer, "self_attn", None)
        if attn is not None:
            def attn_post(mod, args, output, i=i):
                if ctx.get(i):
                    dump.put(i, "attn_out", output[0] if isinstance(output, (tuple, list)) else output)
            dump.hooks.append(attn.register_forward_hook(attn_post))

        mlp = getattr(layer, "mlp", None)
        if mlp is not None:
            gate = getattr(mlp, "gate", None)
            topk = int(getattr(mlp, "top_k", 0) or getattr(getattr(mlp, "topk", None), "top_k", 0) or 8)

            def mlp_pre(mod, args, kwargs, i=i, gate=gate, topk=topk):
                if not ctx.get(i):
                    return
                x = args[0] if args else kwargs.get("hidden_states")
                dump.put(i, "mlp_in", x)
                w = getattr(gate, "weight", None)
                if w is not None and x is not None and w.dim() == 2 and w.shape[1] == x.shape[-1]:
                    dump.put(i, "router", router_choice(x[0], w, getattr(gate, "e_score_correction_bias", None),
                                                        topk))

            def mlp_post(mod, args, kwargs, output, i=i):
                if ctx.get(i):
                    dump.put(i, "mlp_out", output[0] if isinstance(output, (tuple, list)) else output)
            dump.hooks += [mlp.register_forward_pre_hook(mlp_pre, with_kwargs=True),
                           mlp.register_forward_hook(mlp_post, with_kwargs=True)]
    return dump


def maybe_install(model: Any) -> LayerDump | None:
    d = os.environ.get(ENV, "").strip()
    if not d:
        return None
    from ..integrations.sglang.shadow import env_count

    steps = env_count(ENV_STEPS) or 1  # a bad value is logged and 1 is used, never a crash at model load
    dump = install(model, Path(d), steps)
    print(f"glm5_fastpath: layer dump ({ENV}={d}, {steps} decode step(s), mode {_mode()}): "
          f"{'hooks on ' + str(dump.num_layers) + ' layers' if dump else 'no model.layers: nothing recorded'}",
          file=sys.stderr, flush=True)
    return dump


# ---- diff ---------------------------------------------------------------------------------------------------

def diff(stock: dict, fast: dict) -> dict[str, Any]:
    """Per step and layer: relative differences of every record, router overlap and margin, flags (module doc)."""
    from ..testing.numerics import rel_err

    rows = []
    for step in sorted(set(stock["steps"]) & set(fast["steps"])):
        s_layers, f_layers = stock["steps"][step], fast["steps"][step]
        prev: dict[str, float] = {}
        flipped_before = False
        for layer in sorted(set(s_layers) & set(f_layers)):
            s, f = s_layers[layer], f_layers[layer]
            row: dict[str, Any] = {"step": step, "layer": layer}
            for name in RECORDS:
                if name in s and name in f and tuple(s[name].shape) == tuple(f[name].shape):
                    row[name] = rel_err(f[name], s[name])  # relative to stock
            if "router" in s and "router" in f:
                row["router_overlap"] = len(set(s["router"]["ids"]) & set(f["router"]["ids"]))
                row["router_k"] = len(s["router"]["ids"])
                row["router_margin"] = min(s["router"]["margin"], f["router"]["margin"])
            flips_here = row.get("router_overlap") is not None and row["router_overlap"] < row["router_k"]
            # a jump: > 0.05 and JUMP x what the layer's input already carried (the previous layer's output)
            jumps = [n for n in ("attn_out", "mlp_out") if n in row and row[n] > 0.05
                     and row[n] > JUMP * max(prev.get("hidden_out", 0.0), prev.get("residual_out", 0.0))
                     and not (n == "mlp_out" and flips_here)]
            if jumps and not flipped_before:
                row["flag"] = f"{'/'.join(jumps)} jumps with no router flip before it"
            flipped_before = flipped_before or flips_here
            prev = {k: v for k, v in row.items() if isinstance(v, float)}
            rows.append(row)
    return {"rows": rows}


def markdown(res: dict[str, Any], title: str = "") -> str:
    out = [f"# Per-layer difference, stock vs glm5_fastpath, first decode step(s){' (' + title + ')' if title else ''}",
           "", "Relative L2 difference (||fastpath - stock|| / ||stock||) per record; router: would-be top-k overlap "
           "from each run's own MLP input (fp32) and the smaller k-th/(k+1)-th score margin.", "",
           "| step | layer | attn out | mlp in | mlp out | hidden out | residual out | router overlap | margin | flag |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def f(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else "-"
    for r in res["rows"]:
        ro = f"{r['router_overlap']}/{r['router_k']}" if "router_overlap" in r else "-"
        out.append(f"| {r['step']} | {r['layer']} | {f(r.get('attn_out'))} | {f(r.get('mlp_in'))} | "
                   f"{f(r.get('mlp_out'))} | {f(r.get('hidden_out'))} | {f(r.get('residual_out'))} | {ro} | "
                   f"{f(r.get('router_margin'))} | {r.get('flag', '')} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python3 -m glm5_fastpath.bench.layer_dump")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diff", help="per-layer differences of two dumps (stock first)")
    d.add_argument("stock")
    d.add_argument("fastpath")
    d.add_argument("--out", default=None, help="write the markdown here too")
    a = p.parse_args(argv)
    res = diff(torch.load(a.stock, weights_only=False), torch.load(a.fastpath, weights_only=False))
    md = markdown(res, f"{a.stock} vs {a.fastpath}")
    print(md)
    if a.out:
        Path(a.out).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
