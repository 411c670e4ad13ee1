"""What one rank of benchmark_distributed.py does: build its shard of a fixed batch for each
method, run warm training steps (forward + backward of the attention alone), and measure the
step's time, the bytes the rank sends and its peak resident memory.

Bytes sent are counted by wrapping torch.distributed's entry points for one warm step (after
the agreement between ranks is learned, so only the data's exchanges remain) and summing the
payload leaving this rank: a point-to-point send's tensor; an all_gather's input, once to
each of the P-1 other ranks; (P-1)/P of a reduce_scatter's input; the rows of an
all_to_all_single's input bound for other ranks.

Peak memory: the resident set's high-water mark (VmHWM, reset through /proc/self/clear_refs)
during a step (the most of three), above the resident set before it (which holds the rank's inputs); glibc is
told to unmap freed blocks over 64 KiB (MALLOC_MMAP_THRESHOLD_, set by the driver before
the ranks start), so the resident set follows the tensors alive.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

import ipex_flash
from ipex_flash import distributed as ifd
from ipex_flash.distributed.usp import PROCESS_GROUPS
from rank_world import peak_during

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ONE_PROCESS = {"ring": "flash_attn_func", "zigzag": "flash_attn_func", "usp": "flash_attn_func",
               "llama3": "flash_attn_varlen_func",
               "ring_window": "flash_attn_func_window"}  # each method's one-process counterpart
ORDER = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_func_window", "ring",
         "zigzag", "usp", "llama3", "ring_window"]


def packed_lengths(total: int) -> list[int]:
    """The packed batch of the varlen runs: four sequences of unequal length, summing to
    total (so sequences cross the ranks' slices)."""
    parts = [5, 3, 6, 2]
    cuts = [total * sum(parts[:i]) // sum(parts) for i in range(len(parts) + 1)]
    return [b - a for a, b in zip(cuts, cuts[1:])]


class SentBytes:
    """Counts the payload this rank sends through torch.distributed while active."""

    def __init__(self):
        self.bytes, self.calls, self._saved = 0, {}, []

    def _others(self, kwargs) -> int:
        return dist.get_world_size(kwargs.get("group")) - 1

    def _payload(self, name, args, kwargs) -> int:
        if name == "batch_isend_irecv":
            return sum(op.tensor.nbytes for op in args[0] if op.op.__name__ == "isend")
        if name in ("all_gather", "all_gather_into_tensor", "all_gather_single"):
            return args[1].nbytes * self._others(kwargs)
        if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
            return args[1].nbytes * self._others(kwargs) // (self._others(kwargs) + 1)
        if name == "all_to_all_single":
            source = args[1]
            splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
            group = kwargs.get("group")
            world, rank = dist.get_world_size(group), dist.get_rank(group)
            if not splits:
                return source.nbytes * (world - 1) // world
            return source.nbytes * (sum(splits) - splits[rank]) // max(1, sum(splits))
        raise AssertionError(f"unexpected torch.distributed.{name} in a warm step")

    def __enter__(self):
        names = ("batch_isend_irecv", "all_gather", "all_gather_into_tensor",
                 "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
                 "all_to_all_single", "all_reduce", "broadcast")
        for name in (n for n in names if hasattr(dist, n)):  # the *_single names: torch 2.13
            original = getattr(dist, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                self.bytes += self._payload(_name, args, kwargs)
                self.calls[_name] = self.calls.get(_name, 0) + 1
                return _original(*args, **kwargs)
            setattr(dist, name, counted)
            self._saved.append((name, original))
        return self

    def __exit__(self, *exc):
        for name, original in reversed(self._saved):
            setattr(dist, name, original)


def _whole(args, dtype, seed=0):
    """The whole batch every rank draws alike: q, k, v, dO (1, N, H or Hkv, D)."""
    generator = torch.Generator().manual_seed(seed)
    n, (hq, hkv), d = args.seq_len, args.heads, args.head_dim
    shapes = [(1, n, hq, d), (1, n, hkv, d), (1, n, hkv, d), (1, n, hq, d)]
    return [torch.randn(s, generator=generator).to(dtype) for s in shapes]


def _leaves(tensors):
    q, k, v, grad_out = (t.contiguous().clone() for t in tensors)
    return [t.requires_grad_() for t in (q, k, v)] + [grad_out]


def build(method: str, args, dtype, rank: int, world: int):
    """(step function, local tokens, input bytes) for this rank: step() runs one forward and
    backward of `method` on this rank's shard."""
    whole = _whole(args, dtype)
    packed = method in ("llama3", "flash_attn_varlen_func")
    if packed:
        lengths = packed_lengths(args.seq_len)
        cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                          dtype=torch.int32)
        whole = [t[0] for t in whole]  # (total, H, D)
    # The windowed pair: a causal window of N/8 tokens, shorter than a shard at 4 ranks, so
    # the ring exchanges with its left neighbour only (_window_exchange.py).
    window = (args.seq_len // 8, 0) if method.endswith("_window") else (-1, -1)
    if method in ("flash_attn_func", "flash_attn_func_window"):
        q, k, v, grad_out = _leaves(whole)
        call = lambda: ipex_flash.flash_attn_func(  # noqa: E731
            q, k, v, causal=True, window_size=window)
    elif method == "flash_attn_varlen_func":
        q, k, v, grad_out = _leaves(whole)
        longest = max(lengths)
        call = lambda: ipex_flash.flash_attn_varlen_func(  # noqa: E731
            q, k, v, cu, cu, longest, longest, causal=True)
    elif method in ("ring", "zigzag", "ring_window"):
        cut = ifd.zigzag_shard if method == "zigzag" else ifd.contiguous_shard
        q, k, v, grad_out = _leaves(cut(t, rank, world) for t in whole)
        fn = (ifd.zigzag_ring_flash_attn_func if method == "zigzag" else ifd.ring_flash_attn_func)
        call = lambda: fn(q, k, v, causal=True, window_size=window)  # noqa: E731
    elif method == "llama3":
        part = args.seq_len // world
        q, k, v, grad_out = _leaves(t[rank * part:(rank + 1) * part] for t in whole)
        cu_q, cu_k, max_q, max_k, k_slice = ifd.llama3_flash_attn_prepare_cu_seqlens(
            cu, causal=True, rank=rank, world_size=world)
        call = lambda: ifd.llama3_flash_attn_varlen_func(  # noqa: E731
            q, k, v, cu_q, cu_k, max_q, max_k, heads_k_stride=args.heads_k_stride,
            local_k_slice=k_slice, causal=True)
    elif method == "usp":
        ulysses, ring = PROCESS_GROUPS["ulysses"], PROCESS_GROUPS["ring"]  # the driver's 2 x 2
        u_rank, r_rank = dist.get_rank(ulysses), dist.get_rank(ring)
        u_size, r_size = dist.get_world_size(ulysses), dist.get_world_size(ring)
        q, k, v, grad_out = _leaves(ifd.usp_shard(t, u_rank, u_size, r_rank, r_size, "zigzag")
                                    for t in whole)
        call = lambda: ifd.usp_flash_attn_func(  # noqa: E731
            q, k, v, causal=True, ulysses_group=ulysses, ring_group=ring,
            ring_impl_type="zigzag")
    else:
        raise ValueError(method)
    del whole

    def step():
        call().backward(grad_out)
        for t in (q, k, v):
            t.grad = None

    inputs = sum(t.nbytes for t in (q, k, v, grad_out))
    return step, q.shape[-3], inputs


def measure(method: str, args, dtype_name: str, rank: int, world: int) -> dict:
    """One method on this rank: warm-up, bytes of one counted step, peak memory of one step,
    then the timed steps (every rank starting together after a barrier)."""
    step, tokens, inputs = build(method, args, DTYPES[dtype_name], rank, world)
    step()  # kernels built, the ranks' agreement learned
    with SentBytes() as sent:
        step()
    dist.barrier()
    # The most of three steps: the count can only fall short (a step that reuses pages
    # already resident), never exceed.
    peak = max(peak_during(step) for _ in range(3))
    times = []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return dict(method=method, dtype=dtype_name, world=world, rank=rank, local_tokens=tokens,
                input_bytes=inputs, sent_bytes=sent.bytes, calls=sent.calls, peak_bytes=peak,
                step_seconds=times, median_seconds=statistics.median(times))
