"""What calls of a function leave allocated, counted from the calls' own line only.

tracemalloc traces the whole process: under pytest-xdist the worker's execnet I/O thread receives work from
the controller while a test runs, and its allocations land in the same snapshot (a fresh-clone run with
three workers saw 1.3 KiB from execnet/gateway_base.py in a 50 000-call check). So only the blocks whose
traceback passes through the calling line here are counted: everything the calls allocated, in C (attributed
to that line) or in any Python code they ran (deeper frames of the same traceback), and nothing of another
thread's. A call that allocated per call would leave thousands of blocks.
"""
from __future__ import annotations

import tracemalloc


def _call_n(fn, args, n):
    for _ in range(n):
        fn(*args)       # the counted line: CALL_LINE


CALL_LINE = _call_n.__code__.co_firstlineno + 2
FRAMES = 64             # deep enough that the calling line is in the traceback of whatever the call runs


def bytes_left_by_calls(fn, *args, n: int = 50_000, warm: int = 1000) -> tuple[int, int]:
    """(bytes, blocks) still allocated after ``n`` calls of ``fn(*args)`` (after ``warm`` untraced calls),
    counting the blocks allocated within the calls (their traceback passes through the calling line)."""
    _call_n(fn, args, warm)
    tracemalloc.start(FRAMES)
    try:
        before = tracemalloc.take_snapshot()
        _call_n(fn, args, n)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = [d for d in after.compare_to(before, "traceback")
            if any(f.filename == __file__ and f.lineno == CALL_LINE for f in d.traceback)]
    return sum(d.size_diff for d in mine), sum(d.count_diff for d in mine)
