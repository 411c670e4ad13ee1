"""How benchmark_host_cost.py times a call: its whole call, the delay to its first kernel's
submission (with its kernels run or only submitted), on the XPU path through the queue-handle
seam, the reads of the cache's values it waits for; rounds of callables interleaved."""
from __future__ import annotations

import time

from benchmark_sdpa import median_seconds

from ipex_flash._runtime import C
from ipex_flash.ops import launch, launch_plans


def interleaved(fns: dict, rounds: int, repeats: int, warmup: int,
                measure=median_seconds) -> dict:
    """The best of `rounds` rounds of measure(fn, repeats, warmup) for each of fns, the rounds
    interleaved."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], measure(fn, repeats, warmup))
    return best


def submission_delay_alone(fn, repeats: int, warmup: int) -> float:
    """submission_delay with the kernels submitted but not run."""
    skipped = C.skip_kernels(True)
    try:
        return submission_delay(fn, repeats, warmup)
    finally:
        C.skip_kernels(skipped)


def on_xpu_path(measure):
    """measure(fn, repeats, warmup) with calls on the XPU path (the queue-handle seam)."""
    def measured(fn, repeats: int, warmup: int):
        handle = C.cpu_queue_handle()
        saved = launch.queue_handle, launch_plans.reads_host_memory
        launch.queue_handle = lambda device: handle
        launch_plans.reads_host_memory = lambda device: False
        try:
            return measure(fn, repeats, warmup)
        finally:
            launch.queue_handle, launch_plans.reads_host_memory = saved
    return measured


def whole_call_alone(fn, repeats: int, warmup: int) -> float:
    """Median seconds of fn's whole call, its kernels submitted but not run."""
    skipped = C.skip_kernels(True)
    try:
        return median_seconds(fn, repeats, warmup)
    finally:
        C.skip_kernels(skipped)


def waits_per_call(fn, repeats: int, warmup: int) -> float:
    """Reads of the cache's values the host waited for, per call."""
    for _ in range(warmup):
        fn()
    before = C.cache_value_reads()
    for _ in range(repeats):
        fn()
    return (C.cache_value_reads() - before) / repeats


def submission_delay(fn, repeats: int, warmup: int, before=None) -> float:
    """Median seconds from calling fn to its first kernel's submission; before(), when given,
    is called (untimed) before each call."""
    for _ in range(warmup):
        fn()
    delays = []
    for _ in range(repeats):
        if before is not None:
            before()
        C.take_first_submission_ns()
        start = time.perf_counter_ns()
        fn()
        delays.append(C.take_first_submission_ns() - start)
    return 1e-9 * sorted(delays)[len(delays) // 2]
