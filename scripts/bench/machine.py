"""What the benchmark scripts record about the machine they ran on, so that the report
(scripts/bench/benchmark_report.py) can say where each figure was measured."""
from __future__ import annotations

import os
import platform


def machine(**extra) -> dict:
    """{cpu, cores, amx, ...extra}: the CPU's model name as the kernel reports it (a VM may
    report a generic one), the cores this process may use, and whether it has AMX tiles (the
    CPU device's bfloat16 kernels and torch's both use them)."""
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
              if line.startswith("model name")]
    cpu = models[0] if models else platform.processor() or platform.machine()
    return dict(cpu=cpu, cores=len(os.sched_getaffinity(0)), amx="amx_bf16" in cpuinfo, **extra)
