"""Forward attention throughput: ipex_flash against torch SDPA and the naive math form, all
measured in the same run (these machines are shared and noisy, so only same-run ratios mean
anything).

    python scripts/benchmark.py                 # the full grid, N 512..8192
    python scripts/benchmark.py --quick         # N 512..2048, D 64
Prints a table and writes benchmarks/forward.json (plus a copy of the table as .md).
FLOPs counted as 4 * B * H * Nq * Nk * D (two matmuls), halved when causal.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash._runtime import C

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO = Path(__file__).resolve().parent.parent


def naive_attention(q, k, v, causal):
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = scores.shape[-2:]
        scores = scores.masked_fill(
            torch.ones(n_q, n_k, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def best_seconds(fn, repeats, budget_s):
    fn()  # warm-up: first-use kernel build, allocator, caches
    best = float("inf")
    start = time.perf_counter()
    for i in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > budget_s and i >= 0:
            break
    return best


def run(args):
    implementations = {
        "ipex_flash": lambda q, k, v, c: ipex_flash.attention(q, k, v, causal=c),
        "sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
        "naive": naive_attention,
    }
    rows = []
    header = (f"{'dtype':>8} {'D':>4} {'N':>5} {'causal':>6} | " +
              " | ".join(f"{name + ' GFLOP/s':>18}" for name in implementations) +
              f" | {'ipex/sdpa':>9}")
    print(header)
    print("-" * len(header))
    for dtype_name in args.dtypes:
        for head_dim in args.head_dims:
            for seq_len in args.seq_lens:
                for causal in (False, True):
                    torch.manual_seed(0)
                    shape = (args.batch, args.heads, seq_len, head_dim)
                    q, k, v = (torch.randn(shape, dtype=DTYPES[dtype_name]) for _ in range(3))
                    flops = 4 * args.batch * args.heads * seq_len * seq_len * head_dim
                    flops *= 0.5 if causal else 1.0
                    row = dict(dtype=dtype_name, head_dim=head_dim, seq_len=seq_len,
                               causal=causal, batch=args.batch, heads=args.heads)
                    for name, fn in implementations.items():
                        if name == "naive" and seq_len > args.naive_max_len:
                            row[name + "_gflops"] = None
                            continue
                        s = best_seconds(lambda: fn(q, k, v, causal), args.repeats, args.budget)
                        row[name + "_ms"] = s * 1e3
                        row[name + "_gflops"] = flops / s / 1e9
                    row["ratio_to_sdpa"] = row["ipex_flash_gflops"] / row["sdpa_gflops"]
                    rows.append(row)
                    cells = " | ".join(
                        f"{row[n + '_gflops']:18.1f}" if row[n + "_gflops"] else f"{'-':>18}"
                        for n in implementations)
                    print(f"{dtype_name:>8} {head_dim:>4} {seq_len:>5} {str(causal):>6} | "
                          f"{cells} | {row['ratio_to_sdpa']:9.2f}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--naive-max-len", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="N 512..2048, D 64 only")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "forward.json")
    args = parser.parse_args()
    if args.quick:
        args.seq_lens, args.head_dims = [512, 1024, 2048], [64]
    rows = run(args)
    device = C.device_info()
    result = dict(
        machine=dict(cpu=platform.processor() or platform.machine(), device=device["name"],
                     compute_units=device["compute_units"], torch=torch.__version__,
                     torch_threads=torch.get_num_threads()),
        flop_formula="4*B*H*N*N*D, x0.5 causal",
        rows=rows,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
