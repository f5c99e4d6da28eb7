"""`glm5-fastpath bench offline`: SGLang's offline Engine, stock vs glm5_fastpath, same prompts (issues #7, #9).

Parent (this CLI, no sglang / torch import): validates the options, makes the seeded random token-id
prompts, and for each mode starts a FRESH worker process

    python -m glm5_fastpath.bench.offline worker CONFIG.json

whose environment carries the switch (GLM5_FASTPATH=1 for "fastpath", unset for "stock") and, on SGLang
releases without the `sglang.srt.plugins` group (0.5.14), SGLANG_EXTERNAL_MODEL_PACKAGE pointing at our
`GlmMoeDsaForCausalLM` subclass. The worker calls `load_plugins()` when that exists, builds one
`Engine` (skip_tokenizer_init, decode CUDA graphs for exactly the measured batch sizes), optionally gives
every MoE router N(0, 0.02) weights and a zero correction bias (`update_weights_from_tensor`), and per
batch size B runs:

1. a warm-up `generate` of B prompts with a few output tokens;
2. the timed pass: `num_prompts / B` calls of `generate` with B prompts each, greedy, ignore_eos,
   `output_len` new tokens -> output tok/s = generated tokens / wall time of those calls (prefill of
   the short prompts included); TTFT / per-request ITL from the response meta_info when SGLang gives
   `first_token_latency` / `e2e_latency`, else not reported from this pass;
3. a streamed pass (B concurrent `async_generate(stream=True)`) -> per-token wall-clock TTFT and ITL;
4. with `--profile-steps N` and B in `--profile-batches` (default: every measured B), a profiled pass: B
   streamed requests of `output_len` tokens; once every request has its first token (prefill done, all B
   decoding), SGLang's own profiler is started through the Engine's tokenizer manager (what
   `Engine.start_profile` calls) with `num_steps = N + 2`, CPU + GPU activities, no stacks, no shapes,
   `output_dir = --out/profile-<mode>-b<B>/`; the scheduler starts the torch profiler at once and stops it by
   itself after N + 2 forward passes, all of them decode steps at batch B, and writes one
   `*.trace.json.gz` there. The parent analyzes each trace with `trace_breakdown` (per step: GPU busy / idle,
   busy per kernel category, top kernels, host launch interval), writes `breakdown.json` / `breakdown.md`
   beside it and puts the summary into the report.

It writes `mode-<mode>.json` into --out. The parent then merges every `mode-*.json` with the same
run key found in --out (so stock and fastpath can run in separate 10-minute commands) into
`offline.json`, `offline.md` and `offline.png` (if matplotlib is present), with the speedup, the greedy
token agreement of the first request of each batch, and the decode-step bytes floor
(`cost.layer_summary` of every layer + lm_head, at 4.27 TB/s, uniform-routing expected experts).

Distinct experts per layer are NOT measured (SGLang exposes no routing through the Engine API); the
report gives the uniform-routing expectation that the floor uses and says so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import host_timing

# SGLang spawns its scheduler process, which re-imports this module as its main module: with
# GLM5_FASTPATH_HOST_TIMING set (bench offline --host-timing), that process times its loop (bench/host_timing.py)
host_timing.install_from_env()

MODES = ("stock", "fastpath")
SEAMS = ("auto", "plugin", "external-model-package")
EXTERNAL_PACKAGE = "glm5_fastpath.integrations.sglang.models"
ENV_SWITCH = "GLM5_FASTPATH"
ENV_EXTERNAL = "SGLANG_EXTERNAL_MODEL_PACKAGE"
ENV_REALISTIC_DUMMY = "GLM5_FASTPATH_BENCH_REALISTIC_DUMMY"  # bench/dummy_weights.ENV (not imported: no torch here)
ENV_CONFIG = "GLM5_FASTPATH_CONFIG"
PLUGIN_MIN_VERSION = (0, 5, 23)  # first SGLang with the sglang.srt.plugins entry-point group
ROUTER_STD = 0.02
WARMUP_TOKENS = 4
FIRST_TOKENS_KEPT = 32
ROUTING_TOKENS = 16  # generated tokens per request in the --routing-stats pass
H200_COPY_BW = 4.27e12
PROFILE_ACTIVITIES = ("CPU", "GPU")
# forward passes asked of SGLang beyond --profile-steps: the last profiled step has no next step to close its
# GPU window, and the one the scheduler is running on the GPU when the profiler stops may lose its tail
PROFILE_EXTRA_STEPS = 2
PROFILE_MAX_STEPS = 50  # keep traces small: ~5 steps is enough for a per-step breakdown
PROFILE_TAIL_TOKENS = 16  # output tokens beyond the profiled steps (the profile request reaches the scheduler late)
PROFILE_FIRST_TOKEN_TIMEOUT_S = 300.0
HOST_TIMING_SETTLE_S = 2.5  # > FLUSH_S + one idle poll (<= 1 s, SGLang's idle sleeper): the loop writes its last lines
PROFILE_DIR = "profile-{mode}-b{batch}"

# sm90 arguments that avoid FA3 and tilelang (header of shared/tools/sglang-h200-wheels.sh).
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "tp_size": 1,
    "attention_backend": "dsa",
    "dsa_prefill_backend": "flashmla_sparse",
    "dsa_decode_backend": "flashmla_sparse",
    "kv_cache_dtype": "bfloat16",
    "grammar_backend": "none",
    "disable_prefill_cuda_graph": True,
    "skip_tokenizer_init": True,
    # the warm-up generate uses the timed pass's prompts: with the radix cache on, the timed prefill (and the
    # streamed pass's TTFT) would be one cached-prefix token, a shape the warm-up never compiled (on 2026-11-29
    # the first engine's lazy DeepGEMM JIT landed in its timed passes: stock batch 8 at 19 % of the floor)
    "disable_radix_cache": True,
}
DEFAULT_ENV = {
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0",  # no FA3 on sm90 (shared/tools/sglang-h200-wheels.sh)
    # SGLang's DeepGEMM warm-up JIT-compiles every GEMM shape for M = 1..16384 at start-up (on a fresh H200 on
    # 2026-11-29 the batch-64 graph capture that contains it took 357 s of a 540 s budget); off, each shape
    # compiles on first use, in the warm-up generate before the timed pass. Same for both modes.
    "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0",
}
# decode-graph sizes: whichever of these ServerArgs fields exist get the measured batch sizes / their max
GRAPH_LIST_KEYS = ("cuda_graph_bs_decode", "cuda_graph_bs")
GRAPH_MAX_KEYS = ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")


# ---- options -----------------------------------------------------------------------------------------

@dataclass
class OfflineOptions:
    model: str
    batch_sizes: list[int] = field(default_factory=lambda: [1, 16, 32])
    input_len: int = 128
    output_len: int = 128
    num_prompts: int | None = None  # per batch size; None -> `calls` calls of B prompts
    calls: int = 1  # timed generate calls of B prompts per batch size (when num_prompts is None)
    load_format: str = "auto"
    randomize_routers: bool = False
    realistic_dummy: bool = False  # dummy weights with O(1) activations in both modes (bench/dummy_weights.py)
    modes: list[str] = field(default_factory=lambda: list(MODES))
    out: str = "benchmarks/results/offline"
    dry_run: bool = False
    report_only: bool = False  # merge the mode-*.json already in --out (same settings) into the report; run nothing
    engine_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    seam: str = "auto"
    stream_pass: bool = True
    timeout_s: int = 3600
    fastpath_config: str | None = None  # selection table for the fastpath worker (GLM5_FASTPATH_CONFIG)
    routing_stats: bool = False  # measure distinct experts per MoE layer per decode step (both modes)
    profile_steps: int = 0  # decode steps to profile per batch size (0: no profile)
    profile_batches: list[int] | None = None  # None: every measured batch size
    profile_activities: list[str] = field(default_factory=lambda: list(PROFILE_ACTIVITIES))
    host_timing: bool = False  # time SGLang's scheduler loop per decode iteration (bench/host_timing.py)

    def profiled_batches(self) -> list[int]:
        if not self.profile_steps:
            return []
        return sorted(self.profile_batches) if self.profile_batches is not None else sorted(self.batch_sizes)

    def prompts_per_batch(self, b: int) -> int:
        return self.num_prompts if self.num_prompts is not None else b * self.calls


def _int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("empty list")
    return vals


def _mode_list(s: str) -> list[str]:
    vals = [x.strip() for x in s.split(",") if x.strip()]
    bad = [v for v in vals if v not in MODES]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"modes must be from {','.join(MODES)}, got {s!r}")
    return list(dict.fromkeys(vals))


def _activity_list(s: str) -> list[str]:
    vals = [x.strip().upper() for x in s.split(",") if x.strip()]
    bad = [v for v in vals if v not in PROFILE_ACTIVITIES]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"profile activities must be from {','.join(PROFILE_ACTIVITIES)}, got {s!r}")
    return list(dict.fromkeys(vals))


def parse_value(v: str) -> Any:
    """Engine-arg value: JSON when it parses (true, 3, 0.8, [1,2], "x"), else the string."""
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def parse_engine_args(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items or ():
        if "=" not in it:
            raise ValueError(f"--engine-arg {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        k = k.strip().lstrip("-").replace("-", "_")
        if not k.isidentifier():
            raise ValueError(f"--engine-arg {it!r}: {k!r} is not a ServerArgs field name")
        out[k] = parse_value(v)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model dir with config.json (real or synthetic checkpoint)")
    p.add_argument("--batch-sizes", type=_int_list, default=[1, 16, 32], help="comma list (default 1,16,32)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random ids)")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts per batch size, sent B at a time (multiple of every B; default B)")
    p.add_argument("--calls", type=int, default=1,
                   help="timed generate calls of B prompts per batch size (tok/s over all of them; default 1). One call of "
                        "1 prompt moved batch 1's tok/s by up to 10 %% between identical engine runs (session 29)")
    p.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    p.add_argument("--randomize-routers", action="store_true",
                   help="give MoE routers N(0,0.02) weights + zero correction bias (realistic routing with dummy weights)")
    p.add_argument("--realistic-dummy", action="store_true",
                   help="with --load-format dummy: norm weights 1 and FP8 block scales at unit gain in BOTH modes "
                        "(glm5_fastpath/bench/dummy_weights.py), so the greedy-token check sees every layer; "
                        "needs the external-model-package seam")
    p.add_argument("--modes", type=_mode_list, default=list(MODES), help="comma list of stock,fastpath")
    p.add_argument("--out", default="benchmarks/results/offline", help="output dir (JSON, markdown, PNG)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the worker commands; import no sglang")
    p.add_argument("--report-only", action="store_true",
                   help="run no engine: merge the mode-*.json results already in --out that have these settings "
                        "(e.g. stock and fastpath from separate calls) into offline.json / .md / .png")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="override/add an Engine (ServerArgs) argument; VALUE parsed as JSON if it parses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seam", choices=SEAMS, default="auto",
                   help="how fastpath mode reaches SGLang: plugin entry point (>=0.5.23) or external model package")
    p.add_argument("--no-stream-pass", dest="stream_pass", action="store_false",
                   help="skip the streamed TTFT/ITL pass")
    p.add_argument("--timeout", dest="timeout_s", type=int, default=3600, help="per-mode worker timeout (s)")
    p.add_argument("--routing-stats", action="store_true",
                   help="start both engines with enable_return_routed_experts and, after each batch's timed passes, "
                        f"generate {ROUTING_TOKENS} tokens per request with return_routed_experts=True to measure the "
                        "distinct experts per MoE layer per decode step (SGLang's own routed-experts capturer)")
    p.add_argument("--fastpath-config", default=None, metavar="TABLE.json",
                   help="selection table for the fastpath run (GLM5_FASTPATH_CONFIG); default: the shipped table "
                        "for the GPU (which selects SGLang's path everywhere until a measured table ships)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="after the timed passes of a batch size, profile N pure decode steps at that batch with "
                        "SGLang's profiler (torch profiler, no stacks/shapes) into OUT/profile-<mode>-b<B>/ and add "
                        f"the per-step breakdown to the report (0: off; at most {PROFILE_MAX_STEPS}; ~5 is enough)")
    p.add_argument("--profile-batches", type=_int_list, default=None, metavar="B,B",
                   help="batch sizes to profile (default: every measured one); each must be in --batch-sizes")
    p.add_argument("--profile-activities", type=_activity_list, default=list(PROFILE_ACTIVITIES),
                   help="profiler activities, CPU,GPU (default; CPU adds the host side) or GPU")
    p.add_argument("--host-timing", action="store_true",
                   help="time SGLang's scheduler loop per decode iteration without a profiler (loop period, the "
                        "host's waits on the GPU, each loop stage; glm5_fastpath/bench/host_timing.py), both modes, "
                        "and add a per-batch table to the report: whether the host or the GPU paces the step")


def options_from_args(a: argparse.Namespace) -> OfflineOptions:
    return OfflineOptions(model=a.model, batch_sizes=list(a.batch_sizes), input_len=a.input_len,
                          output_len=a.output_len, num_prompts=a.num_prompts, calls=a.calls,
                          load_format=a.load_format,
                          randomize_routers=a.randomize_routers, realistic_dummy=a.realistic_dummy,
                          modes=list(a.modes), out=a.out, dry_run=a.dry_run,
                          report_only=a.report_only,
                          engine_args=parse_engine_args(a.engine_arg), seed=a.seed, seam=a.seam,
                          stream_pass=a.stream_pass, timeout_s=a.timeout_s, fastpath_config=a.fastpath_config,
                          routing_stats=a.routing_stats,
                          profile_steps=a.profile_steps, profile_batches=a.profile_batches,
                          profile_activities=list(a.profile_activities), host_timing=a.host_timing)


def read_model_config(model: str) -> dict:
    p = Path(model) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"--model {model}: no config.json there")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{p}: top level must be a JSON object")
    return d


def validate_profile(o: OfflineOptions) -> None:
    if o.profile_steps < 0 or o.profile_steps > PROFILE_MAX_STEPS:
        raise ValueError(f"--profile-steps must be in 0..{PROFILE_MAX_STEPS} (traces stay small; ~5 steps is "
                         f"enough), got {o.profile_steps}")
    if not o.profile_steps:
        if o.profile_batches is not None:
            raise ValueError("--profile-batches needs --profile-steps N (N >= 1)")
        return
    if o.profile_batches is not None:
        if not o.profile_batches or any(b < 1 for b in o.profile_batches):
            raise ValueError(f"--profile-batches must be positive integers, got {o.profile_batches}")
        bad = sorted(set(o.profile_batches) - set(o.batch_sizes))
        if bad:
            raise ValueError(f"--profile-batches {bad} not among the measured batch sizes {sorted(o.batch_sizes)} "
                             "(the decode CUDA graphs are captured for those only)")
    if not o.profile_activities or any(a not in PROFILE_ACTIVITIES for a in o.profile_activities):
        raise ValueError(f"--profile-activities must be from {PROFILE_ACTIVITIES}, got {o.profile_activities}")
    if "GPU" not in o.profile_activities:
        raise ValueError("--profile-activities must include GPU (the breakdown is of GPU kernels)")
    need = o.profile_steps + PROFILE_EXTRA_STEPS + PROFILE_TAIL_TOKENS
    if o.output_len < need:
        raise ValueError(f"--output-len {o.output_len} is too short to profile {o.profile_steps} decode steps: "
                         f"needs >= {need} (steps + {PROFILE_EXTRA_STEPS} closing steps + {PROFILE_TAIL_TOKENS} "
                         "for the profile request to reach the scheduler)")


def profile_config(o: OfflineOptions) -> dict | None:
    if not o.profile_steps:
        return None
    return {"steps": o.profile_steps, "sglang_num_steps": o.profile_steps + PROFILE_EXTRA_STEPS,
            "batches": o.profiled_batches(), "activities": list(o.profile_activities), "with_stack": False,
            "record_shapes": False, "dir_pattern": str(Path(o.out).resolve() / PROFILE_DIR)}


def validate(o: OfflineOptions) -> dict:
    """Raise ValueError / FileNotFoundError with a clear message; return the model's config.json."""
    if not o.batch_sizes or any(b < 1 for b in o.batch_sizes):
        raise ValueError(f"--batch-sizes must be positive integers, got {o.batch_sizes}")
    if len(set(o.batch_sizes)) != len(o.batch_sizes):
        raise ValueError(f"--batch-sizes has duplicates: {o.batch_sizes}")
    if o.input_len < 1 or o.output_len < 2:
        raise ValueError(f"--input-len must be >= 1 and --output-len >= 2 (got {o.input_len}, {o.output_len})")
    if o.calls < 1:
        raise ValueError(f"--calls must be >= 1, got {o.calls}")
    if o.num_prompts is not None and o.calls != 1:
        raise ValueError("--calls and --num-prompts both set the timed pass's size; give one")
    if o.num_prompts is not None:
        if o.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {o.num_prompts}")
        bad = [b for b in o.batch_sizes if o.num_prompts % b]
        if bad:
            raise ValueError(f"--num-prompts {o.num_prompts} is not a multiple of batch size(s) {bad}: "
                             "prompts are sent B at a time so that decode runs at exactly batch B")
    if not o.modes or any(m not in MODES for m in o.modes):
        raise ValueError(f"--modes must be from {MODES}, got {o.modes}")
    if o.load_format not in ("auto", "dummy"):
        raise ValueError(f"--load-format must be auto or dummy, got {o.load_format!r}")
    if o.seam not in SEAMS:
        raise ValueError(f"--seam must be one of {SEAMS}, got {o.seam!r}")
    for k in ("model_path", "load_format"):
        if k in o.engine_args:
            raise ValueError(f"--engine-arg {k}: use --model / --load-format instead")
    validate_profile(o)
    if o.fastpath_config is not None:
        from ..selection import load as load_table

        load_table(o.fastpath_config)  # a bad table fails here, with the key named, not inside the engine
    if o.realistic_dummy and o.load_format != "dummy":
        raise ValueError("--realistic-dummy rescales dummy weights: it needs --load-format dummy")
    cfg = read_model_config(o.model)
    if o.load_format == "auto" and not any(Path(o.model).glob("*.safetensors")):
        raise ValueError(f"--model {o.model} holds no *.safetensors; use --load-format dummy for a config-only dir")
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"{o.model}/config.json: vocab_size missing or invalid")
    if o.randomize_routers and not router_tensor_names(cfg):
        raise ValueError("--randomize-routers: the model config has no MoE layer")
    return cfg


# ---- prompts, routers, engine args -----------------------------------------------------------------------

def make_prompts(n: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """n prompts of input_len token ids, deterministic in seed; ids avoid the lowest 10 and the top 1% of
    the vocabulary (where GLM tokenizers keep their special tokens)."""
    lo, hi = min(10, vocab_size - 1), max(min(10, vocab_size - 1) + 1, int(vocab_size * 0.99))
    rng = random.Random(f"glm5-offline-{seed}-{input_len}-{vocab_size}")
    return [[rng.randrange(lo, hi) for _ in range(input_len)] for _ in range(n)]


def moe_layers(cfg: dict) -> list[int]:
    n = int(cfg.get("num_hidden_layers", 0))
    k = int(cfg.get("first_k_dense_replace", 0) or 0)
    freq = int(cfg.get("moe_layer_freq", 1) or 1)
    if not cfg.get("n_routed_experts"):
        return []
    return [i for i in range(n) if i >= k and i % freq == 0]


def router_tensor_names(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the router tensors update_weights_from_tensor replaces, MoE layers only."""
    e, h = int(cfg.get("n_routed_experts") or 0), int(cfg.get("hidden_size") or 0)
    out = []
    for i in moe_layers(cfg):
        out.append((f"model.layers.{i}.mlp.gate.weight", (e, h)))
        out.append((f"model.layers.{i}.mlp.gate.e_score_correction_bias", (e,)))
    return out


def engine_kwargs(o: OfflineOptions) -> dict[str, Any]:
    """Engine kwargs before filtering against the installed ServerArgs (the worker drops unknown DEFAULT keys
    that the release lacks, e.g. cuda_graph_bs_decode on 0.5.23; user --engine-arg keys are never dropped)."""
    bs = sorted(o.batch_sizes)
    kw: dict[str, Any] = {"model_path": os.path.abspath(o.model), "load_format": o.load_format,
                          "random_seed": o.seed, "max_running_requests": max(bs)}
    kw.update(DEFAULT_ENGINE_ARGS)
    for k in GRAPH_LIST_KEYS:
        kw[k] = bs
    for k in GRAPH_MAX_KEYS:
        kw[k] = max(bs)
    kw["context_length"] = o.input_len + o.output_len + 16
    if o.routing_stats:
        kw["enable_return_routed_experts"] = True
    kw.update(o.engine_args)
    return kw


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def installed_sglang_version() -> str | None:
    from ..platform import dist_version

    return dist_version("sglang")


def resolve_seam(seam: str, sglang_version: str | None) -> str:
    if seam != "auto":
        return seam
    if sglang_version and _version_tuple(sglang_version) >= PLUGIN_MIN_VERSION:
        return "plugin"
    return "external-model-package"


def mode_env(mode: str, seam: str, base: dict[str, str] | None = None, config: str | None = None,
             realistic_dummy: bool = False) -> dict[str, str]:
    """Environment of a worker: the parent's, the sm90 defaults, and the mode's switch. realistic_dummy: both
    modes load our GlmMoeDsaForCausalLM subclass (external model package) with ENV_REALISTIC_DUMMY=1; stock
    without GLM5_FASTPATH=1, so it runs SGLang's path on the same rescaled weights."""
    env = dict(os.environ if base is None else base)
    for k, v in DEFAULT_ENV.items():
        env.setdefault(k, v)
    env.pop(ENV_SWITCH, None)
    env.pop(ENV_EXTERNAL, None)
    env.pop(ENV_CONFIG, None)
    env.pop(ENV_REALISTIC_DUMMY, None)
    if realistic_dummy:
        env[ENV_REALISTIC_DUMMY] = "1"
        env[ENV_EXTERNAL] = EXTERNAL_PACKAGE
    if mode == "fastpath":
        env[ENV_SWITCH] = "1"
        env.setdefault("GLM5_FASTPATH_LOG_LEVEL", "INFO")  # routing lines in the worker log (Engine logs at error)
        if config:
            env[ENV_CONFIG] = os.path.abspath(config)
        if seam == "external-model-package":
            env[ENV_EXTERNAL] = EXTERNAL_PACKAGE
    return env


def run_key(o: OfflineOptions) -> str:
    """Identifies comparable runs: same model, prompts, lengths, batch sizes, load format, routers, engine args."""
    d = {"model": os.path.abspath(o.model), "bs": sorted(o.batch_sizes), "in": o.input_len, "out": o.output_len,
         "n": o.num_prompts, **({"calls": o.calls} if o.calls != 1 else {}), "lf": o.load_format, "rr": o.randomize_routers, "seed": o.seed,
         **({"rd": True} if o.realistic_dummy else {}),
         "ea": sorted(o.engine_args.items(), key=lambda kv: kv[0]), **({"rs": True} if o.routing_stats else {}),
         **({"ht": True} if o.host_timing else {})}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def worker_config(o: OfflineOptions, mode: str, seam: str, cfg: dict) -> dict:
    out = Path(o.out).resolve()
    return {
        "mode": mode, "seam": seam, "run_key": run_key(o), "engine_kwargs": engine_kwargs(o),
        "user_engine_keys": sorted(o.engine_args), "batch_sizes": sorted(o.batch_sizes),
        "prompts_per_batch": {str(b): o.prompts_per_batch(b) for b in sorted(o.batch_sizes)},
        "input_len": o.input_len, "output_len": o.output_len, "seed": o.seed,
        "prompts_file": str(out / "prompts.json"), "randomize_routers": o.randomize_routers,
        "router_tensors": [[n, list(s)] for n, s in router_tensor_names(cfg)] if o.randomize_routers else [],
        "stream_pass": o.stream_pass, "result_file": str(out / f"mode-{mode}.json"),
        "routing_stats": o.routing_stats, "moe_layers": moe_layers(cfg), "num_layers": int(cfg.get("num_hidden_layers", 0)),
        "topk": int(cfg.get("num_experts_per_tok") or 0),
        "profile": profile_config(o),
        "host_timing_file": str(out / f"host-timing-{mode}.jsonl") if o.host_timing else None,
    }


def worker_command(config_path: str) -> list[str]:
    return [sys.executable, "-m", "glm5_fastpath.bench.offline", "worker", config_path]


def plan(o: OfflineOptions, sglang_version: str | None = None) -> list[dict]:
    """Per mode: {mode, command, env (only the keys we set/unset), config} — no side effects."""
    cfg = validate(o)
    seam = resolve_seam(o.seam, sglang_version)
    out = []
    for mode in o.modes:
        if o.realistic_dummy and seam != "external-model-package":
            raise ValueError(f"--realistic-dummy needs the external-model-package seam (resolved: {seam}); "
                             "pass --seam external-model-package")
        env = mode_env(mode, seam, base={}, config=o.fastpath_config, realistic_dummy=o.realistic_dummy)
        wc = worker_config(o, mode, seam, cfg)
        cpath = str(Path(o.out).resolve() / f"worker-{mode}.json")
        shown_env = {k: env.get(k) for k in (ENV_SWITCH, ENV_EXTERNAL, ENV_CONFIG, ENV_REALISTIC_DUMMY, *DEFAULT_ENV)}
        out.append({"mode": mode, "command": worker_command(cpath), "config_path": cpath, "env": shown_env,
                    "config": wc})
    return out


def render_plan(steps: list[dict], sglang_version: str | None) -> str:
    lines = [f"bench offline --dry-run: {len(steps)} worker process(es), sglang installed here: {sglang_version or 'no'}"]
    for s in steps:
        unset = [f"-u {k}" for k, v in s["env"].items() if v is None]
        env = " ".join(unset + [f"{k}={shlex.quote(v)}" for k, v in s["env"].items() if v is not None])
        lines.append(f"\n[{s['mode']}] env {env} {' '.join(shlex.quote(c) for c in s['command'])}")
        cfg = dict(s["config"])
        cfg["router_tensors"] = f"{len(cfg['router_tensors'])} tensors" + (
            f" ({cfg['router_tensors'][0][0]} ...)" if cfg["router_tensors"] else "")
        lines.append(json.dumps(cfg, sort_keys=True))
        prof = cfg.get("profile")
        if prof:
            lines.append(f"profile: {prof['steps']} decode steps (SGLang num_steps={prof['sglang_num_steps']}) at "
                         f"batch {','.join(map(str, prof['batches']))}, activities {','.join(prof['activities'])}, "
                         "no stacks, no shapes -> "
                         + prof["dir_pattern"].format(mode=s["mode"], batch="<B>") + "/ (breakdown.md beside)")
    return "\n".join(lines)


# ---- statistics and the report (pure) --------------------------------------------------------------------

def percentiles(xs: Sequence[float], ps: Sequence[int] = (50, 90, 99)) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    out = {}
    for p in ps:
        pos = (len(s) - 1) * p / 100
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        out[f"p{p}"] = s[lo] + (s[hi] - s[lo]) * (pos - lo)
    out["mean"] = sum(s) / len(s)
    return out


def floor_per_batch(cfg_dict: dict, batch_sizes: Sequence[int], kv_len: int) -> dict[int, dict]:
    """Decode-step bytes floor (all layers + lm_head, uniform-routing expected experts) per batch size."""
    from ..config import Glm5Config
    from ..cost import expected_distinct_experts, layer_summary

    cfg = Glm5Config.from_dict(cfg_dict, "<model config.json>")
    out = {}
    for m in batch_sizes:
        b = sum(layer_summary(cfg, m, kv_len, layer=i).bytes for i in range(cfg.num_hidden_layers))
        b += cfg.vocab_size * cfg.hidden_size * 2  # lm_head (bf16)
        t = b / H200_COPY_BW
        out[m] = {"bytes_per_step": b, "floor_step_us": t * 1e6, "floor_tok_s": m / t,
                  "expected_distinct_experts_per_moe_layer":
                      expected_distinct_experts(m, cfg.n_routed_experts, cfg.num_experts_per_tok)}
    return out


def first_divergence(a: Sequence[int] | None, b: Sequence[int] | None) -> int | None:
    """Index of the first differing token (None if equal over the shorter length or missing)."""
    if not a or not b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def logprob_gap(a: dict | None, b: dict | None) -> tuple[float | None, int]:
    """(max |logprob_a - logprob_b| over the leading tokens where both runs chose the same id, how many):
    the engine-level numeric gap of two greedy runs. FP8 re-quantisation noise gives small gaps; a route that
    computes something else gives large ones (with --realistic-dummy, where every layer moves the logits)."""
    if not a or not b:
        return None, 0
    ids_a, ids_b = a.get("ids") or [], b.get("ids") or []
    lp_a, lp_b = a.get("logprobs") or [], b.get("logprobs") or []
    gaps = []
    for x, y, u, v in zip(ids_a, ids_b, lp_a, lp_b):
        if x != y:
            break
        if u is None or v is None:
            continue
        gaps.append(abs(float(u) - float(v)))
    return (max(gaps) if gaps else None), len(gaps)


def first_choice_difference(a: dict | None, b: dict | None) -> dict | None:
    """At the first token where two logprob passes chose different ids: the index and each pass's (id, logprob),
    which says how close the choice was (two candidates at similar logprobs: a near tie that noise can flip)."""
    if not a or not b:
        return None
    def at(d: dict, i: int) -> float | None:
        lps = d.get("logprobs") or []
        return lps[i] if i < len(lps) else None

    for i, (x, y) in enumerate(zip(a.get("ids") or [], b.get("ids") or [])):
        if x != y:
            return {"index": i, "a": [int(x), at(a, i)], "b": [int(y), at(b, i)]}
    return None


def non_decode_ms_per_call(br: dict, batch: int) -> float | None:
    """Per timed call, the wall time outside the decode steps: wall / calls - (tokens per request - 1) x ITL mean
    (prefill, first-token and batch turnaround). Batch 1's tok/s moved by up to 10 % between identical single-call runs
    because this share did (36-95 ms; 36-43 ms over 8 calls: session 30). None without the numbers."""
    calls = br.get("calls") or 1
    wall, n, itl = br.get("wall_s"), br.get("output_tokens"), (br.get("itl_ms") or {}).get("mean")
    if not (wall and n and itl and batch):
        return None
    per_request = n / (calls * batch)
    return 1e3 * (wall / calls) - (per_request - 1) * itl


def build_report(mode_results: dict[str, dict], *, floors: dict[int, dict] | None = None,
                 meta: dict | None = None) -> dict:
    """Combine per-mode worker results into the report dict (rows per batch size)."""
    bss = sorted({int(b) for r in mode_results.values() for b in r.get("batches", {})})
    rows = []
    for b in bss:
        row: dict[str, Any] = {"batch": b}
        for mode, r in mode_results.items():
            br = r.get("batches", {}).get(str(b), {})
            row[mode] = {k: br.get(k) for k in ("output_tok_s", "ttft_ms", "itl_ms", "latency_source", "error",
                                                 "wall_s", "output_tokens", "distinct_experts", "calls")}
            row[mode]["non_decode_ms_per_call"] = non_decode_ms_per_call(br, b)
            if br.get("profile"):
                p = br["profile"]
                row[mode]["profile"] = {k: p.get(k) for k in ("dir", "steps_requested", "traces", "trace_bytes",
                                                               "error", "breakdown_error", "breakdown", "wall_s")
                                        if p.get(k) is not None}
        s = (row.get("stock") or {}).get("output_tok_s")
        f = (row.get("fastpath") or {}).get("output_tok_s")
        row["speedup"] = (f / s) if (s and f) else None
        if floors and b in floors:
            fl = floors[b]
            row["floor_tok_s"] = fl["floor_tok_s"]
            row["floor_step_us"] = fl["floor_step_us"]
            row["expected_distinct_experts"] = fl["expected_distinct_experts_per_moe_layer"]
            for mode in mode_results:
                t = row[mode].get("output_tok_s")
                row[mode]["pct_of_floor"] = 100 * t / fl["floor_tok_s"] if t else None
                # the decode step alone: floor step / ITL p50 (tok/s above also carries the prefill and scheduling)
                itl = (row[mode].get("itl_ms") or {}).get("p50")
                row[mode]["pct_of_floor_itl"] = 100 * fl["floor_step_us"] / (1000 * itl) if itl else None
                # faster than streaming the weights the step must read: the run skipped work (a wrong route),
                # not a fast kernel; the report flags it instead of printing it as a speedup
                row[mode]["above_floor"] = bool(t and t > fl["floor_tok_s"])
        if "stock" in mode_results and "fastpath" in mode_results:
            a = mode_results["stock"].get("batches", {}).get(str(b), {}).get("first_tokens")
            c = mode_results["fastpath"].get("batches", {}).get(str(b), {}).get("first_tokens")
            row["greedy_first_divergence"] = first_divergence(a, c)
            row["greedy_compared_tokens"] = min(len(a), len(c)) if a and c else 0
            la = mode_results["stock"].get("batches", {}).get(str(b), {}).get("first_logprobs")
            lc = mode_results["fastpath"].get("batches", {}).get(str(b), {}).get("first_logprobs")
            gap, n_lp = logprob_gap(la, lc)
            if n_lp:
                row["logprob_max_abs_diff"], row["logprob_compared_tokens"] = gap, n_lp
            fc = first_choice_difference(la, lc)
            if fc is not None:
                row["first_choice_difference"] = {"index": fc["index"], "stock": fc["a"], "fastpath": fc["b"]}
        rows.append(row)
    measured = any((row.get(mo) or {}).get("distinct_experts", {}) and "mean" in row[mo]["distinct_experts"]
                   for row in rows for mo in mode_results)
    note = ("measured per decode step with SGLang's routed-experts capturer (--routing-stats: union over the B "
            f"requests at each of {ROUTING_TOKENS - 1} decode steps, mean over steps, per MoE layer; the table gives "
            "the mean over layers); the floor still uses the uniform-routing expectation" if measured else
            "not measured (run with --routing-stats); expected_distinct_experts is the uniform-routing value the "
            "floor uses")
    return {"meta": meta or {}, "modes": {m: {k: v for k, v in r.items() if k != "batches"}
                                         for m, r in mode_results.items()},
            "rows": rows, "distinct_experts_per_layer": note}


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def render_markdown(rep: dict) -> str:
    modes = list(rep["modes"])
    m = rep.get("meta", {})
    lines = ["# Offline decode throughput: stock SGLang vs glm5_fastpath", ""]
    for k in ("gpu", "date", "commit", "sglang_version", "model", "load_format", "randomize_routers",
              "realistic_dummy", "input_len", "output_len", "seam"):
        if k in m:
            lines.append(f"- {k}: {m[k]}")
    lines.append("")
    bad = [f"{mo} batch {r['batch']}" for r in rep["rows"] for mo in modes if (r.get(mo) or {}).get("above_floor")]
    if bad:
        lines += [f"**INVALID: {', '.join(bad)} decoded faster than the bytes floor** (the weights each step must "
                  "read at the GPU's bandwidth): that run skipped work, so its numbers and speedups are not "
                  "results. Find the route that dropped it before using this table.", ""]
    head = ["batch"]
    for mo in modes:
        head += [f"{mo} tok/s", f"{mo} % floor", f"{mo} % floor (ITL)", f"{mo} TTFT p50 ms", f"{mo} ITL p50/p99 ms",
                 f"{mo} non-decode ms/call"]
    head += ["speedup", "floor tok/s", "exp. experts/layer", "measured experts/layer", "greedy 1st diff"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rep["rows"]:
        cells = [str(r["batch"])]
        for mo in modes:
            d = r.get(mo) or {}
            if d.get("error"):
                cells += [f"error: {d['error'][:60]}", "-", "-", "-", "-", "-"]
                continue
            ttft, itl = d.get("ttft_ms") or {}, d.get("itl_ms") or {}
            cells += [_f(d.get("output_tok_s")), _f(d.get("pct_of_floor")) + (" INVALID" if d.get("above_floor") else ""),
                      _f(d.get("pct_of_floor_itl")), _f(ttft.get("p50"), 2),
                      f"{_f(itl.get('p50'), 2)}/{_f(itl.get('p99'), 2)}",
                      _f(d.get("non_decode_ms_per_call")) + (f" ({d['calls']} calls)" if (d.get("calls") or 1) > 1 else "")]
        div = r.get("greedy_first_divergence")
        cmp_n = r.get("greedy_compared_tokens")
        greedy = "-" if not cmp_n else ("same" if div is None else str(div)) + f" (of {cmp_n})"
        if r.get("logprob_compared_tokens"):
            greedy += f"; max abs logprob diff {r['logprob_max_abs_diff']:.3g} over {r['logprob_compared_tokens']}"
        fc = r.get("first_choice_difference")
        if fc:
            pick = lambda c: f"{c[0]} @ {_f(c[1], 2)}"  # noqa: E731
            greedy += f"; at token {fc['index']}: stock {pick(fc['stock'])}, fastpath {pick(fc['fastpath'])}"
        meas = []
        for mo in modes:
            de = (r.get(mo) or {}).get("distinct_experts") or {}
            if "mean" in de:
                meas.append(f"{mo} {_f(de['mean'])} ({_f(de.get('min'))}-{_f(de.get('max'))})")
        cells += [_f(r.get("speedup"), 2) + ("x" if r.get("speedup") else ""), _f(r.get("floor_tok_s")),
                  _f(r.get("expected_distinct_experts")), "; ".join(meas) or "-", greedy]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "tok/s: generated tokens / wall time of the timed generate calls (B prompts per call, prefill "
              "included). % floor: of the decode-step bytes floor (all layers + lm_head at 4.27 TB/s, "
              "uniform-routing expected experts). % floor (ITL): the floor step over the ITL p50, the decode step "
              "alone (no prefill, no batch turnaround). TTFT/ITL: streamed pass (wall clock per token) when present, "
              "else engine meta_info. non-decode ms/call: wall per timed call minus (tokens per request - 1) x ITL "
              "mean: prefill, first token and turnaround.", f"Distinct experts per layer: {rep['distinct_experts_per_layer']}."]
    for mo, info in rep["modes"].items():
        if info.get("dropped_engine_args"):
            lines.append(f"- {mo}: engine args not in this SGLang's ServerArgs, dropped: {info['dropped_engine_args']}")
        if info.get("error"):
            lines.append(f"- {mo}: worker error: {info['error']}")
    lines += render_paths(rep)
    lines += render_profiles(rep)
    lines += render_host_timing(rep)
    return "\n".join(lines) + "\n"


def render_paths(rep: dict) -> list[str]:
    """The routing lines of each mode's worker log (record_paths): which route / bucket path each seam took."""
    out: list[str] = []
    for mo, info in rep.get("modes", {}).items():
        got = info.get("paths_logged") or []
        if got:
            out += ["", f"Paths taken, {mo} (the worker log's routing lines, first occurrence each):", ""]
            out += [f"- {x.removeprefix('glm5_fastpath: ')}" for x in got]
    return out


def render_host_timing(rep: dict) -> list[str]:
    """--host-timing: per mode, the scheduler loop per decode iteration in the timed calls of each batch size."""
    out: list[str] = []
    for mo, info in rep.get("modes", {}).items():
        ht = info.get("host_timing")
        if not isinstance(ht, dict):
            continue
        summ = {int(k): v["timed"] for k, v in ht.items() if k.isdigit() and isinstance(v, dict) and "timed" in v}
        out += [""] + host_timing.render(summ, f"Host loop, {mo}, timed calls ({ht.get('records', 0)} decode "
                                               "iterations recorded)")
    if out:
        out += ["", "Loop period: from one get_next_batch_to_run to the next (the decode step as the host sees it). "
                "GPU wait: inside torch.cuda.Event.synchronize (result processing waiting for the previous step). "
                "Host busy = period - GPU wait; a share near 100 % means the host paces the step, not the GPU."]
    return out


def write_plot(rep: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - optional
        return False
    rows = rep["rows"]
    xs = [r["batch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mo in rep["modes"]:
        ys = [(r.get(mo) or {}).get("output_tok_s") for r in rows]
        ax.plot(xs, [y if y else float("nan") for y in ys], marker="o", label=mo)
    if any(r.get("floor_tok_s") for r in rows):
        ax.plot(xs, [r.get("floor_tok_s") or float("nan") for r in rows], ls="--", color="grey", label="bytes floor")
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tok/s")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title("GLM-5 offline decode, " + str(rep.get("meta", {}).get("gpu", "")))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(rep: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "offline.json", out / "offline.md"]
    paths[0].write_text(json.dumps(rep, indent=2, sort_keys=True, default=str) + "\n")
    paths[1].write_text(render_markdown(rep))
    if write_plot(rep, out / "offline.png"):
        paths.append(out / "offline.png")
    return paths


def load_mode_results(out: Path, key: str) -> tuple[dict[str, dict], list[str]]:
    res, skipped = {}, []
    for mode in MODES:
        p = out / f"mode-{mode}.json"
        if not p.is_file():
            continue
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError:
            skipped.append(f"{p.name} (unreadable)")
            continue
        if d.get("run_key") != key:
            skipped.append(f"{p.name} (other run settings)")
            continue
        res[mode] = d
    return res, skipped


# ---- profiles (parent; pure Python) ----------------------------------------------------------------------

PROFILE_TOP_IN_REPORT = 10


def compact_breakdown(res: dict, top: int = PROFILE_TOP_IN_REPORT) -> dict:
    """What the offline report keeps of a trace_breakdown result (the full one is breakdown.json)."""
    return {"source": res.get("source"), "split": res.get("split"), "summary": res.get("summary"),
            "top_kernels": (res.get("top_kernels") or [])[:top], "top_exposed": (res.get("top_exposed") or [])[:top],
            "largest_gaps": (res.get("largest_gaps") or [])[:5], "warnings": res.get("warnings") or []}


def attach_profiles(results: dict[str, dict], out: Path) -> list[str]:
    """Analyze the trace of every profiled (mode, batch) the workers recorded, write breakdown.json / .md
    beside it and put the compact breakdown into the batch result (key profile.breakdown). Returns log lines."""
    from .trace_breakdown import analyze_file, find_traces, summary_lines, write_outputs

    lines = []
    for mode, r in results.items():
        for b, br in (r.get("batches") or {}).items():
            p = br.get("profile")
            if not isinstance(p, dict) or not p.get("dir"):
                continue
            d = Path(p["dir"])
            if not d.is_dir() and (out / d.name).is_dir():  # results moved with their folder
                d = out / d.name
            try:
                traces = find_traces(d) if d.is_dir() else []
                if not traces and isinstance(p.get("breakdown"), dict):
                    continue  # analysed by an earlier merge (mode-*.json keeps it); the trace stayed behind
                if not traces:
                    p["breakdown_error"] = p.get("error") or f"no trace in {d}"
                    continue
                if len(traces) > 1:
                    p["traces_ignored"] = [t.name for t in traces[1:]]
                res = analyze_file(traces[0])
                write_outputs([res], d)
                p["breakdown"] = compact_breakdown(res)
                lines.append(f"[{mode} b{b}] profile: " + " | ".join(summary_lines(res)) + f" ({d}/breakdown.md)")
            except Exception as e:  # noqa: BLE001 - a bad trace must not lose the timed report
                p["breakdown_error"] = f"{type(e).__name__}: {e}"
    return lines


def render_profiles(rep: dict) -> list[str]:
    """The offline report's breakdown section: one row per profiled (mode, batch), then the top kernels."""
    from .trace_breakdown import CATEGORIES

    items = []
    for r in rep["rows"]:
        for mo in rep["modes"]:
            p = (r.get(mo) or {}).get("profile")
            if p:
                items.append((mo, r["batch"], p, (r.get(mo) or {}).get("itl_ms") or {}))
    if not items:
        return []

    def ms(x):
        return "-" if x is None else f"{x / 1e3:.3f}"

    def p50(d):
        return (d or {}).get("p50")

    def cat_max(p, c):
        d = (((p.get("breakdown") or {}).get("summary") or {}).get("category_us") or {}).get(c)
        return d["max"] if d else 0.0

    used = [c for c in CATEGORIES if any(cat_max(p, c) > 0 for _, _, p, _ in items)]
    head = ["mode", "batch", "steps", "step ms p50", "ITL p50 ms (stream)", "GPU busy ms", "busy %", "GPU idle ms",
            "idle between steps ms"] + [f"{c} ms" for c in used] + ["host launch interval ms",
                                                                     "GPU drained before next launch ms"]
    lines = ["", "## Decode-step breakdown (SGLang's torch profiler, complete decode steps, p50 per step)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tops = []
    for mo, b, p, itl in items:
        s = (p.get("breakdown") or {}).get("summary")
        if not s:
            why = p.get("breakdown_error") or p.get("error") or "; ".join((p.get("breakdown") or {}).get("warnings") or [])
            lines.append(f"| {mo} | {b} | - | no breakdown: {str(why)[:100]} |" + " |" * (len(head) - 4))
            continue
        h = s.get("host") or {}
        cells = [mo, str(b), str(s["steps"]), ms(p50(s["window_us"])), _f(itl.get("p50"), 3), ms(p50(s["busy_us"])),
                 _f(100 * s["busy_fraction"] if s.get("busy_fraction") is not None else None),
                 ms(p50(s["idle_us"])), ms(p50(s["idle_between_steps_us"]))]
        cells += [ms(p50(s["category_us"].get(c))) for c in used]
        cells += [ms(p50(h.get("launch_interval_us"))), ms(p50(h.get("gpu_drained_before_next_launch_us")))]
        lines.append("| " + " | ".join(cells) + " |")
        tk = p["breakdown"].get("top_kernels") or []
        if tk:
            tops.append(f"- {mo} b{b}: " + "; ".join(
                f"`{k['name'][:70]}` ({k['category']}) {k['us_per_step']:.1f} us/step" for k in tk[:5]))
        te = p["breakdown"].get("top_exposed") or []
        if te:
            tops.append(f"- {mo} b{b}, by exposed time: " + "; ".join(
                f"`{k['name'][:70]}` ({k['category']}) {k['exposed_us_per_step']:.1f} us/step" for k in te[:8]))
    lines += ["", "step = GPU step period (first kernel of one decode step to the next); busy = union of GPU "
              "activity; category columns = summed kernel time per step; host launch interval = CPU time between "
              "the first launch calls of consecutive steps. Full tables (every step, top 25 kernels, largest idle "
              "gaps): profile-<mode>-b<B>/breakdown.md; one step kernel by kernel, and per decoder layer: "
              "profile-<mode>-b<B>/breakdown_timeline.md. Profiler overhead: compare step ms with the unprofiled "
              "ITL p50. Exposed time: busy time charged to the running kernel that ends first (a PDL consumer's "
              "wait stays with its producer; hidden overlap costs nothing), so it sums to busy.", "",
              "Top kernels per step:", ""] + tops
    return lines


# ---- parent ------------------------------------------------------------------------------------------

def run_bench(o: OfflineOptions) -> int:
    ver = installed_sglang_version()
    steps = plan(o, ver)
    if o.dry_run:
        print(render_plan(steps, ver))
        return 0
    cfg = read_model_config(o.model)
    out = Path(o.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = max(o.prompts_per_batch(b) for b in o.batch_sizes)
    if not o.report_only:
        (out / "prompts.json").write_text(json.dumps(make_prompts(n, o.input_len, cfg["vocab_size"], o.seed)))
    rc = 0
    for s in ([] if o.report_only else steps):
        Path(s["config_path"]).write_text(json.dumps(s["config"], indent=2))
        env = mode_env(s["mode"], s["config"]["seam"], config=o.fastpath_config, realistic_dummy=o.realistic_dummy)
        log = out / f"worker-{s['mode']}.log"
        print(f"[{s['mode']}] {' '.join(s['command'])}  (log: {log})", flush=True)
        t0 = time.perf_counter()
        with open(log, "w") as lf:
            try:
                p = subprocess.run(s["command"], env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=o.timeout_s)
                code = p.returncode
            except subprocess.TimeoutExpired:
                code = 124
        print(f"[{s['mode']}] exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        record_paths(Path(s["config"]["result_file"]), log)
        if code != 0:
            rc = 1
            rp = Path(s["config"]["result_file"])
            if not rp.is_file():  # worker died before writing: record why
                tail = log.read_text(errors="replace")[-2000:]
                rp.write_text(json.dumps({"mode": s["mode"], "run_key": s["config"]["run_key"],
                                          "error": f"worker exit {code}; log tail: {tail}", "batches": {}}))
    results, skipped = load_mode_results(out, run_key(o))
    for sk in skipped:
        print(f"ignoring {sk}")
    for line in attach_profiles(results, out):
        print(line)
    for mode, r in results.items():  # keep each breakdown with its mode result: later merges need no trace
        if any(isinstance((br or {}).get("profile"), dict) and "breakdown" in br["profile"]
               for br in (r.get("batches") or {}).values()):
            (out / f"mode-{mode}.json").write_text(json.dumps(r, indent=1))
    from .meta import git_commit, utc_now

    first = next(iter(results.values()), {})
    meta = {"gpu": first.get("gpu"), "date": utc_now(), "commit": git_commit(),
            "sglang_version": first.get("sglang_version") or ver, "model": os.path.abspath(o.model),
            "load_format": o.load_format, "randomize_routers": o.randomize_routers,
            "realistic_dummy": o.realistic_dummy, "input_len": o.input_len,
            "output_len": o.output_len, "seam": first.get("seam"), "batch_sizes": sorted(o.batch_sizes),
            "num_layers": cfg.get("num_hidden_layers"), "moe_layers": moe_layers(cfg)}
    try:
        floors = floor_per_batch(cfg, sorted(o.batch_sizes), o.input_len + o.output_len // 2)
    except Exception as e:  # noqa: BLE001 - a config our parser rejects: report without the floor
        print(f"no bytes floor: {e}")
        floors = None
    rep = build_report(results, floors=floors, meta=meta)
    for p in write_outputs(rep, out):
        print(f"wrote {p}")
    print(render_markdown(rep))
    return rc


def paths_from_log(text: str) -> list[str]:
    """The plugin's routing decisions as logged by the scheduler ('glm5_fastpath: bucket 16 -> cmp (prefix)',
    'MoE: layers 1-7 -> MegaMoE ...', fallbacks with their reason), each distinct line once, in order."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        i = line.find("glm5_fastpath: ")
        if i < 0:
            continue
        msg = line[i:].strip()
        if any(k in msg for k in (" -> ", "stay on SGLang", "selection table", "installed on", "not routing")):
            seen.setdefault(msg, None)
    return list(seen)


def record_paths(result_file: Path, log: Path) -> None:
    """Add the worker log's routing lines to its mode-*.json (which bucket paths were taken)."""
    try:
        res = json.loads(result_file.read_text())
        res["paths_logged"] = paths_from_log(log.read_text(errors="replace"))
        result_file.write_text(json.dumps(res, indent=2, default=str))
    except (OSError, ValueError):
        pass


# ---- worker (runs in its own process; imports sglang) ------------------------------------------------------

def _filter_engine_kwargs(kw: dict, user_keys: Sequence[str]) -> tuple[dict, list[str]]:
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    names = {f.name for f in dataclasses.fields(ServerArgs)}
    dropped = [k for k in kw if k not in names and k not in user_keys]
    unknown_user = [k for k in user_keys if k not in names]
    if unknown_user:
        raise ValueError(f"--engine-arg: not ServerArgs fields in this SGLang: {unknown_user}")
    return {k: v for k, v in kw.items() if k not in dropped}, dropped


def _meta_latency(outs: list[dict]) -> tuple[list[float], list[float]]:
    ttft, itl = [], []
    for o in outs:
        mi = o.get("meta_info", {}) or {}
        f, e, n = mi.get("first_token_latency"), mi.get("e2e_latency"), mi.get("completion_tokens")
        if isinstance(f, (int, float)):
            ttft.append(1e3 * f)
            if isinstance(e, (int, float)) and isinstance(n, int) and n > 1:
                itl.append(1e3 * (e - f) / (n - 1))
    return ttft, itl


def _logprob_pass(engine, prompt: list, sp: dict) -> dict[str, list]:
    """One untimed greedy request with return_logprob: the chosen ids and their logprobs for the first
    FIRST_TOKENS_KEPT tokens (SGLang's meta_info output_token_logprobs: (logprob, token_id, text) entries)."""
    o = engine.generate(input_ids=[prompt], sampling_params={**sp, "max_new_tokens": FIRST_TOKENS_KEPT},
                        return_logprob=True)
    o = o[0] if isinstance(o, list) else o
    entries = (o.get("meta_info") or {}).get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries]
    lps = [None if e[0] is None else float(e[0]) for e in entries]
    return {"ids": ids, "logprobs": lps}


def _stream_pass(engine, prompts, sp) -> tuple[list[float], list[float]]:
    import asyncio

    async def one(ids):
        t0 = time.perf_counter()
        last, prev_n, ttft, gaps = t0, 0, None, []
        gen = await engine.async_generate(input_ids=ids, sampling_params=sp, stream=True)
        async for chunk in gen:
            now = time.perf_counter()
            n = int((chunk.get("meta_info") or {}).get("completion_tokens", prev_n + 1))
            new = max(n - prev_n, 0)
            if new:
                if ttft is None:
                    ttft = now - t0
                    new -= 1
                    if new:
                        gaps += [0.0] * new
                else:
                    gaps += [(now - last) / new] * new
                last, prev_n = now, n
        return ttft, gaps

    async def all_():
        return await asyncio.gather(*(one(p) for p in prompts))

    loop = getattr(engine, "loop", None) or asyncio.new_event_loop()
    res = loop.run_until_complete(all_())
    ttft = [1e3 * t for t, _ in res if t is not None]
    itl = [1e3 * g for _, gs in res for g in gs]
    return ttft, itl


def _start_profile_kwargs(start_profile, want: dict) -> dict:
    """The subset of `want` that this SGLang's TokenizerManager.start_profile accepts (0.5.14:
    srt/managers/tokenizer_control_mixin.py:318; later releases may drop or add keywords)."""
    import inspect

    try:
        params = inspect.signature(start_profile).parameters
    except (TypeError, ValueError):
        return dict(want)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(want)
    return {k: v for k, v in want.items() if k in params}


def _profile_pass(engine, prompts, sp, pdir: Path, prof: dict, prefix: str) -> dict:
    """B streamed requests; once each has its first token (prefill over, all B decoding), SGLang's profiler
    for `sglang_num_steps` forward passes, started through the Engine's tokenizer manager in the same event
    loop (Engine.start_profile would block that loop: it is `loop.run_until_complete(...)`, engine.py:964)."""
    import asyncio
    import shutil

    from .trace_breakdown import find_traces

    if pdir.exists():
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    tm = engine.tokenizer_manager
    want = {"output_dir": str(pdir), "num_steps": prof["sglang_num_steps"], "activities": list(prof["activities"]),
            "with_stack": False, "record_shapes": False, "profile_by_stage": False, "merge_profiles": False,
            "profile_prefix": prefix}
    kw = _start_profile_kwargs(tm.start_profile, want)
    info: dict[str, Any] = {"dir": str(pdir), "steps_requested": prof["steps"],
                            "sglang_num_steps": prof["sglang_num_steps"], "activities": list(prof["activities"]),
                            "start_profile_kwargs": kw,
                            "start_profile_kwargs_dropped": sorted(set(want) - set(kw))}

    async def run():
        first = [asyncio.Event() for _ in prompts]

        async def one(i, ids):
            n = 0
            gen = await engine.async_generate(input_ids=ids, sampling_params=sp, stream=True)
            async for chunk in gen:
                first[i].set()
                n = int((chunk.get("meta_info") or {}).get("completion_tokens", n + 1))
            return n

        tasks = [asyncio.ensure_future(one(i, p)) for i, p in enumerate(prompts)]
        waiter = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in first)))
        deadline = time.perf_counter() + PROFILE_FIRST_TOKEN_TIMEOUT_S
        try:
            while not waiter.done():
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"not every request had its first token after {PROFILE_FIRST_TOKEN_TIMEOUT_S} s")
                await asyncio.wait([waiter, *tasks], timeout=left, return_when=asyncio.FIRST_COMPLETED)
                for t in tasks:
                    if t.done() and not waiter.done():
                        t.result()  # raises the request's error
                        raise RuntimeError("a request finished before every request had started decoding")
            t0 = time.perf_counter()
            await tm.start_profile(**kw)
            info["start_profile_s"] = time.perf_counter() - t0
            info["completion_tokens"] = await asyncio.gather(*tasks)
        finally:
            waiter.cancel()
            for t in tasks:
                t.cancel()
        if not find_traces(pdir):  # the requests ended before N + 2 forward passes: stop it ourselves
            try:
                await tm.stop_profile()
                info["stopped_by"] = "stop_profile"
            except Exception as e:  # noqa: BLE001 - "not in progress" when it had stopped by itself
                info["stop_profile"] = f"{type(e).__name__}: {e}"
        else:
            info["stopped_by"] = "num_steps"

    loop = getattr(engine, "loop", None) or asyncio.new_event_loop()
    loop.run_until_complete(run())
    traces = find_traces(pdir)
    info["traces"] = [t.name for t in traces]
    info["trace_bytes"] = sum(t.stat().st_size for t in traces)
    if not traces:
        info["error"] = f"no trace written into {pdir}"
    return info


def decode_step_distinct_experts(per_request: list, num_layers: int, topk: int, moe_layers: Sequence[int],
                                 input_len: int) -> dict[str, Any]:
    """Distinct experts per MoE layer per decode step, from SGLang's routed experts of B requests decoded in
    lockstep: request i's array is [tokens, num_layers, topk] int32 (prompt tokens first); decode step s is row
    input_len + s of every request; the union over the B requests at one step is what that step's MoE reads."""
    import numpy as np

    arrs = []
    for a in per_request:
        a = np.asarray(a, dtype=np.int64).reshape(-1, num_layers, topk)
        arrs.append(a[input_len:])
    steps = min(len(a) for a in arrs) if arrs else 0
    if not steps:
        return {"steps": 0}
    per_layer: dict[str, float] = {}
    for layer in moe_layers:
        counts = [len(set(np.concatenate([a[s, layer] for a in arrs]).tolist()) - {-1}) for s in range(steps)]
        per_layer[str(layer)] = float(np.mean(counts))
    vals = list(per_layer.values())
    return {"steps": steps, "requests": len(arrs), "per_layer": per_layer,
            "mean": float(np.mean(vals)) if vals else None, "min": min(vals) if vals else None,
            "max": max(vals) if vals else None}


def _routing_pass(engine, prompts: list, c: dict) -> dict[str, Any]:
    import base64

    import numpy as np

    sp = {"temperature": 0.0, "max_new_tokens": ROUTING_TOKENS, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=sp, return_routed_experts=True)
    outs = outs if isinstance(outs, list) else [outs]
    per = []
    for o in outs:
        v = (o.get("meta_info") or {}).get("routed_experts")
        if v is None:
            return {"error": "no routed_experts in meta_info (enable_return_routed_experts not in force?)"}
        per.append(np.frombuffer(base64.b64decode(v), dtype=np.int32) if isinstance(v, str) else np.asarray(v))
    return decode_step_distinct_experts(per, c["num_layers"], c["topk"], c["moe_layers"], c["input_len"])


def _randomize_routers(engine, names: list, seed: int) -> int:
    import torch

    g = torch.Generator().manual_seed(seed + 1234)
    tensors = []
    for name, shape in names:
        if name.endswith("e_score_correction_bias"):
            tensors.append((name, torch.zeros(tuple(shape), dtype=torch.float32)))
        else:
            tensors.append((name, (torch.randn(tuple(shape), generator=g) * ROUTER_STD).to(torch.bfloat16)))
    engine.update_weights_from_tensor(named_tensors=tensors, flush_cache=True)
    return len(tensors) // 2


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def worker_main(config_path: str) -> int:
    c = json.loads(Path(config_path).read_text())
    res: dict[str, Any] = {"mode": c["mode"], "run_key": c["run_key"], "seam": c["seam"],
                           "sglang_version": installed_sglang_version(), "gpu": _gpu_name(),
                           "env": {k: os.environ.get(k) for k in (ENV_SWITCH, ENV_EXTERNAL, ENV_CONFIG, *DEFAULT_ENV)},
                           "batches": {}}
    rpath = Path(c["result_file"])
    prof = c.get("profile")
    if prof and os.environ.pop("SGLANG_PROFILE_V2", None) is not None:
        # the v2 profile manager supports only profile_by_stage (srt/utils/profile_utils.py:92, :118)
        res["profile_note"] = "SGLANG_PROFILE_V2 unset for this worker (the v2 manager has no num_steps start)"
    if os.environ.get(ENV_CONFIG):
        try:
            res["selection_table"] = json.loads(Path(os.environ[ENV_CONFIG]).read_text())
        except (OSError, ValueError) as e:
            res["selection_table"] = f"unreadable: {e}"

    def save():
        rpath.write_text(json.dumps(res, indent=2, default=str))

    engine = None
    try:
        try:  # SGLang >= 0.5.23: entry-point plugins (ours registers hooks; GLM5_FASTPATH is the switch)
            from sglang.srt.plugins import load_plugins

            load_plugins()
            res["plugins_loaded"] = True
        except ImportError:
            res["plugins_loaded"] = False
        from sglang.srt.entrypoints.engine import Engine

        ht_file = c.get("host_timing_file")
        if ht_file:  # read by the scheduler process SGLang spawns (module top: host_timing.install_from_env)
            Path(ht_file).unlink(missing_ok=True)
            os.environ[host_timing.ENV] = ht_file
        kw, dropped = _filter_engine_kwargs(c["engine_kwargs"], c["user_engine_keys"])
        res["engine_args"], res["dropped_engine_args"] = kw, dropped
        t0 = time.perf_counter()
        engine = Engine(**kw)
        res["startup_s"] = time.perf_counter() - t0
        if c["randomize_routers"]:
            res["routers_randomized_layers"] = _randomize_routers(engine, c["router_tensors"], c["seed"])
        save()
        prompts = json.loads(Path(c["prompts_file"]).read_text())
        for b in c["batch_sizes"]:
            br: dict[str, Any] = {"batch": b}
            res["batches"][str(b)] = br
            try:
                n = c["prompts_per_batch"][str(b)]
                sp = {"temperature": 0.0, "max_new_tokens": c["output_len"], "ignore_eos": True}
                engine.generate(input_ids=prompts[:b], sampling_params={**sp, "max_new_tokens": WARMUP_TOKENS})
                outs, wall = [], 0.0
                br["timed_window"] = [time.time(), None]
                for w in range(n // b):
                    t = time.perf_counter()
                    o = engine.generate(input_ids=prompts[w * b:(w + 1) * b], sampling_params=sp)
                    wall += time.perf_counter() - t
                    outs += o if isinstance(o, list) else [o]
                br["timed_window"][1] = time.time()
                ntok = sum(int((o.get("meta_info") or {}).get("completion_tokens", len(o.get("output_ids", []))))
                           for o in outs)
                br.update(output_tokens=ntok, wall_s=wall, calls=n // b, output_tok_s=ntok / wall if wall else None,
                          first_tokens=list(outs[0].get("output_ids", []))[:FIRST_TOKENS_KEPT] if outs else None,
                          meta_keys=sorted((outs[0].get("meta_info") or {}).keys()) if outs else [])
                ttft, itl = _meta_latency(outs)
                br["latency_source"] = "meta_info" if ttft else "none"
                try:
                    br["first_logprobs"] = _logprob_pass(engine, prompts[0], sp)
                except Exception as e:  # noqa: BLE001 - recorded; the throughput numbers stand
                    br["first_logprobs_error"] = f"{type(e).__name__}: {e}"
                if c["stream_pass"]:
                    # its B requests arrive concurrently, so its prefill batches can take shapes (prompts per extend
                    # batch) the warm-up generate above never ran; kernels JIT-compiled on first use (DeepGEMM with
                    # SGLANG_JIT_DEEPGEMM_PRECOMPILE=0) then land in its TTFT: multi-second TTFT p50 outliers at
                    # single batch sizes in both modes, sessions 25-30. A short streamed pass of the same shape first
                    # (added in session 30, not yet run on the GPU: whether it removes them is unverified).
                    _stream_pass(engine, prompts[:b], {**sp, "max_new_tokens": WARMUP_TOKENS})
                    br["stream_warmup_tokens"] = WARMUP_TOKENS
                    t_stream = time.time()
                    sttft, sitl = _stream_pass(engine, prompts[:b], sp)
                    br["stream_window"] = [t_stream, time.time()]
                    if sttft:
                        ttft, itl, br["latency_source"] = sttft, sitl, "stream wall-clock"
                br["ttft_ms"], br["itl_ms"] = percentiles(ttft), percentiles(itl)
                if c.get("routing_stats"):
                    try:
                        br["distinct_experts"] = _routing_pass(engine, prompts[:b], c)
                    except Exception as e:  # noqa: BLE001 - recorded; the throughput numbers stand
                        br["distinct_experts"] = {"error": f"{type(e).__name__}: {e}"}
            except Exception as e:  # noqa: BLE001 - record, go on with the next batch size
                br["error"] = f"{type(e).__name__}: {e}"
            save()
            if prof and b in prof["batches"] and "error" not in br:
                pdir = Path(prof["dir_pattern"].format(mode=c["mode"], batch=b))
                t = time.perf_counter()
                try:
                    br["profile"] = _profile_pass(engine, prompts[:b], sp, pdir, prof, f"{c['mode']}-b{b}")
                except Exception as e:  # noqa: BLE001 - the timed numbers of this batch stand without it
                    br["profile"] = {"dir": str(pdir), "steps_requested": prof["steps"],
                                     "error": f"{type(e).__name__}: {e}"}
                br["profile"]["wall_s"] = time.perf_counter() - t
                save()
        if ht_file:
            res["host_timing"] = collect_host_timing(ht_file, res["batches"])
        return 0 if not any("error" in v for v in res["batches"].values()) else 1
    except Exception as e:  # noqa: BLE001
        import traceback

        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-4000:]
        return 1
    finally:
        save()
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001
                pass


def collect_host_timing(path: str, batches: dict[str, dict], settle_s: float = HOST_TIMING_SETTLE_S) -> dict:
    """Per batch size: host_timing.summarize of the scheduler's records inside that batch's timed calls and its
    streamed pass (by wall clock; the scheduler writes its lines in blocks, and an idle loop writes the rest within
    host_timing.FLUSH_S, hence the wait)."""
    time.sleep(settle_s)
    recs = host_timing.read(path)
    out: dict[str, Any] = {"file": path, "records": len(recs)}
    for key, br in batches.items():
        b, per = int(key), {}
        for name in ("timed_window", "stream_window"):
            w = br.get(name)
            if not w or w[0] is None or w[1] is None:
                continue
            sel = [r for r in recs if r["bs"] == b and w[0] <= float(r.get("t", -1.0)) <= w[1]]
            summ = host_timing.summarize(sel)
            if b in summ:
                per[name.split("_")[0]] = summ[b]
        if per:
            out[key] = per
    return out


# ---- synthetic model dir for --load-format dummy --------------------------------------------------------

def write_dummy_model(out_dir: str, *, layers: int = 8, dense_layers: int = 1, preset: str = "glm5") -> Path:
    """config.json + tokenizer (no weights) of a GLM-5-shaped model at full per-layer dims with
    `dense_layers` dense layers then MoE layers (issue #9's 1 dense + 7 MoE)."""
    from ..checkpoint import checkpoint_config, write_model_files

    if not 0 <= dense_layers < layers:
        raise ValueError(f"dense_layers must be in [0, layers), got {dense_layers} of {layers}")
    cfg = checkpoint_config(preset, layers=layers).replace(first_k_dense_replace=dense_layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_model_files(out, cfg)
    return out


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.offline")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="(internal) one mode's Engine run")
    w.add_argument("config")
    d = sub.add_parser("make-dummy-model", help="config.json + tokenizer for --load-format dummy")
    d.add_argument("dir")
    d.add_argument("--layers", type=int, default=8)
    d.add_argument("--dense-layers", type=int, default=1)
    d.add_argument("--preset", choices=("glm5", "glm5.2"), default="glm5")
    a = p.parse_args(argv)
    if a.cmd == "worker":
        return worker_main(a.config)
    print(write_dummy_model(a.dir, layers=a.layers, dense_layers=a.dense_layers, preset=a.preset))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
