"""CMP: the whole attention prefix as one CUDA graph per token bucket, with its independent branches on
separate streams and Programmatic Dependent Launch (design article section 7).

    modes.py     execution modes (serial / multistream / + PDL at entry, after prologue, after prefetch)
                 and where each kernel waits
    streams.py   op -> stream assignment from the graph's branches, the explicit launch schedule
    staging.py   static per-bucket step inputs, bucket choice, padding rows
    executor.py  CmpExecutor: capture per bucket, run(), rebind()
    bench.py     bench_prefix(): modes vs the stock sequence, floors, decomposition, timeline
"""
from .modes import DECOMPOSITION, MODES, NATIVE_WAIT_POINTS, WAIT_POINTS, Mode, get_mode, resolve_wait_points  # noqa: F401
from .streams import Launch, Schedule, ScheduleError, assign_streams, build_schedule, check_exclusive  # noqa: F401
