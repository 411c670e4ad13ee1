"""The serving call's cost: one flash_attn_varlen_func over a paged KV cache with decodes and a
chunked prefill mixed, against the same work as two calls (the decodes alone, the prefill
alone), measured in the same run and interleaved (these machines are shared and noisy).

    python scripts/bench/benchmark_serving.py           # 8 decodes + one 2k-token prefill chunk
    python scripts/bench/benchmark_serving.py --decodes 16 --context 8192 --dtype float32
    python scripts/bench/benchmark_serving.py --decode-tokens 5   # speculative steps of 4 drafts
Prints a table and writes benchmarks/serving.json (--output to change).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ipex_flash  # noqa: F401  (before torch: its OpenMP settings)
import torch
from machine import machine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO = Path(__file__).resolve().parents[2]


def build(lengths, heads_q, heads_kv, head_dim, page_size, dtype):
    """Packed queries, a shuffled page pool, block table, cu_seqlens_q, seqused_k."""
    pages = [-(-n_k // page_size) for _, n_k in lengths]
    pool = sum(pages)
    order = torch.randperm(pool).to(torch.int32)
    k = torch.randn(pool, page_size, heads_kv, head_dim, dtype=dtype)
    v = torch.randn(pool, page_size, heads_kv, head_dim, dtype=dtype)
    table = torch.zeros(len(lengths), max(pages), dtype=torch.int32)
    start = 0
    for b, count in enumerate(pages):
        table[b, :count] = order[start:start + count]
        start += count
    q = torch.randn(sum(n for n, _ in lengths), heads_q, head_dim, dtype=dtype)
    cu_q = torch.tensor([0] + [n for n, _ in lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seqused = torch.tensor([n for _, n in lengths], dtype=torch.int32)
    return q, k, v, table, cu_q, seqused


def call(batch, lengths):
    q, k, v, table, cu_q, seqused = batch
    return lambda: ipex_flash.flash_attn_varlen_func(
        q, k, v, cu_q, None, max(n for n, _ in lengths), max(n for _, n in lengths),
        causal=True, block_table=table, seqused_k=seqused)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decodes", type=int, default=8)
    parser.add_argument("--context", type=int, default=4096, help="keys of each decode")
    parser.add_argument("--decode-tokens", type=int, default=1,
                        help="new tokens of each decode (a speculative step's drafts + 1)")
    parser.add_argument("--prefill", type=int, default=2048, help="new tokens of the chunk")
    parser.add_argument("--prefill-context", type=int, default=4096)
    parser.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("HQ", "HKV"))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "serving.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    decodes = [(args.decode_tokens, args.context)] * args.decodes
    prefill = [(args.prefill, args.prefill_context)]
    shape = (*args.heads, args.head_dim, args.page_size, DTYPES[args.dtype])
    cases = {"mixed": (decodes + prefill), "decodes": decodes, "prefill": prefill}
    calls = {name: call(build(lengths, *shape), lengths) for name, lengths in cases.items()}
    for fn in calls.values():  # builds the kernels and warms the caches
        fn()
    times = {name: [] for name in calls}
    for _ in range(args.repeats):  # interleaved, so drifts in the machine's load hit all alike
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    best = {name: min(t) for name, t in times.items()}
    separate = best["decodes"] + best["prefill"]
    ratio = best["mixed"] / separate
    print(f"{args.decodes} decodes of {args.decode_tokens} token(s) x {args.context} keys + one "
          f"{args.prefill}-token chunk over "
          f"{args.prefill_context} keys; GQA {args.heads[0]}/{args.heads[1]}, D={args.head_dim}, "
          f"{args.dtype}, pages of {args.page_size}")
    print(f"{'call':>24} | best of {args.repeats} (ms)")
    for name in calls:
        print(f"{name:>24} | {1e3 * best[name]:9.2f}")
    print(f"{'decodes + prefill':>24} | {1e3 * separate:9.2f}")
    print(f"mixed / (decodes + prefill) = {ratio:.3f}x (target <= 1.1x)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine(torch=torch.__version__, torch_threads=torch.get_num_threads()),
        "args": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "best_seconds": best, "separate_seconds": separate, "mixed_over_separate": ratio},
        indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
