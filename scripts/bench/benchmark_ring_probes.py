"""The zigzag ring's own properties on this machine (benchmark_distributed.py times whole
training steps of every method): ranks spawned here, joined by gloo over loopback, each
running the kernels on the SYCL CPU device with one compute unit and one torch thread.

    python scripts/bench/benchmark_ring_probes.py            # N = 2048, 4096; P = 1, 2, 4, 8
    python scripts/bench/benchmark_ring_probes.py --seq-lens 4096 8192 --worlds 2 4

Three measurements, printed as tables and written to benchmarks/distributed_ring.json
(--output):
- memory: each rank's peak resident memory during a zigzag causal call (forward, and forward
  + backward) above what it held before (its q, k, v and dO shards, listed apart): the
  kernel's VmHWM after resetting it through /proc/self/clear_refs, glibc told to unmap every
  freed block over 64 KiB (MALLOC_MMAP_THRESHOLD_) so that the resident set follows the
  tensors alive. Divided by the rank's tokens it should stay flat as P grows: O(N/P).
- balance: the (query, key) pairs each rank attends to in a causal call (from the plan of
  kernel calls) and the time of its forward kernels run alone, one rank after the other in
  this process: zigzag against the plain ring.
- overlap: at 2 ranks, one ring step (post the K/V exchange, run the step's kernel, wait)
  against the kernel alone and the exchange alone, all ranks timing together.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # read by glibc at process start
os.environ.setdefault("DPCPP_CPU_NUM_CUS", "1")  # one compute unit per rank (2-core machine)
import ipex_flash  # noqa: E402,F401  (before torch: its OpenMP settings)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from machine import machine  # noqa: E402
from rank_world import peak_during, run_world  # noqa: E402

from ipex_flash import distributed as ifd  # noqa: E402
from ipex_flash.distributed import _ring_engine, _ring_op  # noqa: E402
from ipex_flash.distributed._comm import RingComm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _shards(args, rank, world, seqlen, requires_grad=False):
    shape = (args.batch, seqlen, args.heads, args.head_dim)
    q, k, v, grad_out = (ifd.zigzag_shard(torch.randn(shape, dtype=DTYPES[args.dtype]), rank,
                                          world) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, grad_out


def memory_task(rank, world, args):
    rows = []
    for seqlen in args.seq_lens:
        def train():
            out = ifd.zigzag_ring_flash_attn_func(q, k, v, causal=True)
            out.backward(grad_out)

        q, k, v, grad_out = _shards(args, rank, world, seqlen, requires_grad=True)
        train()  # kernels built and loaded, launch plans made: not part of the peak
        q.grad = k.grad = v.grad = None
        dist.barrier()
        with torch.no_grad():
            forward = peak_during(lambda: ifd.zigzag_ring_flash_attn_func(q, k, v, causal=True))
        dist.barrier()
        training = peak_during(train)
        rows.append(dict(seqlen=seqlen, world=world, rank=rank, local_tokens=q.shape[1],
                         input_bytes=sum(t.numel() * t.element_size() for t in (q, k, v, grad_out)),
                         forward_peak_bytes=forward, train_peak_bytes=training))
    return rows


def overlap_task(rank, world, args):
    """Times of one non-causal ring step on each rank (seconds, best of the repeats)."""
    seqlen = args.seq_lens[-1]
    q, k, v, _ = _shards(args, rank, world, seqlen)
    comm = RingComm(dist.group.WORLD)
    lengths = [q.shape[1]] * world
    plans = _ring_op._plans("zigzag", tuple(lengths), rank, False, (-1, -1))
    problem = _ring_engine.RingProblem(comm, [list(p) for p in plans], lengths,
                                       args.head_dim ** -0.5, 0.0)
    owner = (rank - 1) % world  # the step after the first: another rank's shard
    shard = [k.contiguous(), v.contiguous()]

    def kernel():
        for call in problem.plans[owner]:
            _ring_engine._block_forward(problem, q, *shard, call, False)

    def exchange():
        return comm.exchange(shard, [torch.empty_like(t) for t in shard])

    def step():
        pending = exchange()
        kernel()
        pending.wait()

    variants = {"kernel": kernel, "exchange": lambda: exchange().wait(), "step": step}
    times = {name: [] for name in variants}
    for name, fn in variants.items():  # warm-up
        fn()
    for _ in range(args.repeats):  # interleaved: the machine's load drifts
        for name, fn in variants.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def balance(args):
    """Per rank of a causal call: pairs attended (all heads and batches) and forward kernel
    seconds (best of the repeats), for zigzag and the plain ring."""
    seqlen = args.seq_lens[-1]
    rows = []
    for world in [w for w in args.worlds if w > 1]:
        lengths = tuple([seqlen // world] * world)
        for kind in ("zigzag", "contiguous"):
            for rank in range(world):
                q, k, v, _ = _shards(args, rank, world, seqlen)
                plans = _ring_op._plans(kind, lengths, rank, True, (-1, -1))
                problem = _ring_engine.RingProblem(None, [list(p) for p in plans], list(lengths),
                                                   args.head_dim ** -0.5, 0.0)
                calls = [c for p in problem.plans for c in p]
                pairs = sum(c.visible_pairs() for c in calls) * args.batch * args.heads
                best = float("inf")
                for _ in range(args.repeats + 1):  # the first builds the kernels
                    start = time.perf_counter()
                    for call in calls:
                        _ring_engine._block_forward(problem, q, k, v, call, False)
                    best = min(best, time.perf_counter() - start)
                rows.append(dict(world=world, kind=kind, rank=rank, pairs=pairs,
                                 kernel_seconds=best, calls=len(calls)))
    return rows


def _relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _spread(values):
    mean = statistics.fmean(values)
    return max(abs(x - mean) for x in values) / mean


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 4096],
                        help="whole-sequence lengths (a multiple of 2P)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "distributed_ring.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"B={args.batch}, H={args.heads}, D={args.head_dim}, {args.dtype}; ranks on "
          f"{machine()['cpu']} ({machine()['cores']} cores), gloo over loopback")

    memory = [row for world in args.worlds for rank_rows in run_world(world, memory_task, args, 3600)
              for row in rank_rows]
    print("\nPeak resident memory per rank above its inputs, zigzag causal (MiB; per local "
          "token in KiB)")
    print(f"{'N':>6} {'P':>3} {'tokens/rank':>11} {'inputs':>8} {'forward':>8} {'fwd+bwd':>8} "
          f"{'fwd+bwd/token':>13}")
    for seqlen in args.seq_lens:
        for world in args.worlds:
            rows = [r for r in memory if r["seqlen"] == seqlen and r["world"] == world]
            worst = max(rows, key=lambda r: r["train_peak_bytes"])
            print(f"{seqlen:>6} {world:>3} {worst['local_tokens']:>11} "
                  f"{worst['input_bytes'] / 2**20:>8.1f} "
                  f"{max(r['forward_peak_bytes'] for r in rows) / 2**20:>8.1f} "
                  f"{worst['train_peak_bytes'] / 2**20:>8.1f} "
                  f"{worst['train_peak_bytes'] / worst['local_tokens'] / 1024:>13.1f}")

    work = balance(args)
    print(f"\nCausal work per rank, N={args.seq_lens[-1]}: pairs attended and forward kernel "
          "time (each rank's calls run alone)")
    print(f"{'P':>3} {'layout':>10} {'pairs/rank (M)':>30} {'pairs spread':>12} "
          f"{'kernel ms/rank':>30} {'time spread':>11}")
    for world in sorted({r["world"] for r in work}):
        for kind in ("zigzag", "contiguous"):
            rows = [r for r in work if r["world"] == world and r["kind"] == kind]
            pairs, secs = [r["pairs"] for r in rows], [r["kernel_seconds"] for r in rows]
            print(f"{world:>3} {kind:>10} {' '.join(f'{p / 1e6:.1f}' for p in pairs):>30} "
                  f"{_spread(pairs):>11.1%} {' '.join(f'{1e3 * s:.0f}' for s in secs):>30} "
                  f"{_spread(secs):>10.1%}")

    overlap = run_world(2, overlap_task, args, 3600)
    print(f"\nOne ring step at 2 ranks, N={args.seq_lens[-1]}, not causal (ms, best of "
          f"{args.repeats})")
    print(f"{'rank':>4} {'kernel':>8} {'exchange':>9} {'step':>8} {'step/kernel':>12} "
          f"{'step/(kernel+exchange)':>23}")
    for rank, row in enumerate(overlap):
        print(f"{rank:>4} {1e3 * row['kernel']:>8.1f} {1e3 * row['exchange']:>9.1f} "
              f"{1e3 * row['step']:>8.1f} {row['step'] / row['kernel']:>11.2f}x "
              f"{row['step'] / (row['kernel'] + row['exchange']):>22.2f}x")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine(torch=torch.__version__, backend="gloo",
                           rank_device="SYCL CPU device, DPCPP_CPU_NUM_CUS="
                           + os.environ["DPCPP_CPU_NUM_CUS"]),
        "args": {k: (_relative(v) if isinstance(v, Path) else v)
                 for k, v in vars(args).items()},
        "memory": memory, "balance": work, "overlap": overlap}, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
