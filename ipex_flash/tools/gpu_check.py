"""python -m ipex_flash gpu-check: the native code every Intel GPU would run, without a GPU.

For each target (a named GPU profile, sycl_src/host/variants/gpu_profiles.cpp) it asks the host
module which kernel variants that GPU would build for a grid of calls reaching every kernel, has our
own kernel-compiler path write their SPIR-V, compiles it with Intel's offline compiler (ocloc,
with IGC; scripts/setup/install_ocloc.sh) for that GPU, and reads the result: SIMD width, registers,
local memory, spills, private (scratch) memory, DPAS instructions. Then it applies the rules
(gpu_rules.py) and prints a table; --json keeps every figure.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ipex_flash._runtime import C
from ipex_flash.tools import gpu_bandwidth, gpu_grid, gpu_native, gpu_spirv
from ipex_flash.tools.gpu_rules import check_rules

DEFAULT_TARGETS = ["pvc", "bmg", "dg2", "lnl", "mtl", "arl-h"]


@dataclass
class KernelReport(gpu_grid.Selection):
    """One kernel of one variant, compiled for one target."""
    kernel: str = ""
    built: bool = False
    error: str = ""
    simd: int = 0
    grf: int = 0
    slm: int = 0
    spill: int = 0
    private: int = 0
    dpas: int = 0
    instructions: int = 0
    dpas_share: float = 0.0
    loop_dpas: int = 0           # DPAS in the main loop (gpu_native._asm_counts)
    loop_instructions: int = 0   # all instructions of that loop
    loop_dpas_share: float = 0.0
    # The main loop's issued instructions (sync.* left out) per DPAS, in the kernel as shipped:
    # the register kernels' lean loop, which runs the fully visible blocks with dropout off
    # and holds neither the mask's nor dropout's code (run_blocks, score/block_mask.hpp);
    # loop_per_dpas_edge: their general loop's, which runs the blocks the mask cuts through
    # and every block under dropout (0: the kernel has one loop over blocks, the mask's code
    # in it). loop_nested > 0: loops inside the main loop, counted once (a lower bound).
    # A block whose max does not rise skips O's rescale (the register forward's): the figure
    # leaves that branch out, as the yardstick's fully visible block leaves out the branches it
    # does not take; loop_rescale_per_dpas is the branch's own, paid by blocks that take it.
    loop_per_dpas: float = 0.0
    loop_rescale_per_dpas: float = 0.0
    loop_per_dpas_edge: float = 0.0
    loop_nested: int = 0
    loop_block_loads: int = 0   # 2-D block loads in that loop, and prefetches
    loop_prefetches: int = 0
    loop_spills: int = 0        # spill and fill accesses in that loop
    edge_spills: int = 0        # and in the costliest general loop
    # Decode kernels (gpu_bandwidth.py): the loop over key blocks' issued instructions and the
    # loops nested in it (counted once: a lower bound where there are any), the KiB of one K/V
    # head's block, the instructions per KiB, and what the target affords per KiB.
    block_issued: int = 0
    block_nested: int = 0
    kv_kib: float = 0.0
    issued_per_kib: float = 0.0
    affordable_per_kib: float = 0.0
    violations: list = field(default_factory=list)


def _module_id(header: str, kernels: list, options: list) -> str:
    text = "\n".join([header, *kernels, *options])
    return Path(header).stem + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def group_modules(programs: list) -> dict:
    """One module per program, holding its kernels as the runtime builds them (the kernel
    compiler builds each program on its own): IGC's choices for a kernel (how much it inlines,
    and so its registers) depend on what else its module holds. Modules of every kernel of a
    header on a target hid spills of 3.7-6 KiB in one-row decode kernels on DG2 that build on
    their own. Identical programs of different targets share their SPIR-V."""
    modules = {}
    for p in programs:
        if p.error:
            continue
        names = list(p.kernels)
        module_id = _module_id(p.header, names, list(p.options))
        modules[module_id] = (p.header, names, list(p.options))
        p.module = module_id
    return modules


def kernel_reports(programs: list, native: dict) -> list:
    """One KernelReport per kernel a target builds (the first call that selected it), and one
    per call the host refused to plan."""
    reports, seen = [], set()
    for p in programs:
        base = p.selection()
        if p.error:
            reports.append(KernelReport(kernel=p.family, error=p.error, **base))
            continue
        result = native[(p.target, p.module)]
        by_key = {gpu_grid.mangled_key(name): figures
                  for name, figures in result.get("kernels", {}).items()}
        for kernel in p.kernels:
            if (p.target, kernel) in seen:
                continue
            seen.add((p.target, kernel))
            report = KernelReport(kernel=kernel, **base)
            figures = by_key.get(gpu_grid.registered_key(kernel))
            if figures is None:
                report.error = result.get("error", "kernel missing from the binary")
            else:
                report.built = True
                for name in ("simd", "grf", "slm", "spill", "private", "dpas", "instructions",
                             "loop_dpas", "loop_instructions"):
                    setattr(report, name, figures[name])
                report.dpas_share = figures["dpas"] / max(figures["instructions"], 1)
                report.loop_dpas_share = figures["loop_dpas"] / max(figures["loop_instructions"], 1)
                if figures["loop_dpas"]:
                    report.loop_per_dpas = round(figures["loop_issued"] / figures["loop_dpas"], 2)
                    report.loop_rescale_per_dpas = round(
                        figures["loop_rescale"] / figures["loop_dpas"], 2)
                    report.loop_nested = figures["loop_nested"]
                    report.loop_block_loads = figures["loop_block_loads"]
                    report.loop_prefetches = figures["loop_prefetches"]
                    report.loop_spills = figures["loop_spills"]
                report.block_issued = figures["block_issued"]
                report.block_nested = figures["block_nested"]
                if figures["edge_dpas"]:
                    report.edge_spills = figures["edge_spills"]
                    report.loop_per_dpas_edge = round(
                        figures["edge_issued"] / figures["edge_dpas"], 2)
            reports.append(report)
    return reports


def run(targets: list, full: bool = False, json_path: str | None = None,
        spirv_dir: str | None = None, jobs: int = 2, families=None, dtypes=None) -> int:
    """Checks `targets` (the grid's calls of `families` and `dtypes` only, when given);
    returns 0 when every rule holds, 1 otherwise, 2 without ocloc or without calls to check."""
    start = time.perf_counter()
    programs = [p for target in targets
                for p in gpu_grid.plan_target(target, full, families, dtypes)]
    if not programs:  # e.g. float16, which only the --full grid holds
        print(f"gpu-check: the {'full' if full else 'quick'} grid has no calls of families "
              f"{families or 'any'} in dtypes {dtypes or 'any'}", file=sys.stderr)
        return 2
    ocloc = gpu_native.find_ocloc()
    if ocloc is None:
        print("gpu-check: ocloc not found; install it with scripts/setup/install_ocloc.sh "
              "(or name it in IPEX_FLASH_OCLOC)", file=sys.stderr)
        return 2
    # ocloc's binaries and disassembly go to `work`; the SPIR-V to the store kept between runs
    # (gpu_spirv.py), or to `work` too when the caller names it.
    work = Path(spirv_dir) if spirv_dir else Path(tempfile.mkdtemp(prefix="ipex_flash_gpu_"))
    work.mkdir(parents=True, exist_ok=True)
    modules = group_modules(programs)
    try:
        store = work if spirv_dir else gpu_spirv.kept_store()
    except OSError:  # an unwritable cache directory: this run's SPIR-V is not kept
        store = work
    gpu_spirv.build(modules, store, jobs)
    pairs = sorted({(p.target, p.module) for p in programs if not p.error})

    def compile_pair(pair):
        target, module_id = pair
        return pair, gpu_native.compile_module(ocloc, store, module_id,
                                               gpu_grid.ocloc_device(target),
                                               work / f"{module_id}.{target}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        native = dict(pool.map(compile_pair, pairs))
    reports = kernel_reports(programs, native)
    limits = {t: C.profile_limits(t) for t in targets}
    for r in reports:
        gpu_bandwidth.measure(r, limits[r.target])
    check_rules(reports)
    seconds = time.perf_counter() - start
    failed = [r for r in reports if r.violations]
    gpu_native.print_table(reports)
    gpu_bandwidth.print_decode_table(reports)
    print(f"\n{len(reports)} kernels over {len(targets)} targets ({', '.join(targets)}) in "
          f"{seconds:.0f} s: {len(failed)} break a rule")
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"targets": targets, "full": full, "families": families, "dtypes": dtypes,
             "seconds": round(seconds, 1),
             "ocloc": gpu_native.ocloc_version(ocloc),
             "limits": limits,
             "kernels": [asdict(r) for r in reports]}, indent=1))
    if not spirv_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help="comma-separated GPU profiles (default: all six)")
    parser.add_argument("--full", action="store_true",
                        help="every head-dim bucket and feature combination (slower)")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--spirv-dir",
                        help="build SPIR-V, binaries and disassembly here (default: SPIR-V kept "
                             "in the kernel cache directory, the rest in a temporary one)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="kernel-compiler and ocloc processes at once")
    parser.add_argument("--families", type=_names(gpu_grid.FAMILIES),
                        help="comma-separated kernel families to check (default: all of "
                             f"{', '.join(gpu_grid.FAMILIES)})")
    parser.add_argument("--dtypes", type=_names(gpu_grid.DTYPES),
                        help="comma-separated query dtypes to check (default: all of "
                             f"{', '.join(gpu_grid.DTYPES)}, float16 in the --full grid "
                             "only; the KV-cache append into FP8 caches is checked only "
                             "without this filter)")


def _names(known: list):
    """An argparse type: a comma-separated subset of `known`."""
    def parse(text: str) -> list:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"expected some of {', '.join(known)}, got {text!r}")
        return names
    return parse


def main(args) -> int:
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in C.profile_names()]
    if unknown:
        print(f"gpu-check: unknown targets {unknown}; known: {C.profile_names()}",
              file=sys.stderr)
        return 2
    return run(targets, args.full, args.json, args.spirv_dir, args.jobs, args.families,
               args.dtypes)
