"""Host cost of each entry point on a decode step, against torch SDPA in the same run.

Each entry point does the same attention (fp32, one new query token per sequence) on its own
layout of the same keys and values:

    torch_sdpa          torch.nn.functional.scaled_dot_product_attention, (B, H, N, D) cache
    sdpa                ipex_flash.scaled_dot_product_attention, same tensors
    op                  torch.ops.ipex_flash.attention, same tensors
    flash_attn_func     (B, N, H, D) cache
    kvcache             flash_attn_with_kvcache, contiguous (B, N, H, D) cache (cache_seqlens given)
    kvcache_paged       flash_attn_with_kvcache, pages of 64 keys in shuffled order
    kvcache_append      flash_attn_with_kvcache appending the step's key and value (the last
                        one, rewritten each call) to the paged cache: a model's decode step
    kvcache_rotary      the same with rotary tables (of angle 0, so that the attention stays
                        the same; the new key and the query are rotated all the same)
    paged_varlen        flash_attn_varlen_func with block_table (the serving call), same pages
    vllm_call           the same as vLLM's attention backend calls it: by keyword, out= a slice
                        of a larger output buffer, descales of 1 as (B, H_kv) expanded views
                        (applied: the cache is 16-bit), window_size=None, fa_version=2
    kvcache_fa3         flash_attn_with_kvcache as SGLang calls it: packed q (B, H, D) with
                        cu_seqlens_q and max_seqlen_q, page_table, the hints it passes
    varlen              flash_attn_varlen_func on the keys packed (B * N, H, D), one query per
                        sequence
    kvpacked            flash_attn_kvpacked_func, keys and values stacked (B, N, 2, H, D)

at a tiny call (B=1, 1 query, 4 keys, 1 head, d=16) and at decode sizes (B = 1 and 8, 256 and
4096 keys, 32 query / 8 K/V heads, d=128). Figures are the median of --repeats calls after
--warmup calls, the callables of a size interleaved in --rounds rounds (best median kept), so
that the shared machine's slow seconds hit them alike; ratios are against torch_sdpa's whole
call in the same run.

Host time: the time from the Python call to its first kernel's submission, read from the
host module's clock of submissions (C.take_first_submission_ns: the steady clock at the
first kernel submitted since the last read, the clock of time.perf_counter_ns), so the
kernels' execution is left out although launches on the SYCL CPU device wait for their
kernels (only XPU work stays asynchronous):

    host us      median of (first submission - call) over the repeats: checks, tensors,
                 options, plan lookup, dispatch, Python/C++ crossings; each call follows one
                 of the same size, whose kernels ran on the same cores (the CPU device) and
                 left K/V rather than the host path in the caches
    host warm us the same with the entry point's tiny call before each timed call (untimed),
                 which brings the host path's code back into the caches that the kernels' K/V
                 traffic evicted (a GPU's kernels do not run on the host's cores); the call's
                 own tensors and plan stay as the previous call of its size left them
    host alone us    the same, calls back to back with their kernels submitted but not run
                 (C.skip_kernels): the host path with the caches as a GPU's kernels leave
                 them, the measure of the host time target
    kernels us   the same decode kernels launched alone, from views, options and scratch
                 prepared once (C.flash_decode, one per layout: SDPA's, flash-attn's, paged);
                 "whole - kernels" is the rest of the call (host time before and after the
                 kernels), noisy at large sizes, where it is a small difference of two large
                 figures

torch_sdpa has neither split.

The XPU path, through the queue-handle seam the tests use (a queue by handle, the device taken
as one that does not share host memory), for the KV-cache calls, each whole call with its
kernels submitted but not run:

    xpu us       the path an XPU takes: a decode step of flash_attn_with_kvcache waits for
                 nothing (a kernel after the attention checks the cache's values); the serving
                 call waits for a kernel that reads its offsets and values first (skipped
                 here, so that wait is not in the figure)
    xpu waits    the reads per call the host waits for on that path (C.cache_value_reads,
                 counted over calls with their kernels run): on an XPU each waits for every
                 kernel queued before it

    python scripts/bench/benchmark_host_cost.py [--repeats 21] [--only tiny b1_n256 ...]
Prints a table and writes benchmarks/host_cost.json (--output to change).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from host_cost_calls import ENTRY_POINTS, KERNEL_LAYOUT, XPU_PATH, check_agreement, \
    entry_points, kernels_alone, tensors
from host_cost_timers import interleaved, on_xpu_path, submission_delay, \
    submission_delay_alone, waits_per_call, whole_call_alone
from machine import machine

import torch

REPO = Path(__file__).resolve().parents[2]

# name -> (batch, keys, heads_q, heads_kv, head_dim)
SIZES = {"tiny": (1, 4, 1, 1, 16),
         "b1_n256": (1, 256, 32, 8, 128), "b1_n4096": (1, 4096, 32, 8, 128),
         "b8_n256": (8, 256, 32, 8, 128), "b8_n4096": (8, 4096, 32, 8, 128)}


def measure(size: str, args) -> dict:
    batch, keys, heads_q, heads_kv, head_dim = SIZES[size]
    torch.manual_seed(0)
    t = tensors(batch, keys, heads_q, heads_kv, head_dim)
    fns = entry_points(t, keys)
    check_agreement(fns, t)
    kernels = kernels_alone(t, keys)
    with torch.no_grad():
        seconds = interleaved({**fns, **{f"kernels_{n}": f for n, f in kernels.items()}},
                              args.rounds, args.repeats, args.warmup)
        timed = {n: f for n, f in fns.items() if n != "torch_sdpa"}
        host = interleaved(timed, args.rounds, args.repeats, args.warmup,
                           measure=submission_delay)
        host_alone = interleaved(timed, args.rounds, args.repeats, args.warmup,
                                 measure=submission_delay_alone)
        xpu_fns = {n: fns[n] for n in XPU_PATH}
        xpu = interleaved(xpu_fns, args.rounds, args.repeats, args.warmup,
                          measure=on_xpu_path(whole_call_alone))
        xpu_waits = {n: on_xpu_path(waits_per_call)(f, 3, 1) for n, f in xpu_fns.items()}
        host_warm = host  # (the tiny call follows a tiny call already)
        if size != "tiny":
            tiny = entry_points(tensors(*SIZES["tiny"]), SIZES["tiny"][1])
            host_warm = interleaved(
                {n: (f, tiny[n]) for n, f in timed.items()}, args.rounds, args.repeats,
                args.warmup, measure=lambda fns, r, w: submission_delay(fns[0], r, w, fns[1]))
    base = seconds["torch_sdpa"]
    rows = {}
    for name in ENTRY_POINTS:
        row = {"us": 1e6 * seconds[name], "vs_torch_sdpa": seconds[name] / base}
        if name in host:
            row.update(host_us=1e6 * host[name], host_warm_us=1e6 * host_warm[name],
                       host_alone_us=1e6 * host_alone[name])
        if name in XPU_PATH:
            row.update(xpu_us=1e6 * xpu[name], xpu_waits=xpu_waits[name])
        if name in KERNEL_LAYOUT:
            alone = seconds[f"kernels_{KERNEL_LAYOUT[name]}"]
            row.update(kernels_us=1e6 * alone, whole_minus_kernels_us=1e6 * (seconds[name] - alone))
        rows[name] = row
    return {"batch": batch, "keys": keys, "heads_q": heads_q, "heads_kv": heads_kv,
            "head_dim": head_dim, "dtype": "float32", "entry_points": rows}


def print_table(results: dict) -> None:
    columns = (("kernels_us", "kernels us"), ("whole_minus_kernels_us", "whole-kernels"),
               ("host_us", "host us"), ("host_warm_us", "host warm us"),
               ("host_alone_us", "host alone us"), ("xpu_us", "xpu us"),
               ("xpu_waits", "xpu waits"))
    print(f"{'size':<10} {'entry point':<16} {'whole us':>10} {'vs torch':>9} "
          + " ".join(f"{title:>13}" for _, title in columns))
    for size, r in results.items():
        for name, row in r["entry_points"].items():
            cells = [f"{row[key]:13.1f}" if key in row else f"{'-':>13}" for key, _ in columns]
            print(f"{size:<10} {name:<16} {row['us']:10.1f} {row['vs_torch_sdpa']:8.2f}x "
                  + " ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "host_cost.json")
    args = parser.parse_args()
    results = {size: measure(size, args) for size in args.only}
    print_table(results)
    report = {"machine": machine(torch=torch.__version__), "threads": torch.get_num_threads(),
              "args": {"repeats": args.repeats, "warmup": args.warmup, "rounds": args.rounds},
              "results": results}
    args.output.parent.mkdir(exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
