"""The decode kernel against each GPU's memory bandwidth (gpu-check; docs/gpus.md).

Decode reads every K/V element of the cache once and does little arithmetic on it, so it is
fast when the GPU's memory never waits on the kernel's instructions. A GPU issues
`compute_units * clock * min(1, vector_lanes / simd)` instructions per second (one per vector
engine and clock, or one per two clocks where a SIMD16 instruction takes two passes of an
8-lane ALU), and its memory delivers `memory_gb_per_s` of data; their ratio is what it can
afford per KiB of K/V read (`affordable_per_kib`). The rule: the decode kernel's loop over key
blocks issues at most half of that per KiB it reads (`BANDWIDTH_SHARE`), leaving the other half
for latency the loop does not hide.

The loop's instructions are gpu_native's static count of the decode kernel's loop over key
blocks (the outermost loop with the most instructions), times the work-group's sub-groups where
the register form splits a block between several (each runs the loop), per KiB of one K/V
head's block: that
block's keys times the K and V columns times the cache's element size, a shared latent cache
(MLA's: V the first columns of K) read once. Loops nested in it (over the work-group's heads,
the block's steps, the P.V keys) are counted once, so where it has any the figure is a lower
bound: a loop found over the limit is over it, one found under it is not known to be under.
"""
from __future__ import annotations

from ipex_flash.tools import gpu_grid
from ipex_flash.tools.gpu_native import short_kernel

BANDWIDTH_SHARE = 0.5  # of what a GPU can afford per KiB, the decode loop may issue
DECODE_SLM_BYTES = 32 * 1024  # the local memory a decode work-group may use
_FP8_CACHE = 64 | 128  # FEATURE_KV_E4M3, FEATURE_KV_E5M2 (common/features.hpp)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def affordable_per_kib(limits: dict, simd: int) -> float:
    """Instructions a GPU profile (C.profile_limits) can issue per KiB its memory delivers,
    for a kernel of `simd` lanes per instruction; 0 without the profile's figures."""
    if not (limits.get("clock_mhz") and limits.get("memory_gb_per_s") and simd):
        return 0.0
    issue_per_clock = min(1.0, limits["vector_lanes"] / simd)
    per_second = limits["compute_units"] * limits["clock_mhz"] * 1e6 * issue_per_clock
    kib_per_second = limits["memory_gb_per_s"] * 1e9 / 1024
    return per_second / kib_per_second


def decode_block_keys(kernel: str) -> int:
    """BLOCK_N of a flash_decode_kernel<T, HEAD_DIM, GROUP_ROWS, BLOCK_N, ...> or
    flash_decode_xmx_kernel<T, HEAD_DIM, ROWS, BLOCK_N, ...> name; 0 for other kernels."""
    base, _, integers = gpu_grid.registered_key(kernel)
    decode = base in ("flash_decode_kernel", "flash_decode_xmx_kernel")
    return integers[2] if decode and len(integers) > 2 else 0


def decode_subgroups(kernel: str) -> int:
    """SUBGROUPS of a flash_decode_xmx_kernel<T, HEAD_DIM, ROWS, BLOCK_N, FEATURES, M, K, N,
    HEAD_DIM_V, SUBGROUPS> name (its work-group's sub-groups, each running the block loop over
    its share of a block); 1 for other kernels."""
    base, _, integers = gpu_grid.registered_key(kernel)
    return integers[8] if base == "flash_decode_xmx_kernel" and len(integers) > 8 else 1


def shares_latent_cache(head_dim: int, head_dim_v: int) -> bool:
    """MLA's one latent cache: the grid's decode calls with its (D, Dv), V K's first columns."""
    return any((head_dim, head_dim_v) == (d, dv) for d, dv, _ in gpu_grid.MLA_DECODE["full"])


def kv_kib_per_block(r) -> float:
    """KiB of one K/V head's cache a decode kernel's key block reads."""
    keys = decode_block_keys(r.kernel)
    element = 1 if r.features & _FP8_CACHE else _DTYPE_BYTES[r.dtype]
    head_dim_v = r.head_dim_v or r.head_dim
    columns = r.head_dim if shares_latent_cache(r.head_dim, head_dim_v) else r.head_dim + head_dim_v
    return keys * columns * element / 1024


def measure(r, limits: dict) -> None:
    """Fills a built decode kernel's report (gpu_check.KernelReport) with its loop's
    instructions per KiB of K/V and what its GPU affords."""
    if not (r.built and decode_block_keys(r.kernel) and r.block_issued):
        return
    r.kv_kib = kv_kib_per_block(r)
    r.issued_per_kib = round(r.block_issued * decode_subgroups(r.kernel) / r.kv_kib, 1)
    r.affordable_per_kib = round(affordable_per_kib(limits, r.simd), 1)


def over_budget(r) -> bool:
    """The rule broken: the loop (a lower bound where loops nest in it) issues more than
    BANDWIDTH_SHARE of what its GPU affords per KiB."""
    return r.issued_per_kib > BANDWIDTH_SHARE * r.affordable_per_kib > 0


def groups_per_core(r) -> int:
    """The kernel's work-groups one Xe core's local memory holds at once (the profile's local
    memory per work-group is the core's on these GPUs). A decode work-group is one sub-group,
    one hardware thread of the core's 8 vector engines of 8 threads each (the register form's
    split ones, decode_subgroups): past 32 KiB a work-group, fewer than 4 of a 128 KiB core's 64
    threads have reads in flight."""
    return r.slm_limit // r.slm if r.slm else 0


def print_decode_table(reports: list) -> None:
    """The decode kernels' loops per KiB of K/V against their GPUs' budgets, and their local
    memory against DECODE_SLM_BYTES. Reported, not enforced: see docs/gpus.md."""
    rows = [r for r in reports if r.issued_per_kib]
    if not rows:
        return
    header = (f"{'target':6} {'kernel':44} {'KiB':>5} {'insts':>6} {'/KiB':>7} {'half':>6} "
              f"{'slm':>6} {'wg/core':>7}  decode rule (reported, not enforced)")
    print("\n" + header)
    print("-" * len(header))
    for r in sorted(rows, key=lambda r: (r.target, r.dtype, r.head_dim, r.kernel)):
        lower = "+" if r.block_nested else " "
        found = []
        if over_budget(r):
            found.append("over half the budget")
        if r.slm > DECODE_SLM_BYTES:
            found.append(f"slm > {DECODE_SLM_BYTES // 1024} KiB")
        verdict = "; ".join(found) or ("within (lower bound)" if r.block_nested else "within")
        print(f"{r.target:6} {short_kernel(r.kernel):44} {r.kv_kib:5.1f} {r.block_issued:6d} "
              f"{r.issued_per_kib:6.0f}{lower} {BANDWIDTH_SHARE * r.affordable_per_kib:6.0f} "
              f"{r.slm:6d} {groups_per_core(r):7d}  {verdict}")
    broken = sum(1 for r in rows if over_budget(r))
    print(f"\n{broken} of {len(rows)} decode kernels issue more than half of what their GPU "
          f"affords per KiB ('+': loops nested in the block loop counted once, a lower bound)")
