"""install / patch on a fake GLM-5-shaped model (no sglang): wrappers call SGLang's original methods,
log once per reason, count paths and time decode steps in the metrics."""
import logging
import types

import pytest
from prometheus_client import CollectorRegistry

from glm5_fastpath.integrations.sglang import decision, install as inst, patch
from glm5_fastpath.metrics import FastpathMetrics

GPU = ("NVIDIA H200", (9, 0))


class H:  # a hidden-states stand-in: only .shape[0] is read
    def __init__(self, m):
        self.shape = (m, 6144)


def fb(mode, bs=None):
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(name=mode), batch_size=bs)


class Attn:
    def forward_absorb_prepare(self, positions, hidden_states, forward_batch, zero_allocator=None):
        return ("stock-prefix", hidden_states.shape[0])


class MoE:
    experts, gate = object(), object()

    def forward(self, hidden_states, forward_batch=None, **kw):
        return ("stock-moe", hidden_states.shape[0])


class DenseMLP:
    def forward(self, hidden_states, forward_batch=None):
        return "dense"


def fake_model(n_dense=1, n_moe=2):
    layers = [types.SimpleNamespace(self_attn=Attn(), mlp=DenseMLP() if i < n_dense else MoE())
              for i in range(n_dense + n_moe)]
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=layers),
                                 config=None)


class Runner:
    def __init__(self, model):
        self.model, self.calls = model, 0
        hf = types.SimpleNamespace(architectures=["GlmMoeDsaForCausalLM"],
                                   quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
        self.model_config = types.SimpleNamespace(hf_config=hf, quantization="fp8")
        self.server_args = types.SimpleNamespace(tp_size=1, ep_size=1, dp_size=1, pp_size=1, enable_dp_attention=False)
        self.is_draft_worker = False

    def forward(self, forward_batch, **kw):
        self.calls += 1
        return "out"


@pytest.fixture
def metrics():
    return FastpathMetrics(CollectorRegistry())


@pytest.fixture(autouse=True)
def no_config(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_CONFIG", raising=False)


def val(m, name, **labels):
    return m.registry.get_sample_value(name, labels) or 0.0


def test_facts_from_model_runner():
    f = inst.facts_from_model_runner(Runner(fake_model()), gpu=GPU)
    assert f == decision.ModelFacts("GlmMoeDsaForCausalLM", False, "NVIDIA H200", (9, 0), "fp8", (128, 128))
    r = Runner(fake_model())
    r.server_args.tp_size, r.is_draft_worker = 8, True
    f = inst.facts_from_model_runner(r, gpu=(None, None))
    assert (f.tp_size, f.is_draft_worker, f.capability) == (8, True, None)


def test_install_wraps_and_calls_stock(metrics, caplog, tmp_path, monkeypatch):
    # an all-stock table (the shipped H200 one routes to our kernels, which need a GPU: test_sglang_real / H200)
    import json

    tpath = tmp_path / "stock.json"
    tpath.write_text(json.dumps({"version": 1, "buckets": [{"tokens": t, "prefix": "stock", "moe": "stock"}
                                                           for t in (1, 2, 4, 8, 16, 32, 64, 128, 256)]}))
    monkeypatch.setenv(inst.ENV_CONFIG, str(tpath))
    model, runner = fake_model(), None
    runner = Runner(model)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    rep = inst.install_model(model, inst.facts_from_model_runner(runner, gpu=GPU), model_runner=runner, metrics=metrics)
    assert rep.installed and rep.patched == {"prefix": 3, "moe": 2} and not rep.compiled
    assert rep.table.source == str(tpath)
    layers = model.model.layers
    # results are SGLang's own, on every path
    for _ in range(2):
        assert layers[1].self_attn.forward_absorb_prepare(None, H(3), fb("DECODE")) == ("stock-prefix", 3)
        assert layers[1].mlp.forward(H(3), fb("DECODE")) == ("stock-moe", 3)
        assert layers[2].mlp.forward(hidden_states=H(500), forward_batch=fb("EXTEND")) == ("stock-moe", 500)
    assert layers[0].mlp.forward(H(3)) == "dense"  # the dense MLP is not wrapped
    assert "forward" not in vars(layers[0].mlp)
    text = caplog.text
    assert text.count("glm5_fastpath: bucket 4 -> stock (prefix: selection table picks stock)") == 1
    assert text.count("glm5_fastpath: bucket 4 -> stock (MoE: selection table picks stock)") == 1
    assert text.count("glm5_fastpath: prefill_extend M=500 -> stock (MoE: prefill") == 1
    assert "routes no bucket to a built glm5_fastpath executor" in text and "nothing to compile" in text
    # selected info: every bucket stock
    assert val(metrics, "glm5_fastpath_selected_info", bucket="16", prefix="stock", moe="stock") == 1
    # step wrapper: counts passes by path/reason, times decode steps
    assert runner.forward(fb("DECODE", 5)) == "out"
    runner.forward(fb("DECODE", 5))
    runner.forward(fb("EXTEND", 2))
    runner.forward(fb("DECODE", 300))
    assert runner.calls == 4
    assert val(metrics, "glm5_fastpath_path_total", path="stock", reason="table_selects_stock") == 2
    assert val(metrics, "glm5_fastpath_path_total", path="stock", reason="prefill_extend") == 1
    assert val(metrics, "glm5_fastpath_path_total", path="stock", reason="above_largest_bucket") == 1
    assert val(metrics, "glm5_fastpath_decode_step_seconds_count", bucket="8", path="stock") == 2
    assert val(metrics, "glm5_fastpath_decode_step_seconds_count", bucket="above", path="stock") == 1
    # idempotent
    assert inst.install_model(model, inst.facts_from_model_runner(runner, gpu=GPU), metrics=metrics) is rep


def test_refused_model_is_untouched(metrics, caplog):
    model = fake_model()
    caplog.set_level(logging.INFO, "glm5_fastpath")
    facts = decision.ModelFacts("GlmMoeDsaForCausalLM", capability=(8, 0), gpu_name="NVIDIA A100",
                                quant_method="fp8", weight_block_size=(128, 128))
    rep = inst.install_model(model, facts, metrics=metrics)
    assert not rep.installed and rep.refusal.reason == "gpu_arch"
    assert "not routing this model: GPU is older than Hopper" in caplog.text
    assert "forward_absorb_prepare" not in vars(model.model.layers[0].self_attn)


def test_user_table_and_registered_executor(metrics, tmp_path, monkeypatch, caplog):
    """The dispatch works once an executor exists: fake 'cmp' / 'megamoe' executors get the original method."""
    p = tmp_path / "sel.json"
    p.write_text('{"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "megamoe:m8"}]}')
    monkeypatch.setenv("GLM5_FASTPATH_CONFIG", str(p))
    monkeypatch.setattr(decision, "BUILT_PREFIX", frozenset({"cmp"}))
    monkeypatch.setitem(patch.EXECUTORS, "prefix", {"cmp": lambda orig, *a, **k: ("cmp", orig(*a, **k))})
    monkeypatch.setitem(patch.EXECUTORS, "moe", {"megamoe": lambda orig, *a, **k: ("megamoe", orig(*a, **k))})
    moe_buckets = []
    monkeypatch.setattr(inst, "_prepare_moe", lambda model, router, buckets, m, log: moe_buckets.append(buckets))
    compiled = []
    monkeypatch.setattr(inst, "_precompile", lambda cfg, m, log, table=None: compiled.append(table.largest))
    caplog.set_level(logging.INFO, "glm5_fastpath")
    model = fake_model()
    rep = inst.install_model(model, decision.ModelFacts("GlmMoeDsaForCausalLM", gpu_name="H200", capability=(9, 0),
                                                        quant_method="fp8", weight_block_size=(128, 128)), metrics=metrics)
    assert rep.compiled and compiled == [8]  # with the table (its CMP modes pick the wait-point cubins)
    attn, moe = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.forward_absorb_prepare(None, H(2), fb("DECODE")) == ("cmp", ("stock-prefix", 2))
    assert attn.forward_absorb_prepare(None, H(2), fb("EXTEND")) == ("stock-prefix", 2)
    assert moe.forward(H(2), fb("DECODE")) == ("megamoe", ("stock-moe", 2))
    assert moe.forward(H(2), fb("EXTEND")) == ("stock-moe", 2)
    assert moe_buckets == [[8]]
    assert "glm5_fastpath: bucket 8 -> cmp (prefix)" in caplog.text
    assert "glm5_fastpath: bucket 8 -> megamoe:m8 (MoE)" in caplog.text
    assert val(metrics, "glm5_fastpath_selected_info", bucket="8", prefix="cmp", moe="megamoe:m8") == 1
    assert patch.unpatch(attn, "forward_absorb_prepare") and attn.forward_absorb_prepare(None, H(2), fb("DECODE"))[0] == "stock-prefix"
    assert not patch.unpatch(attn, "forward_absorb_prepare")


def test_prefill_moe_route_follows_the_prepared_layers(metrics, tmp_path, monkeypatch):
    """Prefill / extend MoE goes to MegaMoE only when the env asks for it and MegaMoE layers were prepared."""
    import types

    p = tmp_path / "sel.json"
    p.write_text('{"version": 1, "buckets": [{"tokens": 8, "prefix": "stock", "moe": "megamoe"}]}')
    monkeypatch.setenv("GLM5_FASTPATH_CONFIG", str(p))
    monkeypatch.setitem(patch.EXECUTORS, "moe", {"megamoe": lambda orig, *a, **k: ("megamoe", orig(*a, **k))})
    monkeypatch.setattr(inst, "_precompile", lambda cfg, m, log, table=None: None)
    facts = decision.ModelFacts("GlmMoeDsaForCausalLM", gpu_name="H200", capability=(9, 0), quant_method="fp8",
                                weight_block_size=(128, 128))
    for prepared, env, want in ((types.SimpleNamespace(routed=[1]), "16384", "megamoe"),
                                (types.SimpleNamespace(routed=[1]), None, "stock-moe"),  # opt-in: off by default
                                (types.SimpleNamespace(routed=[1]), "0", "stock-moe"),
                                (types.SimpleNamespace(routed=[]), "16384", "stock-moe"), (None, "16384", "stock-moe")):
        if env is None:
            monkeypatch.delenv(decision.ENV_PREFILL_MOE, raising=False)
        else:
            monkeypatch.setenv(decision.ENV_PREFILL_MOE, env)
        monkeypatch.setattr(inst, "_prepare_moe", lambda model, router, buckets, m, log, r=prepared: r)
        model = fake_model()
        inst.install_model(model, facts, metrics=metrics)
        assert model.model.layers[1].mlp.forward(H(700), fb("EXTEND"))[0] == want


def test_step_timer_reads_events_without_sync(metrics):
    class Ev:
        clock = [0.0]

        def __init__(self):
            self.t, self.done = None, False

        def record(self):
            self.t = Ev.clock[0]

        def query(self):
            return self.done

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    t = patch.StepTimer(metrics, Ev)
    tok = t.start()
    Ev.clock[0] = 0.004
    t.stop(tok, "4", "stock")
    t.drain()
    assert len(t.pending) == 1 and val(metrics, "glm5_fastpath_decode_step_seconds_count", bucket="4", path="stock") == 0
    t.pending[0][1].done = True
    t.drain()
    assert not t.pending
    assert val(metrics, "glm5_fastpath_decode_step_seconds_sum", bucket="4", path="stock") == pytest.approx(0.004)


def test_install_entry_uses_runner(monkeypatch, metrics):
    seen = {}
    monkeypatch.setattr(inst, "_gpu", lambda: GPU)
    monkeypatch.setattr(inst, "install_model", lambda model, facts, model_runner=None: seen.update(f=facts, m=model))
    r = Runner(fake_model())
    inst.install(r)
    assert seen["m"] is r.model and seen["f"].capability == (9, 0)


def test_log_level_env_gives_our_logger_a_handler(monkeypatch):
    log = logging.getLogger("glm5_fastpath.test_level")
    monkeypatch.delenv("GLM5_FASTPATH_LOG_LEVEL", raising=False)
    inst.configure_logging(log)
    assert not log.handlers  # unset: SGLang's configuration rules
    monkeypatch.setenv("GLM5_FASTPATH_LOG_LEVEL", "info")
    inst.configure_logging(log)
    inst.configure_logging(log)  # idempotent
    assert len(log.handlers) == 1 and log.level == logging.INFO and not log.propagate
    log.removeHandler(log.handlers[0])
