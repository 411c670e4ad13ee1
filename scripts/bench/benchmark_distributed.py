"""Training steps of context parallelism against one process, on this machine: 1, 2 and 4
ranks spawned here, joined by gloo over loopback, each running the kernels on the SYCL CPU
device with one compute unit and one torch thread.

    python scripts/bench/benchmark_distributed.py                  # N = 2048, ~6 min
    python scripts/bench/benchmark_distributed.py --seq-len 4096 --repeats 3

For ring, zigzag (ring_flash_attn_func, zigzag_ring_flash_attn_func on a causal sequence),
llama3 (llama3_flash_attn_varlen_func on a packed batch of four causal sequences), USP
(usp_flash_attn_func, Ulysses 2 x zigzag ring 2, at 4 ranks only) and the ring with a causal
window of N/8 tokens (window-aware: K/V only to the ranks that see them), against one
process's flash_attn_func / flash_attn_varlen_func on the same whole batch (with the same
window), in float32 and bfloat16:
the forward + backward step's time (median of --repeats, every rank starting together; the
slowest rank's), the bytes each rank sends per step, and each rank's peak resident memory
during a step above its inputs (distributed_steps.py says how both are counted). Prints a
table and writes benchmarks/distributed.json (--output).

All ranks share this machine's cores: with 2 cores and 4 ranks, each rank gets half a core,
so step times across rank counts measure the layer's overhead (exchanges, merges, more and
smaller kernel calls), not scaling.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # read by glibc at process start
os.environ.setdefault("DPCPP_CPU_NUM_CUS", "1")  # one compute unit per rank (2-core machine)
import ipex_flash  # noqa: E402,F401  (before torch: its OpenMP settings)
import torch  # noqa: E402
from distributed_steps import DTYPES, ONE_PROCESS, ORDER, measure, packed_lengths  # noqa: E402
from machine import machine  # noqa: E402
from rank_world import run_world  # noqa: E402

from ipex_flash import distributed as ifd  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def methods_for(world: int) -> list[str]:
    """One process's two functions run at 1 rank; USP needs 2 x 2."""
    names = ["ring", "zigzag", "llama3", "ring_window"]
    if world == 1:
        return ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_func_window"] + names
    return names + (["usp"] if world == 4 else [])


def rank_rows(rank: int, world: int, args) -> list[dict]:
    """Every method and dtype on this rank (USP's groups made first at 4 ranks)."""
    if world == 4:
        ifd.set_seq_parallel_pg(2, 2, rank, world)  # Ulysses groups {0, 1}, {2, 3}
    return [measure(method, args, dtype, rank, world)
            for dtype in args.dtypes for method in methods_for(world)]


def summarize(rows: list[dict], args_dtypes: list[str]) -> list[dict]:
    """One line per (dtype, method, ranks): the slowest rank's median step, the most a rank
    sends and the most peak memory of a rank, each beside one process's."""
    lines = []
    keys = sorted({(r["dtype"], r["world"], r["method"]) for r in rows},
                  key=lambda k: (args_dtypes.index(k[0]), k[1], ORDER.index(k[2])))
    for dtype, world, method in keys:
        ranks = [r for r in rows if (r["dtype"], r["world"], r["method"]) == (dtype, world, method)]
        base_name = ONE_PROCESS.get(method, method)
        base = [r for r in rows if r["dtype"] == dtype and r["method"] == base_name][0]
        step = max(r["median_seconds"] for r in ranks)
        peak = max(r["peak_bytes"] for r in ranks)
        lines.append(dict(dtype=dtype, method=method, world=world, step_seconds=step,
                          step_vs_one=step / base["median_seconds"],
                          sent_bytes=max(r["sent_bytes"] for r in ranks),
                          peak_bytes=peak, peak_vs_one=peak / base["peak_bytes"],
                          local_tokens=max(r["local_tokens"] for r in ranks)))
    return lines


def print_table(lines: list[dict], args) -> None:
    print(f"\nForward + backward step, causal, N = {args.seq_len}, H = {args.heads[0]}/"
          f"{args.heads[1]}, D = {args.head_dim}; median of {args.repeats}, slowest rank; "
          "bytes and peak memory: the most of any rank")
    print(f"{'dtype':>8} {'method':>22} {'P':>2} {'tokens/rank':>11} {'step ms':>8} "
          f"{'vs one':>7} {'MiB sent':>9} {'peak MiB':>9} {'vs one':>7}")
    for line in lines:
        print(f"{line['dtype']:>8} {line['method']:>22} {line['world']:>2} "
              f"{line['local_tokens']:>11} {1e3 * line['step_seconds']:>8.1f} "
              f"{line['step_vs_one']:>6.2f}x {line['sent_bytes'] / 2**20:>9.2f} "
              f"{line['peak_bytes'] / 2**20:>9.1f} {line['peak_vs_one']:>6.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048,
                        help="the whole sequence (fixed) or packed batch (llama3); a multiple "
                             "of 2P for zigzag and of P for llama3")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--heads", type=int, nargs=2, default=[8, 2], metavar=("H", "HKV"))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads-k-stride", type=int, default=1, help="llama3's")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "distributed.json")
    args = parser.parse_args()
    if 1 not in args.worlds:
        parser.error("--worlds must include 1: every figure is compared with one process's")
    print(f"ranks on {machine()['cpu']} ({machine()['cores']} cores, shared by all ranks), "
          f"gloo over loopback, SYCL CPU device with DPCPP_CPU_NUM_CUS="
          f"{os.environ['DPCPP_CPU_NUM_CUS']} per rank; packed lengths "
          f"{packed_lengths(args.seq_len)}")
    load_before = os.getloadavg()[0]
    rows = []
    for world in args.worlds:
        rows += [row for per_rank in run_world(world, rank_rows, args, 1800)
                 for row in per_rank]
        print(f"{world} rank(s) done")
    lines = summarize(rows, args.dtypes)
    print_table(lines, args)
    print(f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
          f"({machine()['cores']} cores)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine(torch=torch.__version__, backend="gloo",
                           rank_device="SYCL CPU device, DPCPP_CPU_NUM_CUS="
                           + os.environ["DPCPP_CPU_NUM_CUS"] + ", 1 torch thread per rank"),
        "args": {k: (str(v.resolve().relative_to(REPO)) if isinstance(v, Path)
                     and v.resolve().is_relative_to(REPO) else str(v) if isinstance(v, Path)
                     else v) for k, v in vars(args).items()},
        "load_average": [load_before, os.getloadavg()[0]],
        "packed_lengths": packed_lengths(args.seq_len), "summary": lines, "ranks": rows},
        indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
