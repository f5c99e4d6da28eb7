"""The instruction format: encode/decode round trip, limits, and the generated C++ header never drifts."""
import shutil
import subprocess

import pytest
import torch

from glm5_fastpath.attn_pre.megartp import isa
from glm5_fastpath.attn_pre.megartp.families import FAMILIES
from glm5_fastpath.attn_pre.megartp.isa import Instruction, IsaError, Opcode, decode, encode


def test_opcodes_are_the_registered_families():
    assert [o.name for o in Opcode] == ["NOOP"] + [f.name for f in FAMILIES]
    assert [f.name for f in FAMILIES] == ["A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"]
    assert isa.INSTR_BYTES == 128 and isa.PAYLOAD + isa.PAYLOAD_WORDS == 32


def test_encode_decode_round_trip():
    ins = Instruction(int(Opcode.B0), spec_id=3, operand_row=1, tile_index=83, reduce_counter=75, reduce_target=84,
                      waits=((0, 16),), signals=((2, 1, 0b11110), (4, 1, 0b10000)),
                      payload=(0, 16, 2560, 2624, 4608, 6144, 3, 0, 2624))
    words = encode(ins)
    assert len(words) == 32 and words[isa.OPCODE] == int(Opcode.B0) and words[isa.WAIT_COUNT] == 1
    assert decode(words) == ins
    assert decode(torch.tensor(words, dtype=torch.int32)) == ins
    assert decode(encode(isa.NOOP)) == isa.NOOP
    assert ins.named_payload()["k_split"] == 3


@pytest.mark.parametrize("bad,match", [
    (dict(waits=((0, 1),) * 4), "MAX_WAITS"),
    (dict(signals=((0, 1, 0),) * 4), "MAX_SIGNALS"),
    (dict(payload=tuple(range(10))), "payload"),
    (dict(waits=((0, 0),)), "threshold >= 1"),
    (dict(tile_index=2**31), "int32"),
])
def test_limits_raise_clear_errors(bad, match):
    with pytest.raises(IsaError, match=match):
        encode(Instruction(int(Opcode.A0), **bad))
    with pytest.raises(IsaError, match="unknown opcode"):
        decode([99] + [0] * 31)


def test_committed_header_equals_generated():
    assert isa.HEADER_PATH.exists(), f"{isa.HEADER_PATH} missing: python -m glm5_fastpath.attn_pre.megartp.isa --write"
    assert isa.HEADER_PATH.read_text() == isa.render_header(), \
        "csrc/megartp/isa_generated.h drifted from isa.py: python -m glm5_fastpath.attn_pre.megartp.isa --write"


def test_header_compiles_for_sm90a(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    cu = tmp_path / "use_isa.cu"
    cu.write_text('#include "isa_generated.h"\nusing namespace glm5_fastpath::megartp;\n'
                  'static_assert(B0::payload::k_split == kPayload + 6, "payload word");\n'
                  '__global__ void k(const Instruction* p, int* o) {\n'
                  '  o[0] = p[0].opcode() == int(Opcode::E1) ? p[0].payload(E1::payload::kv1 - kPayload) : 0; }\n')
    r = subprocess.run([nvcc, "-x", "cu", "-arch=sm_90a", "-I", str(isa.HEADER_PATH.parent), "-c", str(cu),
                        "-o", str(tmp_path / "use_isa.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
