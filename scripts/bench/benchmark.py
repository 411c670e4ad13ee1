"""Attention throughput: ipex_flash against torch SDPA and the naive math form, all measured
in the same run (these machines are shared and noisy, so only same-run ratios mean anything).

    python scripts/bench/benchmark.py                    # forward, the full grid, N 512..8192
    python scripts/bench/benchmark.py --passes backward fwd+bwd --seq-lens 1024 2048
    python scripts/bench/benchmark.py --quick            # N 512..2048, D 64
    python scripts/bench/benchmark.py --decode           # KV-cache decoding bandwidth
    python scripts/bench/benchmark.py --decode --dtypes bfloat16 --decode-caches same float8_e4m3fn
                                                         # FP8 caches against 16-bit ones
Prints a table and writes benchmarks/results.json (--output to change).
FLOPs: forward 4 * B * H * Nq * Nk * D (two matmuls), halved when causal; backward 2.5x the
forward (five matmuls), forward+backward 3.5x.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

from machine import machine

import ipex_flash  # before torch: shortens the spin of torch's OpenMP threads (_runtime.py)
import torch
import torch.nn.functional as F
from ipex_flash._runtime import C

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO = Path(__file__).resolve().parents[2]


def naive_attention(q, k, v, causal):
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = scores.shape[-2:]
        scores = scores.masked_fill(
            torch.ones(n_q, n_k, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


FLOP_FACTOR = {"forward": 1.0, "backward": 2.5, "fwd+bwd": 3.5}


def make_pass(attention, kind, q, k, v, causal):
    """A no-argument callable timing one pass of `attention` (forward, backward only, or
    forward and backward)."""
    if kind == "forward":
        return lambda: attention(q, k, v, causal)
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(q)
    if kind == "fwd+bwd":
        return lambda: torch.autograd.grad(attention(q, k, v, causal), (q, k, v), grad_out)
    out = attention(q, k, v, causal)
    return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)


def best_seconds(fn, repeats, budget_s):
    fn()  # warm-up: first-use kernel build, allocator, caches
    best = float("inf")
    start = time.perf_counter()
    for i in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return best


def run(args):
    implementations = {
        "ipex_flash": lambda q, k, v, c: ipex_flash.attention(q, k, v, causal=c),
        "sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
        "naive": naive_attention,
    }
    rows = []
    header = (f"{'pass':>8} {'dtype':>8} {'D':>4} {'N':>5} {'causal':>6} | " +
              " | ".join(f"{name + ' GFLOP/s':>18}" for name in implementations) +
              f" | {'ipex/sdpa':>9}")
    print(header)
    print("-" * len(header))
    for kind in args.passes:
        for dtype_name in args.dtypes:
            for head_dim in args.head_dims:
                for seq_len in args.seq_lens:
                    for causal in (False, True):
                        rows.append(measure(args, implementations, kind, dtype_name, head_dim,
                                            seq_len, causal))
    return rows


def measure(args, implementations, kind, dtype_name, head_dim, seq_len, causal):
    torch.manual_seed(0)
    shape = (args.batch, args.heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, dtype=DTYPES[dtype_name]) for _ in range(3))
    flops = 4 * args.batch * args.heads * seq_len * seq_len * head_dim * FLOP_FACTOR[kind]
    flops *= 0.5 if causal else 1.0
    row = dict(kind=kind, dtype=dtype_name, head_dim=head_dim, seq_len=seq_len, causal=causal,
               batch=args.batch, heads=args.heads)
    naive_limit = args.naive_max_len if kind == "forward" else args.naive_max_len // 2
    for name, attention in implementations.items():
        if name == "naive" and seq_len > naive_limit:
            row[name + "_gflops"] = None  # the (N, N) scores would not be worth the memory
            continue
        seconds = best_seconds(make_pass(attention, kind, q, k, v, causal), args.repeats,
                               args.budget)
        row[name + "_ms"] = seconds * 1e3
        row[name + "_gflops"] = flops / seconds / 1e9
    row["ratio_to_sdpa"] = row["ipex_flash_gflops"] / row["sdpa_gflops"]
    cells = " | ".join(f"{row[n + '_gflops']:18.1f}" if row[n + "_gflops"] else f"{'-':>18}"
                       for n in implementations)
    print(f"{kind:>8} {dtype_name:>8} {head_dim:>4} {seq_len:>5} {str(causal):>6} | {cells} | "
          f"{row['ratio_to_sdpa']:9.2f}", flush=True)
    return row


def interleaved_best(calls, rounds, budget_s):
    """The best time of each named callable over `rounds` rounds, every round calling each of
    them once in turn (in reverse order every other round), so that a noisy neighbour's
    stretch slows them alike and the ratios between them hold."""
    for fn in calls.values():
        fn()  # warm-up: first-use kernel build, allocator, caches
    best = dict.fromkeys(calls, float("inf"))
    start = time.perf_counter()
    for i in range(rounds):
        for name in (list(calls) if i % 2 == 0 else list(calls)[::-1]):
            t = time.perf_counter()
            calls[name]()
            best[name] = min(best[name], time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return best


def decode_cache(layout, batch, length, heads_kv, head_dim, dtype):
    """A (B, N, H, D) cache view over memory laid out as flash-attn's (B, N, H, D), or as
    head-major (B, H, N, D) (the layout of many serving engines' caches)."""
    if layout == "BHND":
        return torch.randn(batch, heads_kv, length, head_dim, dtype=dtype).transpose(1, 2)
    return torch.randn(batch, length, heads_kv, head_dim, dtype=dtype)


def run_decode(args):
    """New tokens (--decode-tokens, default one) per sequence against a KV cache of D = 128 with
    --decode-heads query/key-value heads: bytes of K and V read per second against a 512 MB
    copy's bytes read and written per second, and for FP8 caches (--decode-caches) tokens per
    second against the q-dtype cache's. Each shape's calls (the copy, ours per cache dtype,
    torch's SDPA) are timed in the same interleaved rounds (interleaved_best)."""
    head_dim = 128
    copy_src = torch.ones(512 * 2**20 // 4)
    copy_dst = torch.empty_like(copy_src)
    copy_bytes = 2 * copy_src.numel() * copy_src.element_size()
    header = (f"{'dtype':>8} {'heads':>6} {'tok':>3} {'layout':>6} {'batch':>5} {'cache':>6} | "
              f"{'ipex_flash GB/s':>15} | {'copy GB/s':>9} | "
              f"{'sdpa GB/s':>10} | {'ipex/copy':>9} | {'ipex/sdpa':>9} | {'cache dtype':>13} | "
              f"{'tok/s vs same':>13}")
    print(header)
    print("-" * len(header))
    rows = []
    for dtype_name, heads, new_tokens, (layout, batch, length) in itertools.product(
            args.dtypes, args.decode_heads, args.decode_tokens,
            itertools.product(args.decode_layouts, args.decode_batches, args.decode_lengths)):
        heads_q, heads_kv = (int(h) for h in heads.split("/"))
        dtype = DTYPES[dtype_name]
        cache_dtypes = {name: dtype if name == "same" else getattr(torch, name)
                        for name in args.decode_caches}
        if dtype == torch.float32:  # FP8 caches take 16-bit queries
            cache_dtypes = {n: d for n, d in cache_dtypes.items() if d.itemsize >= 2}
        if not cache_dtypes:
            continue
        torch.manual_seed(0)
        q = torch.randn(batch, new_tokens, heads_q, head_dim, dtype=dtype)
        caches = {name: tuple(decode_cache(layout, batch, length, heads_kv, head_dim,
                                           torch.float32).to(cache_dtype) for _ in range(2))
                  for name, cache_dtype in cache_dtypes.items()}
        calls = {"copy": lambda: copy_dst.copy_(copy_src)}
        for name, (k_cache, v_cache) in caches.items():
            calls[name] = (lambda k_cache=k_cache, v_cache=v_cache:
                           ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                              cache_seqlens=length))
        k_s, v_s = (t.transpose(1, 2).to(dtype) for t in next(iter(caches.values())))
        q_s = q.transpose(1, 2)
        calls["sdpa"] = lambda: F.scaled_dot_product_attention(q_s, k_s, v_s, enable_gqa=True)
        best = interleaved_best(calls, args.repeats, args.budget * len(calls))
        for name, (k_cache, v_cache) in caches.items():
            kv_bytes = 2 * k_cache.numel() * k_cache.element_size()
            ours = best[name]
            row = dict(kind="decode", dtype=dtype_name, layout=layout, batch=batch,
                       cache_len=length, heads_q=heads_q, heads_kv=heads_kv,
                       head_dim=head_dim, new_tokens=new_tokens,
                       ipex_flash_ms=ours * 1e3, sdpa_ms=best["sdpa"] * 1e3,
                       copy_ms=best["copy"] * 1e3, ipex_flash_gbps=kv_bytes / ours / 1e9,
                       sdpa_gbps=kv_bytes / best["sdpa"] / 1e9,
                       copy_gbps=copy_bytes / best["copy"] / 1e9,
                       cache_dtype=str(cache_dtypes[name]).removeprefix("torch."),
                       tokens_per_s=batch / ours, ratio_to_sdpa=best["sdpa"] / ours,
                       # Tokens per second against the same call with a cache in q's dtype.
                       tokens_ratio_to_same_cache=(best["same"] / ours if "same" in best
                                                   else None))
            row["ratio_to_copy"] = row["ipex_flash_gbps"] / row["copy_gbps"]
            rows.append(row)
            ratio = row["tokens_ratio_to_same_cache"]
            print(f"{dtype_name:>8} {heads:>6} {new_tokens:>3} {layout:>6} {batch:>5} "
                  f"{length:>6} | {row['ipex_flash_gbps']:15.1f} | {row['copy_gbps']:9.1f} | "
                  f"{row['sdpa_gbps']:10.1f} | {row['ratio_to_copy']:9.2f} | "
                  f"{row['ratio_to_sdpa']:9.2f} | {row['cache_dtype']:>13} | "
                  f"{'-' if ratio is None else f'{ratio:.2f}':>13}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", nargs="+", default=["forward"], choices=list(FLOP_FACTOR))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--naive-max-len", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="N 512..2048, D 64 only")
    parser.add_argument("--decode", action="store_true",
                        help="KV-cache decoding: 1 token, GQA 32/8, D 128 (bandwidth)")
    parser.add_argument("--decode-layouts", nargs="+", default=["BNHD", "BHND"],
                        choices=["BNHD", "BHND"], help="memory layout of the KV cache")
    parser.add_argument("--decode-batches", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--decode-lengths", nargs="+", type=int,
                        default=[1024, 4096, 16384, 32768])
    parser.add_argument("--decode-heads", nargs="+", default=["32/8"],
                        help="query/key-value heads of --decode, e.g. 32/8 (GQA) 32/1 (MQA)")
    parser.add_argument("--decode-tokens", nargs="+", type=int, default=[1],
                        help="new tokens per sequence of --decode")
    parser.add_argument("--decode-caches", nargs="+", default=["same"],
                        choices=["same", "float8_e4m3fn", "float8_e5m2"],
                        help="the cache's dtype: q's (same) or FP8 (16-bit q only)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results.json")
    args = parser.parse_args()
    if args.quick:
        args.seq_lens, args.head_dims = [512, 1024, 2048], [64]
    rows = run_decode(args) if args.decode else run(args)
    device = C.device_info()
    result = dict(
        machine=machine(device=device["name"], compute_units=device["compute_units"],
                        torch=torch.__version__, torch_threads=torch.get_num_threads()),
        command="python scripts/bench/benchmark.py " + " ".join(sys.argv[1:]),
        flop_formula="4*B*H*N*N*D x (1 forward, 2.5 backward, 3.5 fwd+bwd), x0.5 causal",
        decode_bandwidth="bytes of K and V read / time; copy: (bytes read + written) / time "
                         "of a 512 MB copy; each shape's calls timed in the same interleaved "
                         "rounds",
        rows=rows,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
