"""Shared by the distributed tests (test_distributed_*.py): a world of P ranks spawned once and
reused by many cases, the float64 reference in flash-attn's layout, the pass rule, and a
case's pieces (the batch, padding, one process's and the reference's results, comparison).

Ranks are processes on this machine joined by gloo over loopback (GLOO_SOCKET_IFNAME=lo,
init through a file), each with one torch thread and one SYCL CPU compute unit, since the
test machine has two cores. A case is a module-level function run on every rank as
fn(rank, world_size, **kwargs); its return value (or its exception, with traceback) comes
back to the test.
"""
from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import tempfile
import time
import traceback

import ipex_flash  # before torch: its OpenMP settings
import torch
import torch.distributed as dist
from ipex_flash import distributed as ifd
from ipex_flash.reference import flash_visibility

GROUP_TIMEOUT = 60  # seconds: a collective that waits longer raises (init_process_group)
CASE_TIMEOUT = 240  # seconds the test waits for every rank's answer to one case


def _serve(rank, size, init_file, timeout, inbox, outbox):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout))
    while True:
        message = inbox.get()
        if message is None:
            break
        fn, kwargs = message
        try:
            outbox.put((rank, True, fn(rank, size, **kwargs)))
        except BaseException as error:  # noqa: BLE001  (reported to the test, which raises)
            outbox.put((rank, False, (type(error).__name__, str(error),
                                      traceback.format_exc())))
    dist.destroy_process_group()


class RankError(AssertionError):
    pass


class World:
    """P rank processes; run() sends a case to all and returns their results in rank order."""

    def __init__(self, size: int, timeout: int = GROUP_TIMEOUT):
        self.size = size
        context = multiprocessing.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="ipex_flash_dist_")
        init_file = os.path.join(self._dir.name, "init")
        self._inboxes = [context.Queue() for _ in range(size)]
        self._outbox = context.Queue()
        # Each rank's kernels on one compute unit of the SYCL CPU device (the runtime would
        # otherwise start a thread per core in every rank).
        os.environ.setdefault("DPCPP_CPU_NUM_CUS", "1")
        self._procs = [context.Process(target=_serve, daemon=True,
                                       args=(r, size, init_file, timeout, self._inboxes[r],
                                             self._outbox))
                       for r in range(size)]
        for proc in self._procs:
            proc.start()

    def run_raw(self, fn, timeout: float = CASE_TIMEOUT, **kwargs) -> list:
        """[(ok, result or (error type, message, traceback))] by rank; raises TimeoutError if
        a rank does not answer in time (a hang is a failure, never a wait)."""
        for inbox in self._inboxes:
            inbox.put((fn, kwargs))
        answers, deadline = {}, time.monotonic() + timeout
        while len(answers) < self.size:
            try:
                rank, ok, result = self._outbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(range(self.size)) - set(answers))
                raise TimeoutError(f"ranks {missing} gave no answer to {fn.__name__} within "
                                   f"{timeout} s") from None
            answers[rank] = (ok, result)
        return [answers[r] for r in range(self.size)]

    def run(self, fn, **kwargs) -> list:
        """Every rank's result; a rank's exception fails the test with its traceback."""
        answers = self.run_raw(fn, **kwargs)
        for rank, (ok, result) in enumerate(answers):
            if not ok:
                raise RankError(f"rank {rank} raised in {fn.__name__}:\n{result[2]}")
        return [result for _, result in answers]

    def close(self, broken: bool = False) -> None:
        """broken: a rank failed mid-call, so the group cannot be torn down cleanly."""
        for inbox in self._inboxes:
            inbox.put(None)
        for proc in self._procs:
            proc.join(timeout=1 if broken else 20)
            if proc.is_alive():  # a rank stuck in a broken group: ours to end
                proc.kill()
                proc.join()
        self._dir.cleanup()


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, sinks=None, alibi=None,
              dtype=torch.float64):
    """Attention in flash-attn's layout (B, N, H, D), with every step in `dtype`: float64 is
    the truth, the inputs' 16-bit dtype gives the yardstick of the pass rule (torch's own
    error at that precision). Differentiable in q, k, v and sinks."""
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    distance, visible = flash_visibility(q.shape[2], k.shape[2], causal, window)
    if alibi is not None:
        slopes = alibi.to(dtype).view(-1 if alibi.dim() == 2 else 1, alibi.shape[-1], 1, 1)
        scores = scores - slopes * distance.abs().to(dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to(dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
        v = torch.cat([v, torch.zeros_like(v[..., :1, :])], dim=-2)
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def max_error(got, want) -> float:
    return (got.double() - want.double()).abs().max().item() if got.numel() else 0.0


FLOOR = 1e-5  # float32 rounding of O(1) values


def bound(dtype, yardstick: float, scale: float) -> float:
    """The pass rule. float32: 1e-5 relative to the values' size. 16-bit (flash-attn's rule):
    twice torch's own error at that precision, plus a float32-sized floor."""
    if dtype == torch.float32:
        return FLOOR * max(1.0, scale)
    return 2 * yardstick + FLOOR * max(1.0, scale)


def check_errors(results: list, dtype) -> None:
    """results: per rank, {name: (error vs float64, error vs one process, yardstick, size)}.
    Against float64 the bound above; against the one-process result, which the same rule
    lets be that far from float64 too, twice it in 16-bit (each merged block's output is
    rounded to the dtype, so the two differ by a few of its ulps)."""
    for rank, errors in enumerate(results):
        for name, (vs_truth, vs_single, yardstick, scale) in errors.items():
            limit = bound(dtype, yardstick, scale)
            assert vs_truth <= limit, (rank, name, "vs float64", vs_truth, limit)
            single_limit = limit if dtype == torch.float32 else 2 * limit
            assert vs_single <= single_limit, (rank, name, "vs one process", vs_single,
                                               single_limit)


# A case's pieces: the whole batch, its one-process and reference results, the comparison.

def draw(prefix, heads, head_dim, dtype, sinks=False, seed=0):
    """q, k, v, dO of shape (*prefix, H or Hkv, head_dim) and the sinks (or None), drawn in
    that order after seeding: every rank (of a group) draws the same whole batch."""
    torch.manual_seed(seed)
    hq, hkv = heads
    q = torch.randn(*prefix, hq, head_dim, dtype=dtype)
    k, v = (torch.randn(*prefix, hkv, head_dim, dtype=dtype) for _ in range(2))
    grad_out = torch.randn(*prefix, hq, head_dim, dtype=dtype)
    return q, k, v, grad_out, (torch.randn(hq) if sinks else None)


def cu_seqlens(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def padded(t, rows, dim=0):
    """t with `rows` NaN rows after it along dim: packed padding past cu_seqlens[-1], which no
    result may read."""
    shape = list(t.shape)
    shape[dim] = rows
    return torch.cat([t, t.new_full(shape, float("nan"))], dim=dim)


def check_padding(name, pad, fill=0.0):
    """The rows past the sequences hold `fill` and no NaN: zero in the output and every
    gradient, -inf in the LSE without sinks."""
    assert torch.equal(pad, torch.full_like(pad, fill)), (
        f"{name}: pad rows hold {int(pad.isnan().sum())} NaN and "
        f"{int((pad != fill).sum())} values other than {fill} of {pad.numel()}")


def _leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def one_process(q, k, v, sink, grad_out, **options):
    """The whole batch through flash_attn_func: [out, dq, dk, dv (, dsinks)]."""
    single = _leaves(q, k, v, sink)
    out = ipex_flash.flash_attn_func(*single[:3], **options, sinks=single[3])
    out.backward(grad_out)
    return [out] + [t.grad for t in single if t is not None]


def one_process_varlen(q, k, v, sink, grad_out, lengths, pad=0, with_lse=False, **options):
    """The packed batch (total, H, D) through flash_attn_varlen_func with `pad` NaN rows after
    it: [out, dq, dk, dv (, dsinks)] of the real rows, and with_lse their LSE (else None)."""
    total, cu, longest = q.shape[0], cu_seqlens(lengths), max(lengths)
    single = _leaves(*(padded(t, pad) for t in (q, k, v)), sink)
    if with_lse:
        options["return_attn_probs"] = True
    result = ipex_flash.flash_attn_varlen_func(*single[:3], cu, cu, longest, longest, **options,
                                               sinks=single[3])
    out, lse = (result[0], result[1][:, :total]) if with_lse else (result, None)
    out.backward(padded(grad_out, pad))
    singles = [out[:total]] + [t.grad[:total] for t in single[:3]]
    return singles + ([single[3].grad] if sink is not None else []), lse


def references(q, k, v, sink, grad_out, dtype, causal, window=(-1, -1), softcap=0.0,
               slopes=None, cu=None):
    """{precision: [out, dq, dk, dv (, dsinks)]} of `reference` in float64 (the truth) and in
    dtype (the yardstick); with cu, a packed batch (total, H, D) one sequence at a time."""
    wants = {}
    for precision in (torch.float64, dtype):
        ref = _leaves(q.to(precision), k.to(precision), v.to(precision), sink)
        options = (causal, window, softcap, ref[3], slopes, precision)
        if cu is None:
            out = reference(*ref[:3], *options)
        else:
            out = torch.cat([reference(*(t[a:b].unsqueeze(0) for t in ref[:3]), *options)[0]
                             for a, b in zip(cu.tolist(), cu.tolist()[1:])])
        out.backward(grad_out.to(precision))
        wants[precision] = [out] + [t.grad for t in ref if t is not None]
    return wants


def compare(got, singles, wants, dtype, cut, sinks, lse_cut=None, check_dtypes=False):
    """This rank's out (, lse), dq, dk, dv (, dsinks) against its part (cut, lse_cut; the
    sinks' gradient whole) of the one-process results and the references: {name: (error vs
    float64, vs one process, torch's error in dtype, largest true value)} for check_errors.
    check_dtypes: out and the gradients in dtype, the rest in float32."""
    names = (["out"] + (["lse"] if lse_cut else []) + ["dq", "dk", "dv"]
             + (["dsinks"] if sinks else []))
    parts = {"lse": lse_cut, "dsinks": lambda t: t}
    results = {}
    for i, name in enumerate(names):
        part = parts.get(name) or cut
        truth = part(wants[torch.float64][i])
        assert got[i].shape == truth.shape, (name, got[i].shape, truth.shape)
        if check_dtypes:
            assert got[i].dtype == (dtype if name in ("out", "dq", "dk", "dv")
                                    else torch.float32), name
        results[name] = (max_error(got[i], truth), max_error(got[i], part(singles[i])),
                         max_error(part(wants[dtype][i]), truth), truth.abs().max().item())
    return results


# Fixed-length cases: ring, zigzag and Ulysses.

FUNCTIONS = {"ring": ifd.ring_flash_attn_func, "zigzag": ifd.zigzag_ring_flash_attn_func,
             "ulysses": ifd.ulysses_flash_attn_func}


def shard(x, rank, world, api, lengths=None):
    """This rank's shard along the sequence (dim 1): zigzag's, or consecutive slices (of the
    given lengths)."""
    if api == "zigzag":
        return ifd.zigzag_shard(x, rank, world)
    if lengths is not None:
        return x.split(lengths, dim=1)[rank]
    return ifd.contiguous_shard(x, rank, world)


def fixed_length_case(rank, world, api, dtype, causal=False, window=(-1, -1), heads=(4, 2),
                      head_dim=32, seqlen=64, batch=2, softcap=0.0, sinks=False, alibi=False,
                      lengths=None, subgroup_size=None, seed=0):
    """Forward and gradients of this rank's shard through `api`, against the whole batch in
    one process (flash_attn_func) and in float64: compare's result dict.
    subgroup_size: the world is cut into groups of that many consecutive ranks, each running
    its own batch through group=."""
    group = None
    if subgroup_size is not None:  # every rank takes part in creating every group
        groups = [dist.new_group(list(range(first, first + subgroup_size)))
                  for first in range(0, world, subgroup_size)]
        group = groups[rank // subgroup_size]
        seed += rank // subgroup_size
        rank, world = dist.get_rank(group), subgroup_size
    q, k, v, grad_out, sink = draw((batch, seqlen), heads, head_dim, dtype, sinks, seed)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    cut = lambda t: shard(t, rank, world, api, lengths)  # noqa: E731

    local = _leaves(*(cut(t) for t in (q, k, v)), sink)
    out = FUNCTIONS[api](*local[:3], **options, sinks=local[3], group=group)
    out.backward(cut(grad_out))
    got = [out] + [t.grad for t in local if t is not None]
    if sinks:  # each rank's part of the replicated parameter's gradient, summed
        dist.all_reduce(got[-1], group=group)
    singles = one_process(q, k, v, sink, grad_out, **options)
    wants = references(q, k, v, sink, grad_out, dtype, causal, window, softcap, slopes)
    return compare(got, singles, wants, dtype, cut, sinks, check_dtypes=True)
