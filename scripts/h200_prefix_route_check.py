#!/usr/bin/env python3
"""H200 check of the attention-prefix route inside real SGLang (0.5.14 there; 0.5.23 best effort).

What it does (each phase is a fresh Python process with one in-process SGLang ModelRunner, TP1, built with
SGLang's own bench_one_batch helpers: the smallest real engine, no scheduler / tokenizer processes):

  model   a GLM-5-shaped model dir (full per-layer dims, LAYERS dense layers: no MoE needed), loaded with
          --load-format dummy; then every attention weight, the layer norms and the embeddings are overwritten
          with the project's seeded synthetic weights (realistic scales: dummy weights make the indexer's
          top-k meaningless), BEFORE our install builds its views.
  install glm5_fastpath's install_model() with a selection table that maps every bucket to "cmp".
  eager   CUDA graphs off. For batches of B requests (prompt lengths around and above index_topk, so the
          top-k really selects), prefill (SGLang's path), then DECODE steps. Every decode call of every
          layer's forward_absorb_prepare goes through prefix_check.PrefixCheck: ours and SGLang's original on
          the same inputs and cache state; compares q_pe, k_pe, q_nope_out, k_nope, the top-k (form, valid
          counts, set overlap), the index-K cache entries written (and that no other byte of their pages
          changed), and the latent-KV bytes SGLang's pool stores from each tuple. SGLang's tuple is kept.
  graph   CUDA graphs on for the batch sizes measured: after install the decode graphs are re-captured with
          our route inside them (multistream + PDL launches captured by SGLang's capture). Per decode step
          the same ForwardBatch runs (1) graph replay with our prefix, (2) eager with our prefix, (3) eager
          with SGLang's prefix; logits compared (1 vs 2: capture correctness, 2 vs 3: the route end to end).

Prints a PASS/FAIL table, writes OUT/prefix_route_check.{json,md}; exit status 0 only when every check passes.

usage (repo root on the H200; sglang 0.5.14 + deps installed in /tmp/site, see scripts/h200_sglang_offline.sh):
  python3 scripts/h200_prefix_route_check.py --wheels .carry/wheels          # installs /tmp/site if missing
  PYTHONPATH=/tmp/site:$PWD python3 scripts/h200_prefix_route_check.py [--phases eager,graph] [--batches 1,4,16]
Budget: ~4-5 min cold (kernel JIT + SGLang/DeepGEMM JIT on first use, cached under build/h200-cache and
~/.cache afterwards), ~2 min warm. --also-unfused adds an eager phase with SGLANG_DSA_FUSE_TOPK=0 (the DSA
backend then wants logical top-k positions), about one more minute.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE = os.environ.get("SITE", "/tmp/site")
CACHE = REPO / "build" / "h200-cache"
SGLANG_ENV = {"SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0",  # avoid FA3 on sm90 (sglang-h200-wheels.sh)
              # SGLang's DeepGEMM warm-up compiles every GEMM shape for M = 1..99200 at model load: the 2026-11-29
              # run spent its whole 120 s budget there. Off, each shape compiles on first use (what the check runs).
              "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0"}


# ---- orchestration ----------------------------------------------------------------------------------------

def _install_wheels(wheels: str) -> None:
    if Path(wheels).is_file():  # scripts/build_h200_site.sh's archive: already an installed tree
        print(f"unpacking {wheels} -> {SITE}", flush=True)
        Path(SITE).mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", wheels, "-C", SITE], check=True)
        return
    for part in ("part1", "part2", "part3"):
        d = Path(wheels) / part
        whl = sorted(str(p) for p in d.glob("*.whl"))
        if not whl:
            raise SystemExit(f"no wheels in {d}")
        print(f"installing {d} -> {SITE}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", SITE, *whl], check=True)


def _env() -> dict:
    env = dict(os.environ)
    paths = [SITE, str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    CACHE.mkdir(parents=True, exist_ok=True)
    env.setdefault("TRITON_CACHE_DIR", str(CACHE / "triton"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE / "inductor"))
    env.setdefault("XDG_CACHE_HOME", str(CACHE / "xdg"))
    env.setdefault("FLASHINFER_WORKSPACE_BASE", str(CACHE / "flashinfer"))
    for k, v in SGLANG_ENV.items():
        env.setdefault(k, v)
    for k in ("GLM5_FASTPATH", "SGLANG_EXTERNAL_MODEL_PACKAGE"):  # we install explicitly, no seam needed
        env.pop(k, None)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheels", help="scripts/build_h200_site.sh's .tar.xz, or a folder with part1/ part2/ part3/ "
                                    "(shared/tools/sglang-h200-wheels.sh)")
    p.add_argument("--moe-layers", type=int, default=1,
                   help="MoE layers after the dense ones (full GLM-5 dims, random FP8 experts, N(0,0.02) routers): "
                        "their decode forward is checked through the MoE route (MegaMoE) too; 0 = prefix only")
    p.add_argument("--out", default=str(REPO / "build" / "h200-prefix-route"))
    p.add_argument("--phases", default="eager,graph")
    p.add_argument("--also-unfused", action="store_true", help="extra eager phase with SGLANG_DSA_FUSE_TOPK=0")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--decode-steps", type=int, default=2)
    p.add_argument("--prompt-lens", default="700,2300,3100", help="cycled over the requests of a batch")
    p.add_argument("--mode", default="full", help="CMP mode of the executor (serial | multistream | full ...)")
    p.add_argument("--timeout", type=int, default=270, help="seconds per phase")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--fused-topk", default="1", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.wheels and not (Path(SITE) / "sglang").is_dir():
        _install_wheels(a.wheels)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    phases = [(ph, "1") for ph in a.phases.split(",") if ph]
    if a.also_unfused:
        phases.append(("eager", "0"))
    results, t0 = [], time.time()
    for ph, fused in phases:
        res_file = out / f"phase-{ph}-fused{fused}.json"
        res_file.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--worker", ph, "--fused-topk", fused, "--result", str(res_file),
               "--batches", a.batches, "--layers", str(a.layers), "--decode-steps", str(a.decode_steps),
               "--prompt-lens", a.prompt_lens, "--mode", a.mode, "--out", str(out), "--moe-layers", str(a.moe_layers)]
        env = _env()
        env["SGLANG_DSA_FUSE_TOPK"] = fused
        print(f"[{time.time() - t0:5.0f}s] phase {ph} (SGLANG_DSA_FUSE_TOPK={fused}) ...", flush=True)
        log = out / f"phase-{ph}-fused{fused}.log"
        try:
            with open(log, "w") as f:
                rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        r = json.loads(res_file.read_text()) if res_file.exists() else {}
        r.update(phase=ph, fused_topk=fused == "1", rc=rc, log=str(log))
        if rc != 0 and not r.get("error"):
            r["error"] = f"worker exit {rc}; last log lines:\n" + "".join(log.read_text().splitlines(True)[-25:])
        results.append(r)
        print(f"[{time.time() - t0:5.0f}s] phase {ph}: {'ok' if not r.get('error') else 'ERROR'}", flush=True)
    table, ok = render(results)
    print(table)
    (out / "prefix_route_check.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "prefix_route_check.md").write_text(table + "\n")
    print(f"wrote {out}/prefix_route_check.json and .md")
    return 0 if ok else 1


def _f(x, spec=".1e"):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return format(x, spec) if isinstance(x, float) else str(x)


def render(results: list) -> tuple[str, bool]:
    ok, lines = True, []
    for r in results:
        head = (f"## phase {r['phase']}  (top-k form: {'physical slots' if r['fused_topk'] else 'logical positions'}; "
                f"sglang {r.get('sglang_version')}, {r.get('gpu')}, mode {r.get('mode')})")
        lines.append(head)
        if r.get("error"):
            ok = False
            lines.append(f"ERROR: {r['error']}")
        if r.get("routes"):
            lines.append(f"layer routes: {r['routes']}")
        if r.get("executor_outcomes"):
            lines.append(f"executor outcomes (route:reason): {', '.join(r['executor_outcomes'])}")
            if any(o.startswith("stock:") for o in r["executor_outcomes"]):
                ok = False
                lines.append("FAIL: some prefix calls fell back to SGLang's path (reasons above)")
        if r.get("moe_routes"):
            lines.append(f"MoE layer routes: {r['moe_routes']}")
        if any(o.startswith("stock:") for o in r.get("moe_outcomes", [])):
            ok = False
            lines.append(f"FAIL: some MoE calls fell back to SGLang's path: {r['moe_outcomes']}")
        if r["phase"] == "eager" and r.get("moe_records") is not None and r.get("moe_routes"):
            lines.append("| MoE layer | route | M | out rel err vs SGLang | SGLang mean abs | result |")
            lines.append("|---|---|---|---|---|---|")
            if not r["moe_records"] and not r.get("error"):
                ok = False
                lines.append("(no routed MoE decode call was checked)")
            for c in r["moe_records"]:
                ok &= bool(c["passed"])
                lines.append(f"| {c['layer']} | {c['route']} | {c['M']} | {_f(c['rel_err'])} | "
                             f"{_f(c['stock_abs_mean'])} | {'PASS' if c['passed'] else 'FAIL'} |")
        if r["phase"] == "graph" and r.get("moe_routes"):
            lines.append(f"captured calls routed to MegaMoE: {r.get('moe_captured_calls')}")
            if not r.get("moe_captured_calls"):
                ok = False
        if r["phase"] == "eager":
            lines.append("| layer | route | M | max L | q_pe | k_pe | q_nope_out | k_nope | top-k overlap (min row) | "
                         "index-K rel / bytes= | other bytes kept | MLA KV rel | result |")
            lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            recs = r.get("records", [])
            if not recs and not r.get("error"):
                ok = False
                lines.append("(no routed decode call was checked)")
            for c in recs:
                if c.get("passed") is None:
                    lines.append(f"| {c['layer']} | stock | | | | | | | | | | | FALLBACK: {c.get('reason')} |")
                    ok = False
                    continue
                ok &= bool(c["passed"])
                lines.append(
                    f"| {c['layer']} | {c['route']} | {c['M']} | {_f(c.get('max_seq_len'))} | {_f(c['q_pe_rel_err'])} | "
                    f"{_f(c['k_pe_rel_err'])} | {_f(c['q_nope_out_rel_err'])} | {_f(c['k_nope_rel_err'])} | "
                    f"{_f(c['topk_overlap'], '.4f')} ({_f(c['topk_min_row_overlap'], '.3f')}) | "
                    f"{_f(c.get('index_k_rel_err'))} / {_f(c.get('index_k_bytes_equal_frac'), '.2f')} | "
                    f"{_f(c.get('index_k_other_bytes_untouched'))} | {_f(c.get('mla_kv_rel_err'))} | "
                    f"{'PASS' if c['passed'] else 'FAIL: ' + '; '.join(c['failures'])} |")
        else:
            lines.append(f"captured calls routed to our prefix: {r.get('captured_calls')} "
                         f"(eager calls during capture warm-up: {r.get('warmup_calls')})")
            lines.append("| B | step | graph replayed | logits graph vs eager (ours) | logits ours vs SGLang | "
                         "argmax agree | result |")
            lines.append("|---|---|---|---|---|---|---|")
            steps = r.get("steps", [])
            if not steps and not r.get("error"):
                ok = False
            for s in steps:
                ok &= bool(s["passed"])
                lines.append(f"| {s['B']} | {s['step']} | {_f(s['graph'])} | {_f(s['graph_vs_eager'])} | "
                             f"{_f(s['ours_vs_stock'])} | {_f(s['argmax_agree'], '.2f')} | "
                             f"{'PASS' if s['passed'] else 'FAIL'} |")
            if not r.get("captured_calls"):
                ok = False
                lines.append("FAIL: no prefix call was routed to our executor during CUDA-graph capture")
        lines.append("")
    lines.append("ALL PASS" if ok else "FAILED (see the rows above and the phase logs)")
    return "\n".join(lines), ok


# ---- worker (one phase, one process) -------------------------------------------------------------------

GRAPH_TOL, ROUTE_TOL = 1e-3, 5e-2


def _one_batch_module():
    for name in ("sglang.bench_one_batch", "sglang.benchmark.one_batch"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("neither sglang.bench_one_batch (0.5.14) nor sglang.benchmark.one_batch (0.5.23) imports")


def _server_arg_fields(ServerArgs) -> set:
    try:
        return {f.name for f in dataclasses.fields(ServerArgs)}
    except TypeError:
        return set(getattr(ServerArgs, "__struct_fields__", ()))


def _make_model(out: Path, layers: int, moe_layers: int = 0):
    from glm5_fastpath.checkpoint import checkpoint_config, write_model_files

    # `layers` dense layers, then `moe_layers` MoE layers
    cfg = checkpoint_config("glm5", layers=layers + moe_layers).replace(first_k_dense_replace=layers)
    d = out / f"glm5-{layers}d{moe_layers}m"
    d.mkdir(parents=True, exist_ok=True)
    write_model_files(d, cfg)
    return d, cfg


def _overwrite_weights(model, cfg, seed: int = 0) -> int:
    """Seeded synthetic attention weights (+ norms, embeddings) into SGLang's parameters, in its layouts."""
    import torch

    from glm5_fastpath.ref.fp8 import dequant_weight_block
    from glm5_fastpath.weights import generated_source

    def put(dst, src, name):
        src = src.to(dst.device)
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"{name}: SGLang holds {tuple(dst.shape)}, generated {tuple(src.shape)}")
        dst.data.copy_(src.to(dst.dtype))

    n = 0
    inner = getattr(model, "model", model)
    emb = inner.embed_tokens.weight
    g = torch.Generator(device=emb.device).manual_seed(seed)
    emb.data.normal_(0.0, 0.02, generator=g)
    for i, layer in enumerate(inner.layers):
        get = generated_source(cfg, i, seed)
        p = f"model.layers.{i}."
        at = layer.self_attn
        put(layer.input_layernorm.weight, get(p + "input_layernorm.weight"), "input_layernorm")
        put(layer.post_attention_layernorm.weight, get(p + "post_attention_layernorm.weight"), "post_attention_layernorm")
        qa, qas = get(p + "self_attn.q_a_proj.weight"), get(p + "self_attn.q_a_proj.weight_scale_inv")
        kva, kvas = get(p + "self_attn.kv_a_proj_with_mqa.weight"), get(p + "self_attn.kv_a_proj_with_mqa.weight_scale_inv")
        put(at.fused_qkv_a_proj_with_mqa.weight, torch.cat([qa, kva]), "fused_qkv_a")
        put(at.fused_qkv_a_proj_with_mqa.weight_scale_inv, torch.cat([qas, kvas]), "fused_qkv_a scale")
        put(at.q_a_layernorm.weight, get(p + "self_attn.q_a_layernorm.weight"), "q_a_layernorm")
        put(at.kv_a_layernorm.weight, get(p + "self_attn.kv_a_layernorm.weight"), "kv_a_layernorm")
        for m in ("q_b_proj", "o_proj", "kv_b_proj"):
            w, s = get(p + f"self_attn.{m}.weight"), get(p + f"self_attn.{m}.weight_scale_inv")
            put(getattr(at, m).weight, w, m)
            put(getattr(at, m).weight_scale_inv, s, m + " scale")
            if m == "kv_b_proj":  # SGLang's load-time split (deepseek_weight_loader): bf16 W_UK / W_UV
                kvb = dequant_weight_block(w, s).view(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim,
                                                      cfg.kv_lora_rank)
                at.w_kc.copy_(kvb[:, :cfg.qk_nope_head_dim].to(at.w_kc.device, at.w_kc.dtype))
                at.w_vc.copy_(kvb[:, cfg.qk_nope_head_dim:].transpose(1, 2).to(at.w_vc.device, at.w_vc.dtype))
        idx = getattr(at, "indexer", None)
        if idx is not None:
            ip = p + "self_attn.indexer."
            put(idx.wq_b.weight, get(ip + "wq_b.weight"), "indexer.wq_b")
            put(idx.wq_b.weight_scale_inv, get(ip + "wq_b.weight_scale_inv"), "indexer.wq_b scale")
            wk, wks, wp = get(ip + "wk.weight"), get(ip + "wk.weight_scale_inv"), get(ip + "weights_proj.weight")
            if hasattr(idx, "wk_weights_proj"):  # 0.5.23 fused indexer: bf16 [wk ; weights_proj]
                put(idx.wk_weights_proj.weight, torch.cat([dequant_weight_block(wk, wks).to(torch.bfloat16), wp]),
                    "indexer.wk_weights_proj")
            else:
                put(idx.wk.weight, wk, "indexer.wk")
                if hasattr(idx.wk, "weight_scale_inv"):
                    put(idx.wk.weight_scale_inv, wks, "indexer.wk scale")
                put(idx.weights_proj.weight, wp, "indexer.weights_proj")
            put(idx.k_norm.weight, get(ip + "k_norm.weight").float(), "indexer.k_norm.weight")
            put(idx.k_norm.bias, get(ip + "k_norm.bias").float(), "indexer.k_norm.bias")
        n += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return n


def _overwrite_moe(model, seed: int = 0) -> int:
    """Realistic MoE weights where dummy loading leaves near-zero ones: router N(0, 0.02) with a zero
    correction bias (tokens spread over the experts), experts random FP8 (|w8| up to ~256) with 128x128
    block scales ~ 0.02 / 64 (weights of magnitude ~0.02, as a trained checkpoint's); one expert at a time."""
    import torch

    n = 0
    for layer in getattr(model, "model", model).layers:
        mlp = getattr(layer, "mlp", None)
        ex = getattr(mlp, "experts", None)
        if ex is None or not hasattr(ex, "w13_weight"):
            continue
        dev = ex.w13_weight.device
        g = torch.Generator(device=dev).manual_seed(seed + 77 + n)
        mlp.gate.weight.data.normal_(0.0, 0.02, generator=g)
        bias = getattr(mlp.gate, "e_score_correction_bias", None)
        if bias is not None:
            bias.data.zero_()
        for w, s in ((ex.w13_weight, ex.w13_weight_scale_inv), (ex.w2_weight, ex.w2_weight_scale_inv)):
            for e in range(w.shape[0]):
                w.data[e].copy_((torch.randn(w.shape[1:], generator=g, device=dev) * 64).clamp(-448, 448).to(w.dtype))
            s.data.copy_(0.02 / 64 * (0.5 + torch.rand(s.shape, generator=g, device=dev)))
        n += 1
    torch.cuda.synchronize()
    return n


def worker(a) -> int:
    res: dict = {"mode": a.mode}
    rpath = Path(a.result)

    def save():
        rpath.write_text(json.dumps(res, indent=2, default=str))

    try:
        import numpy as np
        import torch

        res["gpu"] = torch.cuda.get_device_name()
        mod = _one_batch_module()
        from sglang.srt.server_args import PortArgs, ServerArgs
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        from glm5_fastpath.integrations.sglang import install as inst, patch
        from glm5_fastpath.integrations.sglang import prefix_executor as PX
        from glm5_fastpath.integrations.sglang.prefix_check import PrefixCheck
        from glm5_fastpath.testing.numerics import rel_err

        res["sglang_version"] = importlib.import_module("sglang").__version__
        batches = [int(x) for x in a.batches.split(",")]
        lens = [int(x) for x in a.prompt_lens.split(",")]
        model_dir, cfg = _make_model(Path(a.out), a.layers, a.moe_layers)
        graph = a.worker == "graph"
        kw = dict(model_path=str(model_dir), load_format="dummy", tp_size=1, attention_backend="dsa",
                  dsa_prefill_backend="flashmla_sparse", dsa_decode_backend="flashmla_sparse", kv_cache_dtype="bfloat16",
                  grammar_backend="none", disable_prefill_cuda_graph=True, disable_cuda_graph=not graph,
                  cuda_graph_bs_decode=batches, cuda_graph_max_bs_decode=max(batches), context_length=max(lens) + 256,
                  max_running_requests=max(batches), mem_fraction_static=0.55, random_seed=0,
                  chunked_prefill_size=max(batches) * max(lens))
        names = _server_arg_fields(ServerArgs)
        res["dropped_server_args"] = sorted(k for k in kw if names and k not in names)
        server_args = ServerArgs(**{k: v for k, v in kw.items() if not names or k in names})
        for fn in ("_set_envs_and_config",):
            if hasattr(mod, fn):
                getattr(mod, fn)(server_args)
        for fn in ("initialize_moe_config", "initialize_fp8_gemm_config", "initialize_fp4_gemm_config"):
            if hasattr(mod, fn):
                getattr(mod, fn)(server_args)
        port_args = PortArgs.init_new(server_args)
        t = time.time()
        wrapped, _tok = mod.load_model(server_args, port_args, 0, 0)
        mr = getattr(wrapped, "torch_runner", None) or getattr(wrapped, "model_runner", None) or wrapped
        res["load_s"] = time.time() - t
        res["weights_overwritten_layers"] = _overwrite_weights(mr.model, cfg)
        res["moe_layers_overwritten"] = _overwrite_moe(mr.model) if a.moe_layers else 0
        # install: every bucket -> cmp (+ MegaMoE), our executor in the requested CMP mode
        table = Path(a.out) / "selection-all-cmp.json"
        moe = "megamoe" if a.moe_layers else "stock"
        table.write_text(json.dumps({"version": 1, "buckets": [{"tokens": t_, "prefix": "cmp", "moe": moe}
                                                               for t_ in sorted(set(batches) | {1, 16, 64})]}))
        os.environ["GLM5_FASTPATH_CONFIG"] = str(table)
        PX._default = PX.PrefixExecutor(mode=a.mode)
        t = time.time()
        rep = inst.install_model(mr.model, inst.facts_from_model_runner(mr), model_runner=None, metrics=None)
        res["install_s"] = time.time() - t
        if not rep.installed:
            raise RuntimeError(f"install refused the model: {rep.refusal.message()}")
        ex = PX.default_executor()
        routes = {}
        for i, L in enumerate(mr.model.model.layers):
            st = L.self_attn.__dict__.get(PX.STATE)
            routes[str(i)] = "not prepared" if st is None else \
                (st.kind + (" (Hadamard-rotated indexer)" if getattr(st, "rotate", False) else "")
                 if st.kind else "stock: " + st.refusal.message())
        res["routes"] = routes
        save()
        rng = np.random.default_rng(0)

        def reqs_for(b):
            ids = [rng.integers(10, cfg.vocab_size - 10, size=lens[i % len(lens)]).tolist() for i in range(b)]
            return mod.prepare_synthetic_inputs_for_latency_test(b, max(lens), ids)

        def clear():
            mr.req_to_token_pool.clear()
            mr.token_to_kv_pool_allocator.clear()

        from glm5_fastpath.integrations.sglang import moe_executor as ME

        mex = ME.default_executor()
        if a.moe_layers:
            res["moe_routes"] = {str(i): (lambda st: "not prepared" if st is None else (st.refusal or "megamoe"))(
                getattr(L, "mlp").__dict__.get(ME.STATE)) for i, L in enumerate(mr.model.model.layers)
                if hasattr(getattr(L, "mlp", None), "experts")}
        if not graph:
            records: list = []
            patch.EXECUTORS["prefix"]["cmp"] = PrefixCheck(ex, records)
            res["records"] = records
            moe_records: list = []
            from glm5_fastpath.integrations.sglang.shadow import MOE_TOL, MoECheck  # also the in-engine shadow check
            patch.EXECUTORS["moe"]["megamoe"] = MoECheck(mex, moe_records, MOE_TOL)
            res["moe_records"] = moe_records
            for b in batches:
                clear()
                ids, _, batch = mod.extend(reqs_for(b), mr)
                for _ in range(a.decode_steps):
                    ids, _ = mod.decode(ids, batch, mr)
                torch.cuda.synchronize()
                save()
        else:
            counts = {"captured": 0, "eager": 0}

            def counting(original, *args, **kwargs):
                counts["captured" if torch.cuda.is_current_stream_capturing() else "eager"] += 1
                return ex(original, *args, **kwargs)

            patch.EXECUTORS["prefix"]["cmp"] = counting
            moe_counts = {"captured": 0, "eager": 0}

            def moe_counting(original, *args, **kwargs):
                moe_counts["captured" if torch.cuda.is_current_stream_capturing() else "eager"] += 1
                return mex(original, *args, **kwargs)

            patch.EXECUTORS["moe"]["megamoe"] = moe_counting
            t = time.time()
            mr.init_cuda_graphs()  # re-capture the decode graphs with our route in them
            res["recapture_s"] = time.time() - t
            res["captured_calls"], res["warmup_calls"] = counts["captured"], counts["eager"]
            res["moe_captured_calls"] = moe_counts["captured"]
            runner_attr = next((n for n in ("decode_cuda_graph_runner", "graph_runner", "cuda_graph_runner")
                                if getattr(mr, n, None) is not None), None)

            @contextlib.contextmanager
            def eager(stock_prefix=False):
                saved = getattr(mr, runner_attr) if runner_attr else None
                saved_fn = patch.EXECUTORS["prefix"]["cmp"]
                saved_moe = patch.EXECUTORS["moe"]["megamoe"]
                if runner_attr:
                    setattr(mr, runner_attr, None)
                if stock_prefix:  # SGLang's path for the prefix AND the MoE
                    patch.EXECUTORS["prefix"]["cmp"] = lambda original, *ar, **kw_: original(*ar, **kw_)
                    patch.EXECUTORS["moe"]["megamoe"] = lambda original, *ar, **kw_: original(*ar, **kw_)
                try:
                    yield
                finally:
                    if runner_attr:
                        setattr(mr, runner_attr, saved)
                    patch.EXECUTORS["prefix"]["cmp"] = saved_fn
                    patch.EXECUTORS["moe"]["megamoe"] = saved_moe

            steps: list = []
            res["steps"] = steps
            for b in batches:
                clear()
                ids, _, batch = mod.extend(reqs_for(b), mr)
                for s in range(a.decode_steps):
                    batch.input_ids = ids.to(torch.int64)
                    batch.prepare_for_decode()
                    if hasattr(mod, "_maybe_prepare_mlp_sync_batch"):
                        mod._maybe_prepare_mlp_sync_batch(batch, mr)
                    fb = ForwardBatch.init_new(batch, mr)
                    o = mr.forward(fb)
                    lg = o.logits_output.next_token_logits.float().clone()
                    with eager():
                        le = mr.forward(fb).logits_output.next_token_logits.float().clone()
                    with eager(stock_prefix=True):
                        ls = mr.forward(fb).logits_output.next_token_logits.float().clone()
                    torch.cuda.synchronize()
                    row = {"B": b, "step": s, "graph": bool(getattr(o, "can_run_graph", False)),
                           "graph_vs_eager": rel_err(lg, le), "ours_vs_stock": rel_err(le, ls),
                           "argmax_agree": float((le.argmax(-1) == ls.argmax(-1)).float().mean())}
                    row["passed"] = (row["graph"] and row["graph_vs_eager"] <= GRAPH_TOL
                                     and row["ours_vs_stock"] <= ROUTE_TOL)
                    steps.append(row)
                    ids = ls.argmax(-1)
                    save()
        res["executor_outcomes"] = sorted(f"{r}:{why}" for r, why in PX.default_executor()._once)
        res["moe_outcomes"] = sorted(f"{r}:{why}" for r, why in mex._once)
        return 0
    except Exception as e:  # noqa: BLE001 - record it for the table
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-6000:]
        traceback.print_exc()
        return 1
    finally:
        save()


if __name__ == "__main__":
    sys.exit(main())
