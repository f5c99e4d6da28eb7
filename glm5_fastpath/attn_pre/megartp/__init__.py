"""MegaRTP host side: OpGraph -> TaskGraph -> KernelPlan for the persistent attention-prefix megakernel.

    isa.py          the 128-byte instruction format and opcode table (one definition; C++ header generated)
    families.py     the op families: operand slots, payload fields, split-K reduce scope
    taskgraph.py    tiles -> tasks, pairing policies -> event counters (pairing.py: the host checks)
    scheduler.py    critical-path list scheduler, round-robin baseline, makespan estimate
    plan.py         KernelPlan: [num_sms, max_queue_len, 32] int32 + counters + OperandPtrTable (operands.py)
    validator.py    satisfiable / deadlock-free / dependency-exact checks, dump()
    interpreter.py  runs the instruction tensor on CPU with one reference solver per opcode (solvers.py)
    device.py       the persistent megakernel (csrc/megartp): PlanRunner / run_plan / MegaRtpExecutor, the
                    family-support check, error records (imports CUDA pieces lazily: fine on CPU)
    trace.py        trace builds: per-instruction timestamps -> Chrome/Perfetto JSON, critical-path summary
    bench.py        bench_megartp(): framework cost (empty plan) and per-M plan time
"""
from .interpreter import Interpreter, InterpreterDeadlock, run_plan  # noqa: F401
from .isa import Instruction, IsaError, Opcode, decode, encode, render_header  # noqa: F401
from .pairing import PairingError  # noqa: F401
from .plan import KernelPlan, build_plan, plan_from_taskgraph  # noqa: F401
from .taskgraph import PREFIX_POLICIES, TaskGraph, build_taskgraph  # noqa: F401
from .validator import PlanError, dump, validate  # noqa: F401
