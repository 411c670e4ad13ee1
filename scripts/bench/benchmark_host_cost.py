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
import time
from pathlib import Path

from benchmark_sdpa import median_seconds
from machine import machine

import ipex_flash  # before torch: shortens torch's OpenMP spin (ipex_flash/_runtime.py)
import torch
import torch.nn.functional as F
from ipex_flash._runtime import C
from ipex_flash.kvcache.cache_ops import cache_options
from ipex_flash.ops import launch, launch_plans
from ipex_flash.ops.attention_forward import sdpa_options
from ipex_flash.ops.flash_attn_args import flash_options

REPO = Path(__file__).resolve().parents[2]
PAGE = 64

# name -> (batch, keys, heads_q, heads_kv, head_dim)
SIZES = {"tiny": (1, 4, 1, 1, 16),
         "b1_n256": (1, 256, 32, 8, 128), "b1_n4096": (1, 4096, 32, 8, 128),
         "b8_n256": (8, 256, 32, 8, 128), "b8_n4096": (8, 4096, 32, 8, 128)}
ENTRY_POINTS = ("torch_sdpa", "sdpa", "op", "flash_attn_func", "kvcache", "kvcache_paged",
                "kvcache_append", "kvcache_rotary", "paged_varlen", "vllm_call", "kvcache_fa3",
                "varlen", "kvpacked")
XPU_PATH = ("kvcache", "kvcache_paged", "kvcache_append", "kvcache_rotary", "paged_varlen",
            "vllm_call", "kvcache_fa3")
KERNEL_LAYOUT = {"sdpa": "bhnd", "op": "bhnd", "flash_attn_func": "bnhd", "kvcache": "bnhd",
                 "kvcache_paged": "paged", "kvcache_append": "paged",
                 "kvcache_rotary": "paged", "paged_varlen": "paged", "vllm_call": "paged",
                 "kvcache_fa3": "paged"}


def interleaved(fns: dict, rounds: int, repeats: int, warmup: int,
                measure=median_seconds) -> dict:
    """The best of `rounds` rounds of measure(fn, repeats, warmup) for each of fns, the rounds
    interleaved."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], measure(fn, repeats, warmup))
    return best


def tensors(batch, keys, heads_q, heads_kv, head_dim):
    """The same queries, keys and values in each layout: (B, H, N, D), (B, N, H, D) and pages
    of PAGE keys (at least one page) in shuffled order with their block table."""
    q = torch.randn(batch, heads_q, 1, head_dim)
    k, v = (torch.randn(batch, heads_kv, keys, head_dim) for _ in range(2))
    t = dict(q=q, k=k, v=v, q_bnhd=q.transpose(1, 2).contiguous())
    t["k_bnhd"], t["v_bnhd"] = (x.transpose(1, 2).contiguous() for x in (k, v))
    per_seq = -(-keys // PAGE)
    order = torch.randperm(batch * per_seq)
    t["block_table"] = order.view(batch, per_seq).to(torch.int32)
    for name in ("k", "v"):
        padded = F.pad(t[f"{name}_bnhd"], (0, 0, 0, 0, 0, per_seq * PAGE - keys))
        pages = torch.empty(batch * per_seq, PAGE, heads_kv, head_dim)
        pages[order] = padded.reshape(batch * per_seq, PAGE, heads_kv, head_dim)
        t[f"{name}_pages"] = pages
    t["seqlens"] = torch.full((batch,), keys, dtype=torch.int32)
    t["seqlens_before_last"] = t["seqlens"] - 1  # kvcache_append writes the last key again
    t["k_last"], t["v_last"] = (t[f"{name}_bnhd"][:, -1:].contiguous() for name in ("k", "v"))
    t["cos"], t["sin"] = torch.ones(keys, head_dim // 2), torch.zeros(keys, head_dim // 2)
    t["kv_stacked"] = torch.stack((t["k_bnhd"], t["v_bnhd"]), dim=2)
    t["k_packed"], t["v_packed"] = (t[f"{n}_bnhd"].view(-1, heads_kv, head_dim) for n in "kv")
    t["cu_q"] = torch.arange(batch + 1, dtype=torch.int32)
    t["cu_k"] = torch.arange(batch + 1, dtype=torch.int32) * keys
    t["output"] = torch.empty(batch + 3, heads_q, head_dim)  # vLLM's buffer, padded
    t["descale"] = torch.ones(1).expand(batch, heads_kv)
    return t


def entry_points(t: dict, keys: int) -> dict:
    heads_q, heads_kv = t["q"].shape[1], t["k"].shape[1]
    gqa = heads_q != heads_kv
    batch, head_dim = t["q"].shape[0], t["q"].shape[3]
    bhnd, bnhd = (t["q"], t["k"], t["v"]), (t["q_bnhd"], t["k_bnhd"], t["v_bnhd"])
    return {
        "torch_sdpa": lambda: F.scaled_dot_product_attention(*bhnd, enable_gqa=gqa),
        "sdpa": lambda: ipex_flash.scaled_dot_product_attention(*bhnd, enable_gqa=gqa),
        "op": lambda: torch.ops.ipex_flash.attention(*bhnd),
        "flash_attn_func": lambda: ipex_flash.flash_attn_func(*bnhd),
        "kvcache": lambda: ipex_flash.flash_attn_with_kvcache(*bnhd, cache_seqlens=t["seqlens"]),
        "kvcache_paged": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], cache_seqlens=t["seqlens"],
            block_table=t["block_table"]),
        "kvcache_append": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], t["k_last"], t["v_last"],
            cache_seqlens=t["seqlens_before_last"], block_table=t["block_table"]),
        "kvcache_rotary": lambda: ipex_flash.flash_attn_with_kvcache(
            t["q_bnhd"], t["k_pages"], t["v_pages"], t["k_last"], t["v_last"], t["cos"],
            t["sin"], cache_seqlens=t["seqlens_before_last"], block_table=t["block_table"]),
        "paged_varlen": lambda: ipex_flash.flash_attn_varlen_func(
            t["q_bnhd"].view(batch, heads_q, -1), t["k_pages"], t["v_pages"], t["cu_q"], t["cu_k"],
            1, keys, block_table=t["block_table"], seqused_k=t["seqlens"]),
        "vllm_call": lambda: ipex_flash.flash_attn_varlen_func(
            q=t["q_bnhd"].view(batch, heads_q, -1), k=t["k_pages"], v=t["v_pages"],
            out=t["output"][:batch], cu_seqlens_q=t["cu_q"], max_seqlen_q=1,
            seqused_k=t["seqlens"], max_seqlen_k=keys, softmax_scale=head_dim ** -0.5,
            causal=True, alibi_slopes=None, window_size=None, block_table=t["block_table"],
            softcap=0.0, scheduler_metadata=None, fa_version=2, q_descale=t["descale"],
            k_descale=t["descale"], v_descale=t["descale"], num_splits=0, s_aux=None),
        "kvcache_fa3": lambda: ipex_flash.flash_attn_with_kvcache(
            q=t["q_bnhd"].view(batch, heads_q, -1), k_cache=t["k_pages"], v_cache=t["v_pages"],
            page_table=t["block_table"], cache_seqlens=t["seqlens"], cu_seqlens_q=t["cu_q"],
            max_seqlen_q=1, softmax_scale=head_dim ** -0.5, causal=True, window_size=(-1, -1),
            softcap=0.0, return_softmax_lse=False, scheduler_metadata=None, num_splits=0,
            pack_gqa=None, sm_margin=0),
        "varlen": lambda: ipex_flash.flash_attn_varlen_func(
            t["q_bnhd"].view(batch, heads_q, -1), t["k_packed"], t["v_packed"], t["cu_q"],
            t["cu_k"], 1, keys),
        "kvpacked": lambda: ipex_flash.flash_attn_kvpacked_func(t["q_bnhd"], t["kv_stacked"]),
    }


def kernels_alone(t: dict, keys: int) -> dict:
    """C.flash_decode on prepared views, options and scratch, per layout: what the entry
    points' kernels cost without anything around them."""
    batch, heads_q, _, head_dim = t["q"].shape
    heads_kv = t["k"].shape[1]
    scale = head_dim ** -0.5
    layouts = {
        "bhnd": (t["q"], t["k"], t["v"], sdpa_options(t["q"], False, None, 0.0, None)),
        "bnhd": (*(t[n].transpose(1, 2) for n in ("q_bnhd", "k_bnhd", "v_bnhd")),
                 flash_options(None, None, 0, 0, scale, False, -1, -1, 0.0, None, 0.0, None)),
        "paged": (t["q_bnhd"].transpose(1, 2), t["k_pages"].transpose(1, 2),
                  t["v_pages"].transpose(1, 2),
                  cache_options(scale, False, -1, -1, 0.0, None, None, t["seqlens"], keys,
                                t["block_table"], PAGE)),
    }
    splits = C.decode_num_splits(batch, heads_kv, heads_q // heads_kv, head_dim, keys, 0)
    calls = {}
    for name, (q, k, v, options) in layouts.items():
        out, lse = torch.empty_like(q), torch.empty(batch, heads_q, 1)
        partial_out = torch.empty(batch, heads_q, 1, splits, head_dim)
        partial_lse = torch.empty(batch, heads_q, 1, splits)
        views = [launch.view(x) for x in (q, k, v, out, lse, partial_out, partial_lse)]
        kept = (out, lse, partial_out, partial_lse)  # the views point into them
        calls[name] = lambda views=views, options=options, kept=kept: C.flash_decode(
            *views, options, 0)
    return calls


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


def check_agreement(fns: dict, t: dict) -> None:
    """Every entry point computes the same attention (a benchmark of wrong results is none).
    One query row: every layout's output reshapes to (B, Hq * D) alike."""
    expected = fns["torch_sdpa"]().reshape(t["q"].shape[0], -1)
    for name, fn in fns.items():
        torch.testing.assert_close(fn().reshape(expected.shape), expected, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


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
