"""The `glm5-fastpath` command: info, make-checkpoint, demo, bench, dashboard."""
from __future__ import annotations

import argparse
import sys
import time


def _cmd_info(args: argparse.Namespace) -> int:
    from .platform import detect, render

    print(render(detect()))
    return 0


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from .checkpoint import make_checkpoint

    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    out = make_checkpoint(args.dir, layers=args.layers, preset=args.preset, seed=args.seed, small=args.small,
                          overwrite=args.overwrite, progress=progress)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .config import Glm5Config
    from .demo import render, run_demo

    weights = None
    if args.checkpoint:
        from .checkpoint import load_config, load_layer

        cfg = load_config(args.checkpoint)
        layer = args.layer if args.layer is not None else min(cfg.first_k_dense_replace, cfg.num_hidden_layers - 1)
        print(f"loading layer {layer} of {args.checkpoint}...")
        weights = load_layer(args.checkpoint, layer, device=None if args.device in ("auto", "cpu") else args.device)
    else:
        cfg = Glm5Config.preset(args.preset)
        layer = args.layer
    res = run_demo(cfg, layer=layer, batch=args.batch, kv_len=args.kv_len, seed=args.seed, device=args.device,
                   weights=weights, repeat=args.repeat)
    print()
    print(f"one GLM-5 decode layer, M={args.batch} sequences x KV {args.kv_len}, on {res.device}:")
    print(render(res))
    if res.device == "cpu":
        print("\nOn this CPU the pure-PyTorch reference ran every op; 'H200 floor' is what the same bytes cost at the "
              "H200's copy bandwidth. `glm5-fastpath info` lists what would run on a GPU.")
    return 0


def _cmd_bench_prefix_ops(args: argparse.Namespace) -> int:
    from .bench.prefix_ops import options_from_args, run_bench

    run_bench(options_from_args(args))
    return 0


def _cmd_bench_prefix(args: argparse.Namespace) -> int:
    from .attn_pre.cmp.bench import run

    return run(args)


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tune import run

    return run(args)


def _cmd_bench_moe(args: argparse.Namespace) -> int:
    from .bench.moe import run

    return run(args)


def _cmd_bench_sparse_mla(args: argparse.Namespace) -> int:
    from .bench.sparse_mla import main

    return main(args)


def _cmd_bench_fp8_linear(args: argparse.Namespace) -> int:
    from .bench.fp8_linear import main

    return main(args)


def _cmd_bench_v_up(args: argparse.Namespace) -> int:
    from .bench.v_up import main

    return main(args)


def _cmd_bench_router(args: argparse.Namespace) -> int:
    from .bench.router import main

    return main(args)


def _cmd_bench_moe_layer(args: argparse.Namespace) -> int:
    from .bench.moe_layer import main

    return main(args)


def _cmd_bench_moe_prefill(args: argparse.Namespace) -> int:
    from .bench.moe_prefill import main

    return main(args)


def _cmd_bench_gemm_phases(args: argparse.Namespace) -> int:
    from .bench.gemm_phases import run

    return run(args)


def _cmd_bench_gemm_layout(args: argparse.Namespace) -> int:
    from .bench.gemm_layout import run

    return run(args)


def _cmd_bench_gemm_chain(args: argparse.Namespace) -> int:
    from .bench.gemm_chain import run

    return run(args)


def _cmd_bench_l2_prefetch(args: argparse.Namespace) -> int:
    from .bench.l2_prefetch import main

    return main(args)


def _cmd_bench_decode_step(args: argparse.Namespace) -> int:
    from .bench.decode_step import run

    return run(args)


def _cmd_bench_offline(args: argparse.Namespace) -> int:
    from .bench.offline import options_from_args, run_bench

    return run_bench(options_from_args(args))


def _cmd_bench_compare_runs(args: argparse.Namespace) -> int:
    from .bench.compare_runs import run

    return run(args)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from .dashboard.server import serve

    serve(args.metrics_url, host=args.host, port=args.port)
    return 0


# = attn_pre.megartp.plan.SCHEDULERS (tests/test_cli.py checks it): not imported, so building the parser stays
# free of torch
PLAN_SCHEDULERS = ("list", "insertion", "round_robin", "dynamic")


def _cmd_plan(args: argparse.Namespace) -> int:
    from .attn_pre.megartp import build_plan, dump, validate
    from .config import Glm5Config
    from .graph.op_graph import ShapeContext
    from .graph.prefix_graph import build_prefix_graph

    cfg = Glm5Config.preset(args.preset)
    layer = args.layer if args.layer is not None else 0
    graph = build_prefix_graph(cfg, full_indexer=cfg.is_full_indexer_layer(layer))
    ctx = (ShapeContext.shared_kv(args.m, args.kv_len) if args.shared_kv
           else ShapeContext.independent([args.kv_len] * args.m))
    plan = build_plan(graph, ctx, cfg, num_sms=args.num_sms, scheduler=args.scheduler)
    validate(plan)
    print(dump(plan) if args.dump else "\n".join(dump(plan).splitlines()[:2]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glm5-fastpath", description="Fast GLM-5 decode on NVIDIA Hopper (SGLang plugin).")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("info", help="GPU, compiler, bindings, and which paths can run here (and why not)")
    s.set_defaults(fn=_cmd_info)

    s = sub.add_parser("make-checkpoint", help="write a GLM-5-shaped synthetic FP8 checkpoint")
    s.add_argument("dir")
    s.add_argument("--layers", type=int, required=True, help="number of decoder layers (0-2 dense, then MoE)")
    s.add_argument("--preset", choices=("glm5", "glm5.2"), default="glm5")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--small", action="store_true", help="shrunk dims for fast tests (same structure; not the GLM-5 shapes the kernels are tuned for)")
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(fn=_cmd_make_checkpoint)

    s = sub.add_parser("demo", help="run one GLM-5 decode layer and print per-op time, bytes and floor")
    s.add_argument("--preset", choices=("glm5", "glm5.2", "small"), default="glm5")
    s.add_argument("--checkpoint", help="load the layer from a checkpoint dir instead of generating it")
    s.add_argument("--layer", type=int, default=None, help="layer index (default: the first MoE layer)")
    s.add_argument("--batch", type=int, default=4, help="decode tokens M (one per sequence)")
    s.add_argument("--kv-len", type=int, default=4096, help="context length per sequence")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto", help="auto | cpu | cuda")
    s.add_argument("--repeat", type=int, default=3, help="timed repetitions per op (first is warm-up)")
    s.set_defaults(fn=_cmd_demo)

    s = sub.add_parser("bench", help="benchmarks (on an H200: ours vs the stock SGLang kernels vs the floor)")
    bsub = s.add_subparsers(dest="bench", required=True)
    b = bsub.add_parser("prefix-ops", help="every attention-prefix op A0..E2: ours, stock, bytes floor")
    from .bench.prefix_ops import add_arguments as _bench_prefix_args

    _bench_prefix_args(b)
    b.set_defaults(fn=_cmd_bench_prefix_ops)
    b = bsub.add_parser("prefix", help="the whole attention prefix per executor (stock, serial, CMP modes) per bucket")
    from .attn_pre.cmp.bench import add_arguments as _bench_prefix_exec_args

    _bench_prefix_exec_args(b)
    b.set_defaults(fn=_cmd_bench_prefix)
    b = bsub.add_parser("moe", help="MegaMoE vs DeepGEMM fp8_mega_moe vs the weight floor per token count")
    from .bench.moe import add_arguments as _bench_moe_args

    _bench_moe_args(b)
    b.set_defaults(fn=_cmd_bench_moe)
    b = bsub.add_parser("sparse-mla", help="(GPU) the DSA sparse-MLA decode core: our split-KV kernel vs FlashMLA "
                                           "vs the bytes floor per token count")
    from .bench.sparse_mla import add_arguments as _bench_sparse_mla_args

    _bench_sparse_mla_args(b)
    b.set_defaults(fn=_cmd_bench_sparse_mla)
    b = bsub.add_parser("fp8-linear", help="(GPU) the block-FP8 linears outside the prefix (o_proj, dense MLP) per "
                                           "token count: our act quant + skinny GEMM vs SGLang's block-FP8 linear "
                                           "vs the bytes floor")
    from .bench.fp8_linear import add_arguments as _bench_fp8_linear_args

    _bench_fp8_linear_args(b)
    b.set_defaults(fn=_cmd_bench_fp8_linear)
    b = bsub.add_parser("v-up", help="(GPU) MLA's W_UV up-projection per token count: our fused V-up + o_proj act "
                                     "quant vs SGLang's bf16 bmm (+ act quant) vs the bytes floor, alone and before o_proj")
    from .bench.v_up import add_arguments as _bench_v_up_args

    _bench_v_up_args(b)
    b.set_defaults(fn=_cmd_bench_v_up)
    b = bsub.add_parser("router", help="(GPU) the MoE router per token count: split-K vs decode kernel vs stock")
    from .bench.router import add_arguments as _bench_router_args

    _bench_router_args(b)
    b.set_defaults(fn=_cmd_bench_router)
    b = bsub.add_parser("moe-layer", help="(GPU) one decode MoE layer from h: fused router + plan vs separate kernels "
                        "vs SGLang's router + DeepGEMM fp8_mega_moe")
    from .bench.moe_layer import add_arguments as _bench_moe_layer_args

    _bench_moe_layer_args(b)
    b.set_defaults(fn=_cmd_bench_moe_layer)
    b = bsub.add_parser("moe-prefill", help="(GPU) the MoE of one prefill chunk (128-4096 tokens): SGLang's Triton "
                        "fused MoE vs MegaMoE")
    from .bench.moe_prefill import add_arguments as _bench_moe_prefill_args

    _bench_moe_prefill_args(b)
    b.set_defaults(fn=_cmd_bench_moe_prefill)
    b = bsub.add_parser("gemm-phases", help="(GPU) where one skinny FP8 GEMM launch spends its time, per CTA (phase "
                                            "build: launch spread, first byte, stream, split-K finish, epilogue)")
    from .bench.gemm_phases import add_arguments as _bench_gemm_phases_args

    _bench_gemm_phases_args(b)
    b.set_defaults(fn=_cmd_bench_gemm_phases)
    b = bsub.add_parser("gemm-layout", help="(GPU) the skinny FP8 GEMM with row-major vs k-block-major weights (full "
                                            "GEMM and the loads-only ring, bitwise check)")
    from .bench.gemm_layout import add_arguments as _bench_gemm_layout_args

    _bench_gemm_layout_args(b)
    b.set_defaults(fn=_cmd_bench_gemm_layout)
    b = bsub.add_parser("gemm-chain", help="(GPU) two dependent prefix GEMMs: two launches (PDL off / on) vs one "
                                           "persistent chain launch streaming the second's weights early")
    from .bench.gemm_chain import add_arguments as _bench_gemm_chain_args

    _bench_gemm_chain_args(b)
    b.set_defaults(fn=_cmd_bench_gemm_chain)
    b = bsub.add_parser("l2-prefetch", help="(GPU) L2 prefetch of the next weight-bound kernel's weights: probe, "
                                            "attention tail (o_proj), MoE shared expert, with vs without")
    from .bench.l2_prefetch import add_arguments as _bench_l2_args

    _bench_l2_args(b)
    b.set_defaults(fn=_cmd_bench_l2_prefetch)
    b = bsub.add_parser("decode-step", help="(GPU) one whole decode step, all layers: ours vs the stock kernel "
                                            "sequence per bucket, bytes floor, per-layer breakdown, correctness")
    from .bench.decode_step import add_arguments as _bench_step_args

    _bench_step_args(b)
    b.set_defaults(fn=_cmd_bench_decode_step)
    b = bsub.add_parser("offline", help="SGLang offline Engine, stock vs fastpath: tok/s, TTFT/ITL, speedup")
    from .bench.offline import add_arguments as _bench_offline_args

    _bench_offline_args(b)
    b.set_defaults(fn=_cmd_bench_offline)
    b = bsub.add_parser("compare-runs", help="engine settings over several engine processes each (bench offline "
                                             "results): ITL p50 per run, medians, whether a difference beats the spread")
    from .bench.compare_runs import add_arguments as _compare_runs_args

    _compare_runs_args(b)
    b.set_defaults(fn=_cmd_bench_compare_runs)

    s = sub.add_parser("tune", help="(GPU) time the prefix executors per token bucket and write a selection table")
    from .tune import add_arguments as _tune_args

    _tune_args(s)
    s.set_defaults(fn=_cmd_tune)

    s = sub.add_parser("plan", help="build, validate and print the MegaRTP instruction plan of the prefix (host side)")
    s.add_argument("--preset", choices=("glm5", "glm5.2", "small"), default="glm5")
    s.add_argument("--layer", type=int, default=None, help="layer index (GLM-5.2 shared layers drop the indexer)")
    s.add_argument("--m", type=int, default=16, help="decode tokens")
    s.add_argument("--kv-len", type=int, default=8192)
    s.add_argument("--shared-kv", action="store_true", help="all tokens share one KV sequence (the design article's case)")
    s.add_argument("--num-sms", type=int, default=132)
    s.add_argument("--scheduler", choices=PLAN_SCHEDULERS, default="list",
                   help="queue placement, or dynamic (one list the CTAs claim from at run time)")
    s.add_argument("--dump", action="store_true", help="print every SM's instruction queue")
    s.set_defaults(fn=_cmd_plan)

    s = sub.add_parser("dashboard", help="local web page with live latency charts from an SGLang /metrics endpoint")
    s.add_argument("--metrics-url", required=True, help="Prometheus endpoint, e.g. http://127.0.0.1:30000/metrics")
    s.add_argument("--port", type=int, default=8088)
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    s.set_defaults(fn=_cmd_dashboard)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"glm5-fastpath {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
