"""Per-bucket selection table: which prefix executor and MoE config serve decode steps of M tokens.

One JSON file per GPU model; shipped defaults live in glm5_fastpath/configs/selection/ and a user file
is passed with `--glm5-fastpath-config PATH` (env GLM5_FASTPATH_CONFIG). Format (strict: unknown keys
are errors, so a typo never silently falls back to a default):

    {
      "version": 1,
      "gpu": ["H200"],                   # substrings of torch.cuda.get_device_name() this table is for
      "comment": "free text",            # optional
      "buckets": [                       # strictly increasing "tokens"
        {"tokens": 1,  "prefix": "stock", "moe": "stock"},
        {"tokens": 16, "prefix": "cmp",   "moe": "megamoe", "cmp_mode": "multistream"},
        ...
      ]
    }

prefix: one of PREFIX_EXECUTORS (cmp | megartp | stock). moe: "stock", "megamoe" (MegaMoE with its default
config for the bucket) or "megamoe:<config name>" (MegaMoEConfig.name, e.g. megamoe:bn16_s6_g512_w4).
cmp_mode (optional, default "full"): the CMP executor's mode for this bucket (attn_pre/cmp/modes.py:
serial | serial_pdl | multistream | multistream_pdl_entry | multistream_pdl_prologue | full, or a composite such
as full+pin:D1=0); the mode that measured fastest in `glm5-fastpath tune` (PDL does not win at every bucket).
A decode step of M tokens uses the smallest bucket with tokens >= M; above the largest bucket the
step stays on SGLang's path (reason "above_largest_bucket"). The choice is made on the host from the
batch size, so each captured decode CUDA graph bakes exactly one bucket.

The shipped defaults map every bucket to "stock" until the plugin routes to our executors; a table
measured on your GPU comes from `glm5-fastpath tune --out table.json` (glm5_fastpath/tune.py). Naming an
executor the plugin cannot run yet is valid and is reported at install ("executor not built yet").
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX_EXECUTORS = ("cmp", "megartp", "stock")
STOCK = "stock"
MOE_CONFIG_RE = re.compile(r"^megamoe(:[A-Za-z0-9_.\-]+)?$")  # "megamoe" = MegaMoE's default config per bucket
SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "configs" / "selection"
DEFAULT_TABLE = "default.json"

_TOP_KEYS = {"version", "gpu", "comment", "buckets"}
_ENTRY_KEYS = {"tokens", "prefix", "moe", "cmp_mode"}
_REQUIRED_ENTRY_KEYS = {"tokens", "prefix", "moe"}
DEFAULT_CMP_MODE = "full"
# attn_pre/cmp/modes.MODES (not imported: this module stays import-light for the plugin's register())
CMP_MODES = ("serial", "serial_pdl", "multistream", "multistream_pdl_entry", "multistream_pdl_prologue", "full",
             "full_prio_index", "full_prio_b1")


# composites (modes.get_mode): a named mode + modifiers, e.g. "full+pin:D1=0"; the same grammar, checked here without
# importing the executor (tests/attn_pre/cmp/test_cmp_modes.py keeps the two in step)
_OP = r"[A-Z][A-Z0-9]*"
_FRACTION = r"0*(1(\.0*)?|\.\d*[1-9]\d*)"  # a decimal in (0, 1]: what get_mode parses and Mode accepts
_CMP_MOD = rf"(after:{_OP}>{_OP}|cap:{_OP}=\d+|stages:{_OP}=\d+|pin:{_OP}=\d+|prio:{_OP}(/{_OP})*|l2:{_OP}={_FRACTION})"
CMP_MODE_RE = re.compile(rf"^({'|'.join(CMP_MODES)})(\+{_CMP_MOD})*$")


def valid_cmp_mode(mode: object) -> bool:
    """A named CMP mode or a composite of one (attn_pre/cmp/modes.py)."""
    return isinstance(mode, str) and CMP_MODE_RE.match(mode) is not None


class SelectionError(ValueError):
    """A selection table is malformed; the message names the file and the offending key."""


@dataclass(frozen=True)
class BucketChoice:
    tokens: int  # bucket upper bound (inclusive)
    prefix: str
    moe: str
    cmp_mode: str = DEFAULT_CMP_MODE  # used when prefix == "cmp"


@dataclass(frozen=True)
class Lookup:
    """Result of looking up M: `choice` is None when M is outside the table, with `reason` saying why."""

    m: int
    choice: BucketChoice | None
    reason: str  # "ok" | "above_largest_bucket" | "empty_batch"


@dataclass(frozen=True)
class SelectionTable:
    buckets: tuple[BucketChoice, ...]
    gpu: tuple[str, ...] = ()
    source: str = "<dict>"
    comment: str = ""

    @property
    def largest(self) -> int:
        return self.buckets[-1].tokens

    def lookup(self, m: int) -> Lookup:
        if m <= 0:
            return Lookup(m, None, "empty_batch")
        for b in self.buckets:  # <= 16 entries: a scan beats bisect bookkeeping
            if b.tokens >= m:
                return Lookup(m, b, "ok")
        return Lookup(m, None, "above_largest_bucket")

    def matches_gpu(self, gpu_name: str | None) -> bool:
        return bool(gpu_name) and any(s.lower() in gpu_name.lower() for s in self.gpu)

    def to_dict(self) -> dict[str, Any]:
        return {"version": SCHEMA_VERSION, "gpu": list(self.gpu), "comment": self.comment,
                "buckets": [{"tokens": b.tokens, "prefix": b.prefix, "moe": b.moe,
                             **({"cmp_mode": b.cmp_mode} if b.cmp_mode != DEFAULT_CMP_MODE else {})}
                            for b in self.buckets]}


def _err(source: str, key: str, msg: str) -> SelectionError:
    return SelectionError(f"{source}: {key}: {msg}")


def parse(d: Any, source: str = "<dict>") -> SelectionTable:
    """Validate a decoded JSON document; every error names `source` and the JSON key path."""
    if not isinstance(d, dict):
        raise _err(source, "<top level>", f"must be a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - _TOP_KEYS)
    if unknown:
        raise _err(source, unknown[0], f"unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    if d.get("version") != SCHEMA_VERSION:
        raise _err(source, "version", f"must be {SCHEMA_VERSION}, got {d.get('version')!r}")
    gpu = d.get("gpu", [])
    if not isinstance(gpu, list) or not all(isinstance(g, str) and g for g in gpu):
        raise _err(source, "gpu", "must be a list of non-empty strings (substrings of the GPU name)")
    comment = d.get("comment", "")
    if not isinstance(comment, str):
        raise _err(source, "comment", "must be a string")
    raw = d.get("buckets")
    if not isinstance(raw, list) or not raw:
        raise _err(source, "buckets", "must be a non-empty list of {tokens, prefix, moe} objects")
    out: list[BucketChoice] = []
    for i, e in enumerate(raw):
        where = f"buckets[{i}]"
        if not isinstance(e, dict):
            raise _err(source, where, f"must be an object, got {type(e).__name__}")
        unknown = sorted(set(e) - _ENTRY_KEYS)
        if unknown:
            raise _err(source, f"{where}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(_ENTRY_KEYS))})")
        for k in sorted(_REQUIRED_ENTRY_KEYS - set(e)):
            raise _err(source, f"{where}.{k}", "missing")
        t = e["tokens"]
        if isinstance(t, bool) or not isinstance(t, int) or t <= 0:
            raise _err(source, f"{where}.tokens", f"must be a positive integer, got {t!r}")
        if out and t <= out[-1].tokens:
            raise _err(source, f"{where}.tokens", f"buckets must be strictly increasing ({t} after {out[-1].tokens})")
        if e["prefix"] not in PREFIX_EXECUTORS:
            raise _err(source, f"{where}.prefix", f"unknown executor {e['prefix']!r} (choose {' | '.join(PREFIX_EXECUTORS)})")
        moe = e["moe"]
        if not isinstance(moe, str) or not (moe == STOCK or MOE_CONFIG_RE.match(moe)):
            raise _err(source, f"{where}.moe", f"unknown MoE config {moe!r} (use 'stock' or 'megamoe:<config name>')")
        cmp_mode = e.get("cmp_mode", DEFAULT_CMP_MODE)
        if not valid_cmp_mode(cmp_mode):
            raise _err(source, f"{where}.cmp_mode", f"unknown CMP mode {cmp_mode!r} (choose {' | '.join(CMP_MODES)}, "
                                                    "optionally + after:X>Y / cap:OP=N / stages:OP=N / pin:OP=S / "
                                                    "prio:A/B / l2:OP=F)")
        out.append(BucketChoice(t, e["prefix"], moe, cmp_mode))
    return SelectionTable(tuple(out), tuple(gpu), source, comment)


def load(path: str | os.PathLike) -> SelectionTable:
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SelectionError(f"{p}: no such selection table") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise SelectionError(f"{p}: not valid JSON: {e}") from None
    return parse(d, p)


def shipped_tables() -> list[SelectionTable]:
    return [load(p) for p in sorted(SHIPPED_DIR.glob("*.json"))]


def default_for_gpu(gpu_name: str | None) -> SelectionTable:
    """The shipped table whose `gpu` list matches `gpu_name`, else default.json."""
    for t in shipped_tables():
        if t.matches_gpu(gpu_name):
            return t
    return load(SHIPPED_DIR / DEFAULT_TABLE)


def resolve(gpu_name: str | None, override: str | os.PathLike | None = None) -> SelectionTable:
    """The table to use: `override` (a user file; errors are fatal) or the shipped default for the GPU."""
    if override:
        return load(override)
    return default_for_gpu(gpu_name)
