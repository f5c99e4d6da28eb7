"""`bench offline` on CPU: validation, --dry-run, prompts, router names, report (no sglang, no GPU)."""
import json
import sys

import pytest

from glm5_fastpath.bench import offline as off
from glm5_fastpath.cli import build_parser, main


def _model(tmp_path, **over):
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 4, "first_k_dense_replace": 1,
           "moe_layer_freq": 1, "n_routed_experts": 8, "hidden_size": 32, "vocab_size": 1000}
    cfg.update(over)
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _opts(tmp_path, *extra):
    a = build_parser().parse_args(["bench", "offline", "--model", str(_model(tmp_path)), "--load-format", "dummy",
                                   "--out", str(tmp_path / "out"), *extra])
    return off.options_from_args(a)


def test_cli_defaults_and_engine_args(tmp_path):
    o = _opts(tmp_path, "--engine-arg", "mem_fraction_static=0.8", "--engine-arg", "enable-foo=true",
              "--engine-arg", "cuda_graph_bs=[1,2]")
    assert o.batch_sizes == [1, 16, 32] and o.input_len == 128 and o.output_len == 128 and o.modes == ["stock", "fastpath"]
    assert o.engine_args == {"mem_fraction_static": 0.8, "enable_foo": True, "cuda_graph_bs": [1, 2]}
    kw = off.engine_kwargs(o)
    assert kw["cuda_graph_bs"] == [1, 2]  # user override wins
    assert kw["attention_backend"] == "dsa" and kw["dsa_decode_backend"] == "flashmla_sparse"
    assert kw["disable_prefill_cuda_graph"] is True and kw["skip_tokenizer_init"] is True
    assert kw["cuda_graph_max_bs_decode"] == 32 and kw["kv_cache_dtype"] == "bfloat16"


@pytest.mark.parametrize("extra, msg", [
    (["--batch-sizes", "0,4"], "positive"),
    (["--batch-sizes", "4,4"], "duplicates"),
    (["--num-prompts", "24", "--batch-sizes", "1,16"], "not a multiple"),
    (["--calls", "0"], "--calls"),
    (["--calls", "2", "--num-prompts", "32"], "give one"),
    (["--output-len", "1"], "output-len"),
    (["--engine-arg", "model_path=/x"], "--model"),
])
def test_validation_errors(tmp_path, extra, msg):
    with pytest.raises(ValueError, match=msg):
        off.validate(_opts(tmp_path, *extra))


def test_validation_model_dir(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="config.json"):
        off.validate(off.OfflineOptions(model=str(tmp_path / "nope")))
    o = _opts(tmp_path)
    o.load_format = "auto"
    with pytest.raises(ValueError, match="safetensors"):
        off.validate(o)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    assert main(["bench", "offline", "--model", str(bad), "--dry-run", "--load-format", "dummy"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_bad_cli_values_exit():
    for argv in (["--modes", "stock,turbo"], ["--batch-sizes", "a,b"], ["--load-format", "pt"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "offline", "--model", "m", *argv])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        off.parse_engine_args(["novalue"])


def test_dry_run_prints_commands_and_env_without_sglang(tmp_path, capsys):
    m = _model(tmp_path)
    before = set(sys.modules)
    rc = main(["bench", "offline", "--model", str(m), "--load-format", "dummy", "--randomize-routers", "--dry-run",
               "--batch-sizes", "1,8", "--out", str(tmp_path / "o"), "--seam", "external-model-package"])
    assert rc == 0
    out = capsys.readouterr().out
    assert not any(k == "sglang" or k.startswith("sglang.") or k == "torch.cuda" for k in set(sys.modules) - before)
    stock, fast = out.split("[stock]")[1].split("[fastpath]")
    assert "-u GLM5_FASTPATH" in stock and "-u SGLANG_EXTERNAL_MODEL_PACKAGE" in stock
    assert "GLM5_FASTPATH=1" in fast and f"SGLANG_EXTERNAL_MODEL_PACKAGE={off.EXTERNAL_PACKAGE}" in fast
    for part in (stock, fast):
        assert "-m glm5_fastpath.bench.offline worker" in part
        assert "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0" in part
        assert '"cuda_graph_bs": [1, 8]' in part and '"load_format": "dummy"' in part
    assert not (tmp_path / "o").exists()  # dry run writes nothing


def test_plan_env_per_mode_and_seam(tmp_path):
    o = _opts(tmp_path)
    steps = off.plan(o, sglang_version="0.5.23")
    env = {s["mode"]: s["env"] for s in steps}
    assert env["fastpath"]["GLM5_FASTPATH"] == "1" and env["fastpath"]["SGLANG_EXTERNAL_MODEL_PACKAGE"] is None
    assert env["stock"]["GLM5_FASTPATH"] is None
    assert off.resolve_seam("auto", "0.5.14") == "external-model-package"
    assert off.resolve_seam("auto", None) == "external-model-package"
    assert off.resolve_seam("auto", "0.5.23.post1") == "plugin"
    full = off.mode_env("stock", "plugin", base={"GLM5_FASTPATH": "1", "PATH": "/bin"})
    assert "GLM5_FASTPATH" not in full and full["PATH"] == "/bin"


def test_prompts_deterministic():
    a = off.make_prompts(4, 16, 1000, seed=3)
    assert a == off.make_prompts(4, 16, 1000, seed=3)
    assert a != off.make_prompts(4, 16, 1000, seed=4)
    assert len(a) == 4 and all(len(p) == 16 for p in a)
    assert all(10 <= t < 990 for p in a for t in p)
    assert off.make_prompts(2, 16, 1000, 3) == a[:2]  # fewer prompts = a prefix of the same stream


def test_router_tensor_names_moe_layers_only():
    cfg = {"num_hidden_layers": 5, "first_k_dense_replace": 2, "n_routed_experts": 256, "hidden_size": 6144}
    names = off.router_tensor_names(cfg)
    assert [n for n, _ in names] == [f"model.layers.{i}.mlp.gate.{t}" for i in (2, 3, 4)
                                     for t in ("weight", "e_score_correction_bias")]
    assert names[0][1] == (256, 6144) and names[1][1] == (256,)
    assert off.moe_layers({**cfg, "moe_layer_freq": 2}) == [2, 4]
    assert off.router_tensor_names({**cfg, "n_routed_experts": 0}) == []


def test_calls_set_the_timed_pass_per_batch_size(tmp_path):
    """--calls N: N generate calls of B prompts per batch size (each call still decodes at exactly batch B); the run
    key changes with N, and stays as before for N = 1 (results of earlier sessions still merge)."""
    one, four = _opts(tmp_path, "--batch-sizes", "1,8"), _opts(tmp_path, "--batch-sizes", "1,8", "--calls", "4")
    off.validate(four)
    assert [one.prompts_per_batch(b) for b in (1, 8)] == [1, 8]
    assert [four.prompts_per_batch(b) for b in (1, 8)] == [4, 32]
    assert off.run_key(one) != off.run_key(four)
    assert off.worker_config(four, "stock", "plugin", {})["prompts_per_batch"] == {"1": 4, "8": 32}


def test_run_key_stable_and_sensitive(tmp_path):
    o = _opts(tmp_path)
    k = off.run_key(o)
    assert k == off.run_key(_opts(tmp_path))
    o.output_len = 64
    assert off.run_key(o) != k


def _fake(mode, tps, toks):
    return {"mode": mode, "run_key": "k", "gpu": "NVIDIA H200", "seam": "external-model-package",
            "batches": {str(b): {"output_tok_s": t, "ttft_ms": {"p50": 20.0, "p90": 25.0, "p99": 30.0},
                                 "itl_ms": {"p50": 3.0, "p90": 3.5, "p99": 4.0}, "latency_source": "stream wall-clock",
                                 "first_tokens": toks} for b, t in tps.items()}}


def test_report_json_markdown_from_fake_results(tmp_path):
    res = {"stock": _fake("stock", {1: 277.0, 16: 1703.0}, [1, 2, 3, 4]),
           "fastpath": _fake("fastpath", {1: 554.0, 16: 2044.0}, [1, 2, 9, 4])}
    cfg = json.loads((_model(tmp_path)).joinpath("config.json").read_text())
    floors = {1: {"floor_tok_s": 700.0, "floor_step_us": 1428.0, "expected_distinct_experts_per_moe_layer": 8.0},
              16: {"floor_tok_s": 2200.0, "floor_step_us": 7272.0, "expected_distinct_experts_per_moe_layer": 102.0}}
    rep = off.build_report(res, floors=floors, meta={"gpu": "NVIDIA H200", "commit": "abc", "date": "d",
                                                     "sglang_version": "0.5.14", "moe_layers": off.moe_layers(cfg)})
    r1, r16 = rep["rows"]
    assert r1["batch"] == 1 and r1["speedup"] == pytest.approx(2.0)
    assert r16["speedup"] == pytest.approx(2044 / 1703)
    assert r1["stock"]["pct_of_floor"] == pytest.approx(100 * 277 / 700)
    assert r1["greedy_first_divergence"] == 2 and r1["greedy_compared_tokens"] == 4
    assert "not measured" in rep["distinct_experts_per_layer"]
    paths = off.write_outputs(rep, tmp_path / "o")
    j = json.loads((tmp_path / "o" / "offline.json").read_text())
    assert j["rows"][0]["speedup"] == pytest.approx(2.0) and j["meta"]["sglang_version"] == "0.5.14"
    md = (tmp_path / "o" / "offline.md").read_text()
    assert r1["stock"]["pct_of_floor_itl"] == pytest.approx(100 * (1e6 / 700) / 3000, rel=2e-3)  # floor step / ITL p50
    # the non-decode column is "-" without wall / token counts / ITL mean in the results
    assert "| 1 | 277.0 | 39.6 | 47.6 | 20.00 | 3.00/4.00 | - | 554.0 |" in md and "2.00x" in md and "2 (of 4)" in md
    assert paths[0].name == "offline.json"


def test_report_flags_a_run_faster_than_the_bytes_floor():
    """A mode decoding faster than the weights it must stream (the session-5 engine run whose MoE route
    dropped all rows but the first) is marked INVALID in JSON and markdown, not shown as a plain speedup."""
    res = {"stock": _fake("stock", {8: 1226.7}, [1, 2]), "fastpath": _fake("fastpath", {8: 3014.1}, [1, 2])}
    floors = {8: {"floor_tok_s": 1778.8, "floor_step_us": 4497.0, "expected_distinct_experts_per_moe_layer": 57.4}}
    rep = off.build_report(res, floors=floors)
    row = rep["rows"][0]
    assert row["fastpath"]["above_floor"] is True and row["stock"]["above_floor"] is False
    md = off.render_markdown(rep)
    assert "**INVALID: fastpath batch 8 decoded faster than the bytes floor**" in md
    assert "169.4 INVALID" in md and "69.0 INVALID" not in md
    ok = off.render_markdown(off.build_report({"stock": _fake("stock", {8: 1226.7}, [1])}, floors=floors))
    assert "INVALID" not in ok


def test_report_with_error_and_single_mode():
    res = {"stock": {"mode": "stock", "batches": {"8": {"error": "RuntimeError: boom"}}}}
    rep = off.build_report(res)
    assert rep["rows"][0]["speedup"] is None and "greedy_first_divergence" not in rep["rows"][0]
    assert "error: RuntimeError: boom" in off.render_markdown(rep)


def test_merge_mode_files_by_run_key(tmp_path):
    (tmp_path / "mode-stock.json").write_text(json.dumps({"run_key": "k", "batches": {}}))
    (tmp_path / "mode-fastpath.json").write_text(json.dumps({"run_key": "other", "batches": {}}))
    got, skipped = off.load_mode_results(tmp_path, "k")
    assert list(got) == ["stock"] and skipped == ["mode-fastpath.json (other run settings)"]


def test_percentiles_and_floor():
    p = off.percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert p["p50"] == 3.0 and p["mean"] == 3.0 and p["p99"] == pytest.approx(4.96)
    assert off.percentiles([]) is None
    from glm5_fastpath.config import Glm5Config

    cfg = Glm5Config.preset("glm5").replace(num_hidden_layers=8, first_k_dense_replace=1, num_nextn_predict_layers=0)
    fl = off.floor_per_batch(cfg.to_hf_dict(), [1, 16], 192)
    # issue 9: the stock engine's 277 tok/s at batch 1 was ~42 % of this floor (8-layer model, 1 dense + 7 MoE)
    assert 0.3 < 277 / fl[1]["floor_tok_s"] < 0.5
    assert fl[16]["expected_distinct_experts_per_moe_layer"] > fl[1]["expected_distinct_experts_per_moe_layer"] == 8


def test_write_dummy_model(tmp_path):
    d = off.write_dummy_model(str(tmp_path / "m"), layers=3, dense_layers=1)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["first_k_dense_replace"] == 1 and cfg["hidden_size"] == 6144
    assert off.moe_layers(cfg) == [1, 2]
    assert (d / "tokenizer.json").is_file() and not list(d.glob("*.safetensors"))
    with pytest.raises(ValueError):
        off.write_dummy_model(str(tmp_path / "m2"), layers=2, dense_layers=2)


def test_paths_from_log_keeps_routing_lines_once():
    from glm5_fastpath.bench.offline import paths_from_log

    log = "\n".join([
        "[2026-11-29 12:00:00 TP0] glm5_fastpath: selection table /t.json (largest bucket 64): 1:cmp/megamoe",
        "[2026-11-29 12:00:01 TP0] glm5_fastpath: MoE: layers 1-7 -> MegaMoE (256 routed experts + 1 shared, top-8, ...)",
        "[2026-11-29 12:00:02 TP0] glm5_fastpath: bucket 16 -> cmp (prefix)",
        "[2026-11-29 12:00:03 TP0] glm5_fastpath: bucket 16 -> cmp (prefix)",
        "[2026-11-29 12:00:03 TP0] Capture cuda graph bs [1, 16]",
        "[2026-11-29 12:00:04 TP0] glm5_fastpath: kernels ready in 3.0 s",
    ])
    got = paths_from_log(log)
    assert got == ["glm5_fastpath: selection table /t.json (largest bucket 64): 1:cmp/megamoe",
                   "glm5_fastpath: MoE: layers 1-7 -> MegaMoE (256 routed experts + 1 shared, top-8, ...)",
                   "glm5_fastpath: bucket 16 -> cmp (prefix)"]


def test_report_lists_the_paths_taken(tmp_path):
    """record_paths' routing lines (mode-*.json paths_logged) appear in offline.md per mode, prefix dropped; a mode
    without them adds nothing."""
    res = {"stock": _fake("stock", {1: 277.0}, [1, 2]), "fastpath": _fake("fastpath", {1: 456.5}, [1, 2])}
    res["fastpath"]["paths_logged"] = ["glm5_fastpath: bucket 1 -> cmp (prefix)",
                                       "glm5_fastpath: DSA decode metadata -> ours (one kernel) at batch size 1"]
    md = off.render_markdown(off.build_report(res))
    assert "Paths taken, fastpath (the worker log's routing lines, first occurrence each):" in md
    assert "- bucket 1 -> cmp (prefix)\n- DSA decode metadata -> ours (one kernel) at batch size 1" in md
    assert "Paths taken, stock" not in md
    del res["fastpath"]["paths_logged"]
    assert "Paths taken" not in off.render_markdown(off.build_report(res))


def test_fastpath_config_is_validated_and_reaches_only_the_fastpath_worker(tmp_path):
    import pytest

    from glm5_fastpath.bench import offline as off
    from glm5_fastpath.selection import SelectionError

    model = tmp_path / "m"
    off.write_dummy_model(str(model), layers=2, dense_layers=1)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "nope"}]}')
    o = off.OfflineOptions(model=str(model), load_format="dummy", fastpath_config=str(bad), out=str(tmp_path / "o"))
    with pytest.raises(SelectionError, match="moe"):
        off.plan(o, "0.5.14")
    good = tmp_path / "good.json"
    good.write_text('{"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "megamoe"}]}')
    o.fastpath_config = str(good)
    steps = {s["mode"]: s for s in off.plan(o, "0.5.14")}
    assert steps["fastpath"]["env"]["GLM5_FASTPATH_CONFIG"] == str(good)
    assert steps["stock"]["env"]["GLM5_FASTPATH_CONFIG"] is None


# ---- --profile-steps (issue #9: where the engine's decode step time goes) --------------------------------------

def test_profile_options_default_off_and_in_config(tmp_path):
    o = _opts(tmp_path)
    assert o.profile_steps == 0 and o.profile_batches is None and o.profiled_batches() == []
    assert all(s["config"]["profile"] is None for s in off.plan(o, "0.5.14"))
    o = _opts(tmp_path, "--batch-sizes", "1,8,16", "--profile-steps", "5")
    assert o.profiled_batches() == [1, 8, 16]  # default: every measured batch size
    prof = off.plan(o, "0.5.14")[0]["config"]["profile"]
    assert prof["steps"] == 5 and prof["sglang_num_steps"] == 5 + off.PROFILE_EXTRA_STEPS
    assert prof["activities"] == ["CPU", "GPU"] and prof["with_stack"] is False and prof["record_shapes"] is False
    assert prof["dir_pattern"].endswith("profile-{mode}-b{batch}")
    o = _opts(tmp_path, "--batch-sizes", "1,8,16", "--profile-steps", "3", "--profile-batches", "16,1",
              "--profile-activities", "gpu")
    prof = off.plan(o, "0.5.14")[0]["config"]["profile"]
    assert prof["batches"] == [1, 16] and prof["activities"] == ["GPU"]
    assert off.run_key(o) == off.run_key(_opts(tmp_path, "--batch-sizes", "1,8,16"))  # profiling: same run key


def test_dry_run_shows_profile(tmp_path, capsys):
    m = _model(tmp_path)
    rc = main(["bench", "offline", "--model", str(m), "--load-format", "dummy", "--dry-run", "--batch-sizes", "1,8",
               "--out", str(tmp_path / "o"), "--profile-steps", "5", "--profile-batches", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    for mode in ("stock", "fastpath"):
        assert (f"profile: 5 decode steps (SGLang num_steps=7) at batch 1, activities CPU,GPU, no stacks, no shapes "
                f"-> {tmp_path / 'o'}/profile-{mode}-b<B>/") in out
    assert '"profile": {"activities": ["CPU", "GPU"], "batches": [1]' in out
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, msg", [
    (["--batch-sizes", "1,8", "--profile-steps", "5", "--profile-batches", "1,16"], "not among the measured batch"),
    (["--profile-batches", "1"], "needs --profile-steps"),
    (["--profile-steps", "-1"], "--profile-steps must be in"),
    (["--profile-steps", str(off.PROFILE_MAX_STEPS + 1)], "traces stay small"),
    (["--profile-steps", "5", "--output-len", "20"], "too short to profile"),
])
def test_profile_validation_errors(tmp_path, extra, msg):
    with pytest.raises(ValueError, match=msg):
        off.validate(_opts(tmp_path, *extra))


def test_profile_validation_cli(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "offline", "--model", "m", "--profile-activities", "CPU,MEM"])
    o = _opts(tmp_path, "--profile-steps", "5")
    o.profile_activities = ["CPU"]
    with pytest.raises(ValueError, match="include GPU"):
        off.validate(o)
    rc = main(["bench", "offline", "--model", str(_model(tmp_path)), "--load-format", "dummy", "--dry-run",
               "--batch-sizes", "1,8", "--profile-steps", "5", "--profile-batches", "32"])
    assert rc == 2 and "not among the measured batch sizes [1, 8]" in capsys.readouterr().err


def test_start_profile_kwargs_follow_the_signature():
    async def v0514(output_dir=None, start_step=None, num_steps=None, activities=None, with_stack=None,
                    record_shapes=None, profile_by_stage=False, merge_profiles=False, profile_prefix=None,
                    profile_stages=None):
        pass

    async def older(output_dir=None, num_steps=None, activities=None):
        pass

    async def anything(**kw):
        pass

    want = {"output_dir": "/d", "num_steps": 7, "activities": ["CPU", "GPU"], "with_stack": False,
            "record_shapes": False, "profile_prefix": "stock-b1"}
    assert off._start_profile_kwargs(v0514, want) == want
    assert off._start_profile_kwargs(older, want) == {"output_dir": "/d", "num_steps": 7, "activities": ["CPU", "GPU"]}
    assert off._start_profile_kwargs(anything, want) == want


def _trace(steps=4, period=3000.0, t0=1e6):
    """Minimal SGLang-like trace: per step a host step[DECODE bs=1] range with one cudaGraphLaunch, two kernels."""
    ev, host, dev = [], {"pid": 1, "tid": 2}, {"pid": 0, "tid": 7}
    for k in range(steps):
        t = t0 + k * period
        ev.append({"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "ts": t, "dur": 200, **host})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t + 50, "dur": 20, **host,
                   "args": {"correlation": k}})
        ev.append({"ph": "X", "cat": "kernel", "name": "glm5_megamoe", "ts": t + 100, "dur": 1000, **dev,
                   "args": {"correlation": k, "stream": 7}})
        ev.append({"ph": "X", "cat": "kernel", "name": "flash_fwd_splitkv_mla_fp8_sparse_kernel", "ts": t + 1100,
                   "dur": 500, **dev, "args": {"correlation": k, "stream": 7}})
    return {"traceEvents": ev}


class _FakeTokenizerManager:
    def __init__(self, trace, write_on="start"):
        self.trace, self.calls, self.write_on = trace, [], write_on

    def _write(self, output_dir, prefix):
        import gzip
        from pathlib import Path

        p = Path(output_dir) / f"{prefix}-1700000000.0-TP-0.trace.json.gz"
        p.write_bytes(gzip.compress(json.dumps(self.trace).encode()))

    async def start_profile(self, output_dir=None, num_steps=None, activities=None, with_stack=None,
                            record_shapes=None, profile_by_stage=False, merge_profiles=False, profile_prefix=None):
        self.calls.append(dict(output_dir=output_dir, num_steps=num_steps, activities=activities,
                               with_stack=with_stack, record_shapes=record_shapes, profile_prefix=profile_prefix))
        if self.write_on == "start":  # the scheduler writes it after num_steps forward passes, requests still decoding
            self._write(output_dir, profile_prefix)

    async def stop_profile(self):
        if self.write_on != "stop":
            raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
        self._write(self.calls[-1]["output_dir"], self.calls[-1]["profile_prefix"])


class _FakeEngine:
    def __init__(self, trace, tokens=40, fail=False, write_on="start"):
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = _FakeTokenizerManager(trace, write_on)
        self.tokens, self.fail = tokens, fail

    async def async_generate(self, input_ids=None, sampling_params=None, stream=False):
        if self.fail:
            raise RuntimeError("engine gone")
        tm, n_tok = self.tokenizer_manager, self.tokens

        async def gen():
            import asyncio

            for i in range(1, n_tok + 1):
                await asyncio.sleep(0)
                if i > 1:
                    assert tm.calls, "decode continued past the first token before the profile started"
                yield {"output_ids": [i], "meta_info": {"completion_tokens": i}}
                if i == 1:  # hold at the first token until the profile is requested (as a slow engine would)
                    while not tm.calls:
                        await asyncio.sleep(0)

        return gen()


def test_profile_pass_with_a_fake_engine(tmp_path):
    eng = _FakeEngine(_trace())
    prof = {"steps": 5, "sglang_num_steps": 7, "activities": ["CPU", "GPU"]}
    pdir = tmp_path / "profile-stock-b2"
    pdir.mkdir()
    (pdir / "old.trace.json.gz").write_bytes(b"stale")  # an earlier run's trace is removed first
    info = off._profile_pass(eng, [[11, 12], [13, 14]], {"max_new_tokens": 40}, pdir, prof, "stock-b2")
    assert "error" not in info and info["stopped_by"] == "num_steps"
    assert info["traces"] == ["stock-b2-1700000000.0-TP-0.trace.json.gz"] and info["trace_bytes"] > 0
    assert info["completion_tokens"] == [40, 40]
    call = eng.tokenizer_manager.calls[0]
    assert call == {"output_dir": str(pdir), "num_steps": 7, "activities": ["CPU", "GPU"], "with_stack": False,
                    "record_shapes": False, "profile_prefix": "stock-b2"}
    assert info["start_profile_kwargs_dropped"] == []  # the fake takes every keyword we send, like 0.5.14
    with pytest.raises(RuntimeError, match="engine gone"):
        off._profile_pass(_FakeEngine(_trace(), fail=True), [[1]], {}, tmp_path / "p2", prof, "x")
    # requests ended before num_steps forward passes: the worker stops the profiler itself
    info = off._profile_pass(_FakeEngine(_trace(), write_on="stop"), [[1]], {}, tmp_path / "p3", prof, "s")
    assert info["stopped_by"] == "stop_profile" and info["traces"] and "error" not in info
    info = off._profile_pass(_FakeEngine(_trace(), write_on="never"), [[1]], {}, tmp_path / "p4", prof, "n")
    assert "not in progress" in info["stop_profile"] and info["error"].startswith("no trace written")


def test_attach_profiles_and_report_section(tmp_path):
    import gzip

    pdir = tmp_path / "profile-fastpath-b1"
    pdir.mkdir()
    (pdir / "fastpath-b1-1.0-TP-0.trace.json.gz").write_bytes(gzip.compress(json.dumps(_trace(5)).encode()))
    res = {"stock": _fake("stock", {1: 280.0}, [1, 2]), "fastpath": _fake("fastpath", {1: 300.0}, [1, 2])}
    res["fastpath"]["batches"]["1"]["profile"] = {"dir": str(tmp_path / "elsewhere" / pdir.name), "steps_requested": 5}
    res["stock"]["batches"]["1"]["profile"] = {"dir": str(tmp_path / "profile-stock-b1"), "steps_requested": 5,
                                               "error": "TimeoutError: no first token"}
    lines = off.attach_profiles(res, tmp_path)
    assert len(lines) == 1 and "4 complete step(s) of 5" in lines[0]
    p = res["fastpath"]["batches"]["1"]["profile"]
    s = p["breakdown"]["summary"]
    assert s["steps"] == 4 and s["window_us"]["p50"] == pytest.approx(3000.0) and s["busy_us"]["p50"] == 1500.0
    assert s["category_us"]["ours"]["p50"] == 1000.0 and s["category_us"]["flashmla"]["p50"] == 500.0
    assert (pdir / "breakdown.json").is_file() and (pdir / "breakdown.md").is_file()
    assert res["stock"]["batches"]["1"]["profile"]["breakdown_error"] == "TimeoutError: no first token"
    rep = off.build_report(res)
    assert rep["rows"][0]["fastpath"]["profile"]["breakdown"]["split"] == "host-step"
    md = off.render_markdown(rep)
    assert "## Decode-step breakdown" in md
    assert "| fastpath | 1 | 4 | 3.000 | 3.000 | 1.500 | 50.0 | 1.500 | 1.500 | 1.000 | 0.500 | 3.000 | 1.450 |" in md
    assert "| stock | 1 | - | no breakdown: TimeoutError: no first token |" in md
    assert "`glm5_megamoe` (ours) 1000.0 us/step" in md
    json.dumps(rep)  # the report stays JSON


def test_decode_step_distinct_experts_from_routed_experts():
    import numpy as np

    from glm5_fastpath.bench.offline import decode_step_distinct_experts

    L, k, inp = 3, 2, 4  # layer 0 dense (ignored), layers 1-2 MoE
    def req(rows):
        return np.asarray(rows, dtype=np.int32).reshape(-1)
    prompt = [[[0, 0]] * L] * inp
    a = req(prompt + [[[0, 0], [1, 2], [5, 6]], [[0, 0], [1, 3], [5, 6]]])
    b = req(prompt + [[[0, 0], [1, 2], [7, 8]], [[0, 0], [4, 3], [5, 6]]])
    got = decode_step_distinct_experts([a, b], L, k, [1, 2], inp)
    # step 0: layer 1 {1,2}, layer 2 {5,6,7,8}; step 1: layer 1 {1,3,4}, layer 2 {5,6}
    assert got["steps"] == 2 and got["per_layer"] == {"1": 2.5, "2": 3.0}
    assert got["mean"] == 2.75 and got["min"] == 2.5 and got["max"] == 3.0


def test_routing_stats_option_reaches_engine_args_and_report(tmp_path):
    from glm5_fastpath.bench import offline as off

    model = tmp_path / "m"
    off.write_dummy_model(str(model), layers=2, dense_layers=1)
    o = off.OfflineOptions(model=str(model), load_format="dummy", routing_stats=True, out=str(tmp_path / "o"))
    steps = off.plan(o, "0.5.14")
    assert all(s["config"]["engine_kwargs"]["enable_return_routed_experts"] for s in steps)
    assert steps[0]["config"]["routing_stats"] and steps[0]["config"]["moe_layers"] == [1]
    assert off.run_key(o) != off.run_key(off.OfflineOptions(model=str(model), load_format="dummy", out=str(tmp_path / "o")))
    de = {"steps": 15, "per_layer": {"1": 9.0}, "mean": 9.0, "min": 9.0, "max": 9.0}
    res = {"stock": {"batches": {"1": {"output_tok_s": 100.0, "distinct_experts": de}}},
           "fastpath": {"batches": {"1": {"output_tok_s": 110.0, "distinct_experts": de}}}}
    rep = off.build_report(res)
    md = off.render_markdown(rep)
    assert "stock 9.0 (9.0-9.0); fastpath 9.0 (9.0-9.0)" in md and "measured per decode step" in md


def test_report_only_merges_existing_results_and_keeps_breakdowns(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    """--report-only runs no worker: it merges the mode files of the same settings (stock and fastpath from two
    device calls) and keeps a profile breakdown recorded earlier when its trace is no longer there."""
    o = _opts(tmp_path, "--report-only")
    assert o.report_only
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    real_run = off.subprocess.run

    def run(cmd, *a, **k):
        if "worker" in cmd:
            pytest.fail("report-only must not start a worker")
        return real_run(cmd, *a, **k)

    monkeypatch.setattr(off.subprocess, "run", run)
    monkeypatch.setenv("GLM5_FASTPATH_COMMIT", "abc1234")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_trace_breakdown import sglang_like

    from glm5_fastpath.bench import trace_breakdown as tb

    bd = off.compact_breakdown(tb.analyze(sglang_like(4)))
    for mode, tps in (("stock", 100.0), ("fastpath", 150.0)):
        br = {"output_tokens": 10, "wall_s": 10 / tps, "output_tok_s": tps, "first_tokens": [1, 2, 3]}
        if mode == "stock":
            br["profile"] = {"dir": str(tmp_path / "gone"), "breakdown": bd}
        (out / f"mode-{mode}.json").write_text(json.dumps({"mode": mode, "run_key": off.run_key(o),
                                                           "batches": {str(b): dict(br) for b in o.batch_sizes}}))
    assert off.run_bench(o) == 0
    rep = json.loads((out / "offline.json").read_text())
    row = rep["rows"][0]
    assert row["speedup"] == pytest.approx(1.5)
    assert row["stock"]["profile"]["breakdown"] == bd and "breakdown_error" not in row["stock"]["profile"]
    assert not (out / "prompts.json").exists()  # nothing regenerated


def test_realistic_dummy_in_both_modes(tmp_path):
    """--realistic-dummy: both workers load our model subclass with the bench switch; stock without GLM5_FASTPATH
    (SGLang's path on the same rescaled weights); only with --load-format dummy and the external-package seam."""
    o = _opts(tmp_path, "--realistic-dummy", "--seam", "external-model-package")
    steps = off.plan(o, "0.5.14")
    env = {s["mode"]: s["env"] for s in steps}
    for mode in ("stock", "fastpath"):
        assert env[mode][off.ENV_REALISTIC_DUMMY] == "1" and env[mode][off.ENV_EXTERNAL] == off.EXTERNAL_PACKAGE
    assert env["stock"][off.ENV_SWITCH] is None and env["fastpath"][off.ENV_SWITCH] == "1"
    plain = off.plan(_opts(tmp_path, "--seam", "external-model-package"), "0.5.14")
    assert all(s["env"][off.ENV_REALISTIC_DUMMY] is None for s in plain)
    assert {s["mode"]: s["env"][off.ENV_EXTERNAL] for s in plain}["stock"] is None
    assert off.run_key(o) != off.run_key(_opts(tmp_path))
    full = off.mode_env("stock", "external-model-package", base={off.ENV_REALISTIC_DUMMY: "1"})
    assert off.ENV_REALISTIC_DUMMY not in full  # never inherited: only the option sets it
    from glm5_fastpath.bench import dummy_weights

    assert off.ENV_REALISTIC_DUMMY == dummy_weights.ENV
    with pytest.raises(ValueError, match="external-model-package seam"):
        off.plan(_opts(tmp_path, "--realistic-dummy", "--seam", "plugin"), "0.5.23")
    a = build_parser().parse_args(["bench", "offline", "--model", str(_model(tmp_path)), "--realistic-dummy",
                                   "--out", str(tmp_path / "o2")])
    with pytest.raises(ValueError, match="needs --load-format dummy"):
        off.validate(off.options_from_args(a))


def test_logprob_gap_over_the_common_greedy_prefix():
    a = {"ids": [5, 6, 7, 8], "logprobs": [-0.10, -0.20, -0.30, -0.40]}
    b = {"ids": [5, 6, 9, 8], "logprobs": [-0.11, -0.25, -3.00, -0.40]}
    gap, n = off.logprob_gap(a, b)
    assert n == 2 and gap == pytest.approx(0.05)  # stops at the first differing id
    assert off.logprob_gap(None, b) == (None, 0) and off.logprob_gap({"ids": [], "logprobs": []}, b) == (None, 0)
    assert off.logprob_gap({"ids": [1], "logprobs": [None]}, {"ids": [1], "logprobs": [-1.0]}) == (None, 0)


def test_report_carries_the_logprob_gap():
    res = {"stock": _fake("stock", {1: 290.0}, [5, 6, 7]), "fastpath": _fake("fastpath", {1: 400.0}, [5, 6, 7])}
    res["stock"]["batches"]["1"]["first_logprobs"] = {"ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3]}
    res["fastpath"]["batches"]["1"]["first_logprobs"] = {"ids": [5, 6, 7], "logprobs": [-0.1, -0.23, -0.3]}
    rep = off.build_report(res)
    assert rep["rows"][0]["logprob_max_abs_diff"] == pytest.approx(0.03) and rep["rows"][0]["logprob_compared_tokens"] == 3
    assert "same (of 3); max abs logprob diff 0.03 over 3" in off.render_markdown(rep)


def test_report_names_both_choices_at_the_first_difference():
    res = {"stock": _fake("stock", {1: 290.0}, [5, 6, 7]), "fastpath": _fake("fastpath", {1: 400.0}, [5, 9, 7])}
    res["stock"]["batches"]["1"]["first_logprobs"] = {"ids": [5, 6, 7], "logprobs": [-0.93, -1.084, -0.3]}
    res["fastpath"]["batches"]["1"]["first_logprobs"] = {"ids": [5, 9, 7], "logprobs": [-0.93, -1.893, -0.3]}
    rep = off.build_report(res)
    assert rep["rows"][0]["first_choice_difference"] == {"index": 1, "stock": [6, -1.084], "fastpath": [9, -1.893]}
    assert "at token 1: stock 6 @ -1.08, fastpath 9 @ -1.89" in off.render_markdown(rep)
    assert off.first_choice_difference({"ids": [1, 2], "logprobs": [-1.0]}, {"ids": [1, 3], "logprobs": []}) == \
        {"index": 1, "a": [2, None], "b": [3, None]}
    assert off.first_choice_difference({"ids": [1]}, {"ids": [1]}) is None


def test_logprob_pass_reads_sglang_meta_info():
    class Engine:
        def generate(self, input_ids, sampling_params, return_logprob=False):
            assert return_logprob and sampling_params["max_new_tokens"] == off.FIRST_TOKENS_KEPT
            return [{"meta_info": {"output_token_logprobs": [(-0.5, 11, None), (None, 12, None)]}}]

    got = off._logprob_pass(Engine(), [1, 2, 3], {"temperature": 0.0, "max_new_tokens": 256})
    assert got == {"ids": [11, 12], "logprobs": [-0.5, None]}


def test_non_decode_share_per_call():
    """wall per call minus the decode steps (tokens per request - 1 ITLs): what made batch-1 tok/s noisy."""
    br = {"wall_s": 8 * 0.5663, "output_tokens": 8 * 256, "calls": 8, "itl_ms": {"mean": 2.054}}
    assert off.non_decode_ms_per_call(br, 1) == pytest.approx(566.3 - 255 * 2.054)
    br1 = {"wall_s": 1.3565, "output_tokens": 2048, "itl_ms": {"mean": 5.16}}  # one call of 8 requests
    assert off.non_decode_ms_per_call(br1, 8) == pytest.approx(1356.5 - 255 * 5.16)
    assert off.non_decode_ms_per_call({"wall_s": 1.0}, 1) is None
    res = {"stock": {"batches": {"1": dict(br, output_tok_s=452.0)}}}
    rep = off.build_report(res)
    assert rep["rows"][0]["stock"]["calls"] == 8
    assert "| 1 | 452.0 |" in off.render_markdown(rep) and "42.5 (8 calls)" in off.render_markdown(rep)
