"""register() wiring, the server flags and the env switch, against a fake HookRegistry (no sglang)."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from glm5_fastpath.integrations.sglang import plugin
from glm5_fastpath.selection import SelectionError


class FakeServerArgs:
    """The two ServerArgs methods the plugin hooks, with the real decorators."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path")

    @classmethod
    def from_cli_args(cls, args):
        return cls(model_path=args.model_path)


class FakeModelRunner:
    def __init__(self):
        self.loaded = 0

    def load_model(self):
        self.loaded += 1


def _wire(reg):
    plugin.register()
    reg.apply({plugin.TARGET_ADD_CLI_ARGS: (FakeServerArgs, "add_cli_args"),
               plugin.TARGET_FROM_CLI_ARGS: (FakeServerArgs, "from_cli_args"),
               plugin.TARGET_LOAD_MODEL: (FakeModelRunner, "load_model")})


def _parse(argv):
    p = argparse.ArgumentParser()
    FakeServerArgs.add_cli_args(p)
    return FakeServerArgs.from_cli_args(p.parse_args(argv))


@pytest.fixture
def wired(fake_sglang, monkeypatch):
    # restore the fake classes' methods after each test
    for name in ("add_cli_args", "from_cli_args"):
        monkeypatch.setattr(FakeServerArgs, name, FakeServerArgs.__dict__[name])
    monkeypatch.setattr(FakeModelRunner, "load_model", FakeModelRunner.__dict__["load_model"])
    _wire(fake_sglang)
    return fake_sglang


def test_register_three_light_hooks(fake_sglang):
    plugin.register()
    got = [(t, h.__name__, ht.name) for t, h, ht in fake_sglang.hooks]
    assert got == [
        ("sglang.srt.server_args.ServerArgs.add_cli_args", "add_cli_args", "AFTER"),
        ("sglang.srt.server_args.ServerArgs.from_cli_args", "from_cli_args", "AROUND"),
        ("sglang.srt.model_executor.model_runner.ModelRunner.load_model", "after_load_model", "AFTER"),
    ]


def test_flag_sets_env_and_bookkeeping(wired):
    sa = _parse(["--model-path", "x", "--enable-glm5-fastpath"])
    assert os.environ["GLM5_FASTPATH"] == "1"
    assert sa.model_path == "x" and sa._glm5_fastpath is True


def test_no_flag_leaves_env_alone(wired):
    sa = _parse(["--model-path", "x"])
    assert "GLM5_FASTPATH" not in os.environ and sa._glm5_fastpath is False


def test_env_alone_is_the_switch(wired, monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH", "1")
    assert _parse(["--model-path", "x"])._glm5_fastpath is True


def test_config_flag_validated_and_exported(wired, tmp_path):
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"version": 1, "buckets": [{"tokens": 8, "prefix": "stock", "moe": "stock"}]}))
    _parse(["--enable-glm5-fastpath", "--glm5-fastpath-config", str(good)])
    assert os.environ["GLM5_FASTPATH_CONFIG"] == str(good)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "buckets": [{"tokens": 8, "prefix": "fast", "moe": "stock"}]}))
    with pytest.raises(SelectionError, match=r"bad\.json: buckets\[0\]\.prefix"):
        _parse(["--glm5-fastpath-config", str(bad)])


def test_load_model_hook_installs_only_when_switched_on(wired, monkeypatch):
    import glm5_fastpath.integrations.sglang.install as inst

    calls = []
    monkeypatch.setattr(inst, "install", lambda mr: calls.append(mr))
    mr = FakeModelRunner()
    mr.load_model()
    assert mr.loaded == 1 and calls == []
    monkeypatch.setenv("GLM5_FASTPATH", "1")
    mr.load_model()
    assert mr.loaded == 2 and calls == [mr]


def test_register_imports_nothing_heavy():
    """Every SGLang process runs register(): it must not import torch, prometheus_client or sglang models."""
    code = f"""
import sys, types
sys.path.insert(0, {os.path.dirname(__file__)!r})
from conftest import FakeHookRegistry, HookType
for n in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.plugins.hook_registry"):
    sys.modules[n] = types.ModuleType(n)
sys.modules["sglang.srt.plugins.hook_registry"].HookRegistry = FakeHookRegistry
sys.modules["sglang.srt.plugins.hook_registry"].HookType = HookType
from glm5_fastpath.integrations.sglang.plugin import register
import glm5_fastpath.integrations.sglang.models
register()
heavy = [m for m in ("torch", "prometheus_client", "sglang.srt.models", "triton") if m in sys.modules]
assert not heavy, heavy
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
