"""The README's promises stay true: its env-var table is the code's, its commands exist, CI runs its test command."""
import re
from pathlib import Path

import glm5_fastpath.jit.env as jit_env
from glm5_fastpath.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _table(text: str) -> list[str]:
    start = text.index("| Variable")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line.strip())
    return lines


def test_env_table_matches_code():
    assert _table(README) == _table(jit_env.__doc__)
    for name in re.findall(r"`(GLM5_FASTPATH_[A-Z0-9_]+)`", jit_env.__doc__):
        assert name in README


def test_two_commands_and_ci():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert blocks[0].strip() == "pip install -e '.[dev]' && glm5-fastpath demo"
    assert blocks[1].strip() == "python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pytest -q" in ci


def test_documented_subcommands_exist():
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for cmd in re.findall(r"`glm5-fastpath ([a-z-]+)", README):
        assert cmd in sub, cmd
