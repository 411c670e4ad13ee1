"""What the distributed benchmarks (benchmark_distributed.py, benchmark_ring_probes.py) share:
ranks spawned on this machine, joined by gloo over loopback with one torch thread each, each
running a task and sending back its result; and a call's peak resident memory on a rank."""
from __future__ import annotations

import datetime
import os
import re
import tempfile

import torch
import torch.distributed as dist


def _serve(rank, world, init_file, task, args, results):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    try:
        results.put((rank, task(rank, world, args)))
    finally:
        dist.destroy_process_group()


def run_world(world: int, task, args, timeout: float) -> list:
    """task(rank, world, args) (a module-level function) on `world` spawned ranks: their
    results in rank order, each waited for at most `timeout` seconds."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=_serve, args=(r, world, os.path.join(tmp, "init"), task,
                                                      args, results)) for r in range(world)]
        for proc in procs:
            proc.start()
        answers = dict(results.get(timeout=timeout) for _ in range(world))
        for proc in procs:
            proc.join()
    return [answers[r] for r in range(world)]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def peak_during(fn) -> int:
    """Bytes of resident memory at the peak of fn() above the resident set before it."""
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (the peak resident set) to the current one
    fn()
    return 1024 * (_status_kib("VmHWM") - before)
