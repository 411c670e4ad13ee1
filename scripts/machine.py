"""What the benchmark scripts record about the machine they ran on, so that the report
(scripts/benchmark_report.py) can say where each figure was measured."""
from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (a VM may report a generic one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(**extra) -> dict:
    """{cpu, cores, amx, ...extra}: the CPU, the cores this process may use, and whether it
    has AMX tiles (the CPU device's bfloat16 kernels and torch's both use them)."""
    try:
        with open("/proc/cpuinfo") as f:
            amx = "amx_bf16" in f.read()
    except OSError:
        amx = False
    return dict(cpu=cpu_model(), cores=len(os.sched_getaffinity(0)), amx=amx, **extra)
