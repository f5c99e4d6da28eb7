"""bench/host_timing.py on CPU: a stand-in scheduler loop under a fake clock (periods, stages, GPU waits, decode-only
records, nested stages), the import hook on a stand-in module, reading / summarising / rendering, and the
bench offline plumbing (flag, run key, worker config, windows, report)."""
import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from glm5_fastpath.bench import host_timing as ht
from glm5_fastpath.bench import offline as off


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def tick(self, us):
        self.t += us * 1e-6


class Mode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


class Batch:
    def __init__(self, bs, decode=True):
        self.bs, self.forward_mode = bs, Mode(decode)

    def batch_size(self):
        return self.bs


def make_scheduler(clock):
    class Event:
        def synchronize(self):
            clock.tick(300)  # the host waits 300 us for the GPU

    class Scheduler:
        def __init__(self):
            self.next = []

        def process_input_requests(self, reqs):
            clock.tick(20)

        def get_next_batch_to_run(self):
            clock.tick(100)
            return self.next.pop(0) if self.next else None

        def run_batch(self, batch):
            clock.tick(500)
            self.helper()  # a nested call of another stage is not timed twice
            return "result"

        def helper(self):
            self.process_input_requests([])

        def process_batch_result(self, batch, result):
            Event().synchronize()
            clock.tick(200)

        def launch_batch_sample_if_needed(self, result):
            clock.tick(30)

    return Scheduler, Event


def run_loop(s, n):
    for _ in range(n):
        s.process_input_requests([])
        b = s.get_next_batch_to_run()
        r = s.run_batch(b) if b is not None else None
        if b is not None:
            s.process_batch_result(b, r)
        s.launch_batch_sample_if_needed(r)


@pytest.fixture
def loop(monkeypatch):
    clock = Clock()
    Scheduler, Event = make_scheduler(clock)
    rec = ht.Recorder(None, clock=clock, wall=lambda: 1234.5)
    monkeypatch.setattr(ht, "FLUSH_LINES", 10 ** 6)
    monkeypatch.setattr(ht, "FLUSH_S", 10 ** 6)
    wrapped = ht.patch_scheduler(Scheduler, rec, Event)
    return SimpleNamespace(clock=clock, Scheduler=Scheduler, Event=Event, rec=rec, wrapped=wrapped)


def test_wraps_every_stage_once(loop):
    assert loop.wrapped == list(ht.STAGES)
    assert ht.patch_scheduler(loop.Scheduler, loop.rec, loop.Event) == []  # idempotent: already wrapped


def test_records_decode_iterations_with_period_stages_and_wait(loop):
    s = loop.Scheduler()
    s.next = [Batch(1, decode=False), Batch(4), Batch(4), None]
    run_loop(s, 5)
    recs = [json.loads(x) for x in loop.rec.lines]
    # iterations 1 (prefill) and 4-5 (idle) are not recorded; iteration 5 has no successor yet
    assert [r["bs"] for r in recs] == [4, 4]
    r = recs[0]
    # the period runs from one get_next_batch_to_run to the next: 100 + 500 + 20 (nested) + 300 + 200 + 30 + 20
    assert r["iter_us"] == pytest.approx(1170.0)
    assert r["gpu_wait_us"] == pytest.approx(300.0)
    assert r["stage_us"] == pytest.approx({"get_next_batch_to_run": 100.0, "run_batch": 520.0,
                                          "process_batch_result": 500.0, "launch_batch_sample_if_needed": 30.0,
                                          "process_input_requests": 20.0})
    assert r["t"] == 1234.5


def test_flush_every_n_lines_and_after_idle_time(tmp_path, monkeypatch):
    clock = Clock()
    Scheduler, Event = make_scheduler(clock)
    path = tmp_path / "t.jsonl"
    rec = ht.Recorder(str(path), clock=clock)
    monkeypatch.setattr(ht, "FLUSH_LINES", 3)
    monkeypatch.setattr(ht, "FLUSH_S", 10 ** 6)
    ht.patch_scheduler(Scheduler, rec, Event)
    s = Scheduler()
    s.next = [Batch(2)] * 4
    run_loop(s, 5)
    assert len(ht.read(str(path))) == 3 and len(rec.lines) == 1
    monkeypatch.setattr(ht, "FLUSH_S", 0.5)
    clock.tick(600_000)  # the loop idles: the next iteration writes what is left
    run_loop(s, 1)
    assert len(ht.read(str(path))) == 4 and rec.lines == []


def test_probe_timed_even_when_nested(loop):
    class Runner:
        def forward(self):
            loop.clock.tick(400)

    assert ht._wrap_probe(Runner, "forward", loop.rec) and not ht._wrap_probe(Runner, "forward", loop.rec)
    orig = loop.Scheduler.__dict__["run_batch"].__wrapped__

    def run_batch(self, batch):  # run_batch (a stage) calls the probed forward
        Runner().forward()
        return orig(self, batch)

    loop.Scheduler.run_batch = run_batch
    ht._wrap_stage(loop.Scheduler, "run_batch", loop.rec)
    s = loop.Scheduler()
    s.next = [Batch(2), Batch(2), None]
    run_loop(s, 3)
    recs = [json.loads(x) for x in loop.rec.lines]
    assert [r["probe_us"] for r in recs] == [{"Runner.forward": 400.0}] * 2
    assert recs[0]["stage_us"]["run_batch"] == pytest.approx(920.0)
    summ = ht.summarize(recs)
    assert summ[2]["probe_us_p50"] == {"Runner.forward": 400.0}
    assert "- batch 2, inside the stages (p50 us per iteration): Runner.forward 400.0" in ht.render(summ, "x")


def test_default_targets_cover_the_loop_and_probes():
    t = ht.default_targets()
    assert t[ht.SCHEDULER_MODULE] == ("Scheduler", ht.STAGES, "stage")
    assert all(kind == "probe" for m, (_, _, kind) in t.items() if m != ht.SCHEDULER_MODULE) and len(t) == 5


def test_read_skips_torn_and_foreign_lines(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"bs": 1, "iter_us": 5.0}\n{"bs": "x", "iter_us": 1}\n[1]\n{"bs": 2, "iter_')
    assert ht.read(str(p)) == [{"bs": 1, "iter_us": 5.0}]
    assert ht.read(str(tmp_path / "missing")) == []


def test_summarize_and_render():
    recs = [{"bs": 1, "iter_us": 2000.0 + i, "gpu_wait_us": 10.0, "stage_us": {"run_batch": 900.0}} for i in range(30)]
    recs += [{"bs": 8, "iter_us": 5200.0, "gpu_wait_us": 3000.0, "stage_us": {}} for _ in range(5)]
    s = ht.summarize(recs)
    assert s[1]["iterations"] == 22  # the first 8 of 30 left out
    assert s[1]["iter_us_p50"] == pytest.approx(2018.5)
    assert s[1]["host_busy_us_p50"] == pytest.approx(2008.5)
    assert s[1]["host_busy_share"] > 0.99
    assert s[8]["iterations"] == 5 and s[8]["host_busy_share"] == pytest.approx(0.423, abs=1e-3)
    md = "\n".join(ht.render(s, "Host loop, x"))
    assert "| 1 | 22 | 2018.5 | 10.0 | 2008.5 | 100 % | 900.0 |" in md  # only the stages recorded
    assert ht.render({}, "T") == ["T: no decode iterations recorded"]


def test_import_hook_patches_the_module_when_it_is_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_sched_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text(textwrap.dedent("""
        class Scheduler:
            def get_next_batch_to_run(self):
                return None
    """))
    (pkg / "runner.py").write_text(textwrap.dedent("""
        class Base:
            def forward(self):
                return 1
        class Runner(Base):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ht, "_recorder", None)
    before = list(sys.meta_path)
    targets = {"fake_sched_pkg.scheduler": ("Scheduler", ht.STAGES, "stage"),
               "fake_sched_pkg.runner": ("Runner", ("forward", "missing"), "probe")}
    rec = ht.install(None, targets=targets, event_cls=type("E", (), {"synchronize": lambda s: None}))
    try:
        assert len(sys.meta_path) == len(before) + 1
        import fake_sched_pkg.scheduler as m
        assert getattr(m.Scheduler.get_next_batch_to_run, ht._MARK)
        assert len(sys.meta_path) == len(before) + 1  # still waiting for the runner module
        import fake_sched_pkg.runner as r
        assert getattr(r.Runner.forward, ht._MARK) and not hasattr(r.Runner, "missing")
        assert sys.meta_path == before  # every target patched: the hook is gone
        r.Runner().forward()
        assert rec.probe["Runner.forward"] >= 0
        metas = [json.loads(x) for x in rec.lines if "patched" in x]
        assert metas == [{"patched": "fake_sched_pkg.scheduler.Scheduler", "methods": ["get_next_batch_to_run"]},
                         {"patched": "fake_sched_pkg.runner.Runner", "methods": ["forward"]}]
        assert ht.install(None) is rec
    finally:
        sys.meta_path[:] = before
        sys.modules.pop("fake_sched_pkg.scheduler", None)
        sys.modules.pop("fake_sched_pkg.runner", None)
        sys.modules.pop("fake_sched_pkg", None)


def test_install_from_env_is_a_no_op_without_the_variable(monkeypatch):
    monkeypatch.delenv(ht.ENV, raising=False)
    monkeypatch.setattr(ht, "_recorder", None)
    assert ht.install_from_env() is None and ht.recorder() is None


def test_child_process_installs_from_env(tmp_path):
    """What SGLang's spawned scheduler does: importing bench.offline with the variable set installs the hook."""
    code = ("import sys; import glm5_fastpath.bench.offline; from glm5_fastpath.bench import host_timing as h; "
            "print(h.recorder() is not None, any(type(f).__name__ == '_PatchOnImport' for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, ht.ENV: str(tmp_path / "h.jsonl")})
    assert out.stdout.split() == ["True", "True"]


# ---- bench offline plumbing --------------------------------------------------------------------------

def _opts(tmp_path, **kw):
    return off.OfflineOptions(model=str(tmp_path), batch_sizes=[1, 8], out=str(tmp_path / "o"), **kw)


def test_flag_run_key_and_worker_config(tmp_path):
    p = __import__("argparse").ArgumentParser()
    off.add_arguments(p)
    a = p.parse_args(["--model", str(tmp_path), "--host-timing"])
    assert off.options_from_args(a).host_timing is True
    o, o2 = _opts(tmp_path), _opts(tmp_path, host_timing=True)
    assert off.run_key(o) != off.run_key(o2)
    cfg = {"num_hidden_layers": 2}
    assert off.worker_config(o, "stock", "none", cfg)["host_timing_file"] is None
    f = off.worker_config(o2, "fastpath", "none", cfg)["host_timing_file"]
    assert f.endswith("host-timing-fastpath.jsonl")


def test_collect_host_timing_by_window(tmp_path):
    p = tmp_path / "h.jsonl"
    lines = [{"t": 10.0 + i * 0.001, "bs": 1, "iter_us": 2000.0, "gpu_wait_us": 0.0, "stage_us": {}} for i in range(40)]
    lines += [{"t": 20.0 + i * 0.001, "bs": 1, "iter_us": 2500.0, "gpu_wait_us": 0.0, "stage_us": {}} for i in range(40)]
    lines += [{"t": 30.0 + i * 0.001, "bs": 8, "iter_us": 5000.0, "gpu_wait_us": 4000.0, "stage_us": {}}
              for i in range(40)]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    batches = {"1": {"timed_window": [9.9, 10.5], "stream_window": [19.9, 20.5]},
               "8": {"timed_window": [29.9, 30.5]}, "16": {"error": "x"}}
    r = off.collect_host_timing(str(p), batches, settle_s=0)
    assert r["records"] == 120
    assert r["1"]["timed"]["iter_us_p50"] == 2000.0 and r["1"]["stream"]["iter_us_p50"] == 2500.0
    assert r["8"]["timed"]["host_busy_us_p50"] == 1000.0 and "stream" not in r["8"] and "16" not in r


def test_report_renders_host_loop_table():
    summ = {"iterations": 22, "iter_us_p50": 2010.0, "gpu_wait_us_p50": 5.0, "host_busy_us_p50": 2005.0,
            "host_busy_share": 0.997, "stage_us_p50": {"run_batch": 800.0}}
    rep = {"modes": {"fastpath": {"host_timing": {"file": "f", "records": 300, "1": {"timed": summ}}},
                     "stock": {}}}
    md = "\n".join(off.render_host_timing(rep))
    assert "Host loop, fastpath, timed calls (300 decode iterations recorded)" in md
    assert "| 1 | 22 | 2010.0 | 5.0 | 2005.0 | 100 % | 800.0 |" in md
    assert off.render_host_timing({"modes": {"stock": {}}}) == []
