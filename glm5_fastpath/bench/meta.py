"""Run metadata every committed result carries: GPU, date, commit, software versions."""
from __future__ import annotations

import datetime as _dt
import os
import subprocess
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """HEAD of the checkout (+"-dirty"); GLM5_FASTPATH_COMMIT wins, for copies without .git (a lent GPU machine)."""
    env = os.environ.get("GLM5_FASTPATH_COMMIT")
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0 or not sha.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
