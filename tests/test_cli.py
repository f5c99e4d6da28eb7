"""The glm5-fastpath command end to end on CPU (what the README promises a newcomer)."""
import json
import subprocess
import sys

import torch

from glm5_fastpath.cli import main
from glm5_fastpath.config import Glm5Config
from glm5_fastpath.platform import detect


def test_info_explains_every_path(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "paths:" in out and "reference (pure PyTorch)" in out
    info = detect()
    for p in info.paths:
        assert p.why, f"path {p.name} gives no reason"
    if not torch.cuda.is_available():
        assert "no CUDA GPU visible" in out


def test_demo_small_prints_per_op_time_bytes_floor(capsys):
    assert main(["demo", "--preset", "small", "--batch", "3", "--kv-len", "200", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    for op in ("A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2", "attn_core", "moe", "**layer**"):
        assert f"| {op} |" in out, op
    assert "distinct routed experts touched" in out


def test_make_checkpoint_then_demo_from_it(tmp_path, capsys):
    d = tmp_path / "ckpt"
    assert main(["make-checkpoint", str(d), "--layers", "2", "--small", "--seed", "3"]) == 0
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["num_hidden_layers"] == 2
    assert Glm5Config.from_file(d).num_hidden_layers == 2
    assert main(["demo", "--checkpoint", str(d), "--batch", "2", "--kv-len", "100", "--repeat", "2"]) == 0
    assert "| moe |" in capsys.readouterr().out
    # a second write into the same dir is refused with a clear error (exit 2), not a traceback
    assert main(["make-checkpoint", str(d), "--layers", "2", "--small"]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_console_script_module_entry():
    r = subprocess.run([sys.executable, "-m", "glm5_fastpath.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "make-checkpoint" in r.stdout and "demo" in r.stdout


def test_plan_command_builds_and_validates(capsys):
    assert main(["plan", "--shared-kv", "--m", "16", "--kv-len", "8192"]) == 0
    out = capsys.readouterr().out
    # 732 article tiles + 16 B0 row finalisers + 16 E2 rows - 4 B1 partials (4 K splits, the article has 8)
    assert "tasks=760" in out and "events=76" in out
    assert main(["plan", "--preset", "small", "--m", "3", "--kv-len", "300", "--dump"]) == 0
    assert "SM 0:" in capsys.readouterr().out


def test_plan_command_schedulers_are_the_planners(capsys):
    from glm5_fastpath.attn_pre.megartp.plan import SCHEDULERS
    from glm5_fastpath.cli import PLAN_SCHEDULERS
    assert PLAN_SCHEDULERS == SCHEDULERS
    assert main(["plan", "--preset", "small", "--m", "3", "--kv-len", "300", "--num-sms", "4",
                 "--scheduler", "dynamic"]) == 0
    assert "scheduler=dynamic" in capsys.readouterr().out


def test_bench_moe_rejects_unknown_setting(capsys):
    from glm5_fastpath.cli import main

    assert main(["bench", "moe", "--out", "/tmp/unused", "--settings", "a,z"]) == 2
    assert "unknown setting" in capsys.readouterr().err
