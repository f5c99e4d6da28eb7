"""THE MegaRTP instruction format: one 128-byte instruction = 32 x int32 words.

Layout (word offsets; the C++ view is generated from these constants: csrc/megartp/isa_generated.h):

    word  0      opcode          NOOP = 0, then one per op family (families.FAMILIES order)
    word  1      spec_id         compiled specialisation of the family (plan.specs[spec_id])
    word  2      wait_count      <= MAX_WAITS
    word  3      signal_count    <= MAX_SIGNALS
    word  4      operand_row     row of the OperandPtrTable ([num_ops, 16] uint64)
    word  5      tile_index      the tile's index within its op (trace / dump / interpreter check)
    word  6      reduce_counter  split-K: counter whose last arriver runs the epilogue; -1 otherwise
    word  7      reduce_target   split-K: reduce group size (partials per epilogue); 0 otherwise
    words 8-13   waits[3]        (event_id, threshold): proceed when counter[event] >= epoch * threshold
    words 14-22  signals[3]      (event_id, increment, publication): after the outputs in the
                                 `publication` bitmask (bit i = the op's i-th graph output) are
                                 written and fenced, counter[event] += increment (release)
    words 23-31  payload[9]      family-defined (families.OpFamily.payload names), e.g. row / column /
                                 K ranges of the tile; unused words 0

Counters are monotone: the plan holds epoch-1 thresholds and the kernel of step `epoch` (1, 2, ...)
waits for epoch x threshold, so no counter is ever reset between steps (an event's producers
increment it by exactly `threshold` per step; the validator checks that). Reduce counters work the
same way: a partial is the last arriver iff atomicAdd returns epoch x target - 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import torch

from .families import FAMILIES, WORKSPACE, OpFamily

INSTR_WORDS = 32
INSTR_BYTES = 4 * INSTR_WORDS
MAX_WAITS = 3
MAX_SIGNALS = 3
WAIT_WORDS = 2  # event, threshold
SIGNAL_WORDS = 3  # event, increment, publication
PAYLOAD_WORDS = 9
OPERAND_SLOTS = 16

# header word offsets
OPCODE, SPEC_ID, WAIT_COUNT, SIGNAL_COUNT, OPERAND_ROW, TILE_INDEX, REDUCE_COUNTER, REDUCE_TARGET = range(8)
WAITS = 8
SIGNALS = WAITS + MAX_WAITS * WAIT_WORDS
PAYLOAD = SIGNALS + MAX_SIGNALS * SIGNAL_WORDS
assert PAYLOAD + PAYLOAD_WORDS == INSTR_WORDS, "instruction layout does not fill 32 words"

INT32_MAX = 2**31 - 1

Opcode = IntEnum("Opcode", [("NOOP", 0)] + [(f.name, i + 1) for i, f in enumerate(FAMILIES)])
FAMILY_BY_OPCODE: dict[int, OpFamily] = {i + 1: f for i, f in enumerate(FAMILIES)}
FAMILY_BY_NAME: dict[str, OpFamily] = {f.name: f for f in FAMILIES}


class IsaError(ValueError):
    """An instruction does not fit the format (too many waits, payload too long, value out of int32)."""


def _check_families() -> None:
    for f in FAMILIES:
        if len(f.slots) > OPERAND_SLOTS or len(set(f.slots)) != len(f.slots):
            raise IsaError(f"family {f.name}: {len(f.slots)} operand slots (max {OPERAND_SLOTS}, no repeats)")
        if len(f.payload) > PAYLOAD_WORDS:
            raise IsaError(f"family {f.name}: {len(f.payload)} payload words (max {PAYLOAD_WORDS})")
        if f.split_k and (WORKSPACE not in f.slots or f.weight is None):
            raise IsaError(f"family {f.name}: a split-K family needs a {WORKSPACE} slot and a weight")


_check_families()


@dataclass(frozen=True)
class Instruction:
    opcode: int
    spec_id: int = 0
    operand_row: int = 0
    tile_index: int = 0
    reduce_counter: int = -1
    reduce_target: int = 0
    waits: tuple[tuple[int, int], ...] = ()  # (event, threshold)
    signals: tuple[tuple[int, int, int], ...] = ()  # (event, increment, publication bitmask)
    payload: tuple[int, ...] = field(default=())

    @property
    def family(self) -> OpFamily | None:
        return FAMILY_BY_OPCODE.get(self.opcode)

    def named_payload(self) -> dict[str, int]:
        f = self.family
        return dict(zip(f.payload, self.payload)) if f is not None else {}


NOOP = Instruction(int(Opcode.NOOP))


def _int32(what: str, v: int) -> int:
    if not isinstance(v, int) or not -2**31 <= v <= INT32_MAX:
        raise IsaError(f"{what}={v!r} does not fit an int32 word")
    return v


def encode(ins: Instruction) -> list[int]:
    """-> the 32 int32 words of `ins` (raises IsaError naming the field that does not fit)."""
    if ins.opcode != Opcode.NOOP and ins.opcode not in FAMILY_BY_OPCODE:
        raise IsaError(f"unknown opcode {ins.opcode} (known: {[o.name for o in Opcode]})")
    if len(ins.waits) > MAX_WAITS:
        raise IsaError(f"opcode {Opcode(ins.opcode).name} tile {ins.tile_index}: {len(ins.waits)} waits > MAX_WAITS={MAX_WAITS}")
    if len(ins.signals) > MAX_SIGNALS:
        raise IsaError(f"opcode {Opcode(ins.opcode).name} tile {ins.tile_index}: {len(ins.signals)} signals > "
                       f"MAX_SIGNALS={MAX_SIGNALS}")
    if len(ins.payload) > PAYLOAD_WORDS:
        raise IsaError(f"opcode {Opcode(ins.opcode).name}: payload of {len(ins.payload)} words > {PAYLOAD_WORDS}")
    w = [0] * INSTR_WORDS
    w[OPCODE] = ins.opcode
    w[SPEC_ID] = _int32("spec_id", ins.spec_id)
    w[WAIT_COUNT], w[SIGNAL_COUNT] = len(ins.waits), len(ins.signals)
    w[OPERAND_ROW] = _int32("operand_row", ins.operand_row)
    w[TILE_INDEX] = _int32("tile_index", ins.tile_index)
    w[REDUCE_COUNTER] = _int32("reduce_counter", ins.reduce_counter)
    w[REDUCE_TARGET] = _int32("reduce_target", ins.reduce_target)
    for i, (ev, thr) in enumerate(ins.waits):
        if ev < 0 or thr < 1:
            raise IsaError(f"wait {i} (event {ev}, threshold {thr}): event must be >= 0 and threshold >= 1")
        w[WAITS + WAIT_WORDS * i: WAITS + WAIT_WORDS * (i + 1)] = [_int32("event", ev), _int32("threshold", thr)]
    for i, (ev, inc, pub) in enumerate(ins.signals):
        if ev < 0 or inc < 1:
            raise IsaError(f"signal {i} (event {ev}, increment {inc}): event must be >= 0 and increment >= 1")
        w[SIGNALS + SIGNAL_WORDS * i: SIGNALS + SIGNAL_WORDS * (i + 1)] = [
            _int32("event", ev), _int32("increment", inc), _int32("publication", pub)]
    for i, v in enumerate(ins.payload):
        w[PAYLOAD + i] = _int32(f"payload[{i}]", v)
    return w


def decode(words) -> Instruction:
    """32 int32 words (list or 1-D tensor) -> Instruction. Inverse of encode (payload keeps the family's length)."""
    w = [int(x) for x in (words.tolist() if isinstance(words, torch.Tensor) else words)]
    if len(w) != INSTR_WORDS:
        raise IsaError(f"an instruction is {INSTR_WORDS} words, got {len(w)}")
    op = w[OPCODE]
    if op != Opcode.NOOP and op not in FAMILY_BY_OPCODE:
        raise IsaError(f"unknown opcode {op}")
    nw, ns = w[WAIT_COUNT], w[SIGNAL_COUNT]
    if not (0 <= nw <= MAX_WAITS and 0 <= ns <= MAX_SIGNALS):
        raise IsaError(f"wait_count={nw} / signal_count={ns} outside [0, {MAX_WAITS}] / [0, {MAX_SIGNALS}]")
    fam = FAMILY_BY_OPCODE.get(op)
    n_payload = len(fam.payload) if fam is not None else 0
    return Instruction(
        opcode=op, spec_id=w[SPEC_ID], operand_row=w[OPERAND_ROW], tile_index=w[TILE_INDEX],
        reduce_counter=w[REDUCE_COUNTER], reduce_target=w[REDUCE_TARGET],
        waits=tuple((w[WAITS + 2 * i], w[WAITS + 2 * i + 1]) for i in range(nw)),
        signals=tuple(tuple(w[SIGNALS + 3 * i: SIGNALS + 3 * i + 3]) for i in range(ns)),
        payload=tuple(w[PAYLOAD: PAYLOAD + n_payload]))


# ---- C++ header ----------------------------------------------------------------------------------------

HEADER_PATH = Path(__file__).resolve().parents[3] / "csrc" / "megartp" / "isa_generated.h"


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def render_header() -> str:
    """The C++ view of this module (constexpr offsets, opcode enum, per-family slots and payload words)."""
    L = ["// GENERATED by glm5_fastpath/attn_pre/megartp/isa.py (render_header). Do not edit by hand:",
         "//   python -m glm5_fastpath.attn_pre.megartp.isa --write",
         "// tests/attn_pre/megartp/test_megartp_isa.py fails when this file and the Python definition differ.",
         "#pragma once", "#include <cstdint>", "", "namespace glm5_fastpath {", "namespace megartp {", ""]
    consts = [("kInstrWords", INSTR_WORDS), ("kInstrBytes", INSTR_BYTES), ("kMaxWaits", MAX_WAITS),
              ("kMaxSignals", MAX_SIGNALS), ("kWaitWords", WAIT_WORDS), ("kSignalWords", SIGNAL_WORDS),
              ("kPayloadWords", PAYLOAD_WORDS), ("kOperandSlots", OPERAND_SLOTS),
              ("kOpcode", OPCODE), ("kSpecId", SPEC_ID), ("kWaitCount", WAIT_COUNT), ("kSignalCount", SIGNAL_COUNT),
              ("kOperandRow", OPERAND_ROW), ("kTileIndex", TILE_INDEX), ("kReduceCounter", REDUCE_COUNTER),
              ("kReduceTarget", REDUCE_TARGET), ("kWaits", WAITS), ("kSignals", SIGNALS), ("kPayload", PAYLOAD)]
    L += [f"constexpr int {n} = {v};" for n, v in consts]
    L += ["", "enum class Opcode : int32_t {"] + [f"  {o.name} = {int(o)}," for o in Opcode] + ["};",
          f"constexpr int kNumOpcodes = {len(Opcode)};", ""]
    L += ["// One instruction as the kernel reads it (128 B, 16-B aligned for vector loads).",
          "struct alignas(16) Instruction {", "  int32_t w[kInstrWords];",
          "  __host__ __device__ int32_t opcode() const { return w[kOpcode]; }",
          "  __host__ __device__ int32_t wait_event(int i) const { return w[kWaits + kWaitWords * i]; }",
          "  __host__ __device__ int32_t wait_threshold(int i) const { return w[kWaits + kWaitWords * i + 1]; }",
          "  __host__ __device__ int32_t signal_event(int i) const { return w[kSignals + kSignalWords * i]; }",
          "  __host__ __device__ int32_t signal_increment(int i) const { return w[kSignals + kSignalWords * i + 1]; }",
          "  __host__ __device__ int32_t signal_publication(int i) const { return w[kSignals + kSignalWords * i + 2]; }",
          "  __host__ __device__ int32_t payload(int i) const { return w[kPayload + i]; }", "};",
          "static_assert(sizeof(Instruction) == kInstrBytes, \"instruction must be 128 B\");",
          "static_assert(kInstrBytes == 4 * kInstrWords, \"32 int32 words\");",
          "static_assert(kPayload + kPayloadWords == kInstrWords, \"layout fills the instruction\");",
          "static_assert(kSignals == kWaits + kMaxWaits * kWaitWords, \"waits precede signals\");",
          "static_assert(kPayload == kSignals + kMaxSignals * kSignalWords, \"signals precede payload\");", ""]
    for f in FAMILIES:
        L.append(f"// {f.name}: {f.doc}" + (f" (split-K, reduce scope {f.reduce_scope})" if f.split_k else ""))
        L.append(f"namespace {f.name} {{")
        L.append(f"constexpr Opcode kOpcode = Opcode::{f.name};")
        L.append(f"constexpr bool kSplitK = {'true' if f.split_k else 'false'};")
        L.append("namespace slot {  // OperandPtrTable column of each operand")
        L += [f"constexpr int {_ident(s)} = {i};  // {s}" for i, s in enumerate(f.slots)]
        L.append("}  // namespace slot")
        L.append("namespace payload {  // instruction word of each payload field")
        L += [f"constexpr int {_ident(p)} = kPayload + {i};" for i, p in enumerate(f.payload)]
        L.append("}  // namespace payload")
        L.append(f"static_assert({len(f.slots)} <= kOperandSlots && {len(f.payload)} <= kPayloadWords, \"{f.name} fits\");")
        L.append(f"}}  // namespace {f.name}")
        L.append("")
    L += ["}  // namespace megartp", "}  // namespace glm5_fastpath", ""]
    return "\n".join(L)


def write_header(path: Path = HEADER_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_header())
    return path


if __name__ == "__main__":
    import sys
    if "--write" in sys.argv:
        print(f"wrote {write_header()}")
    else:
        sys.stdout.write(render_header())
