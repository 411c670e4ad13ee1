"""Shared by the distributed tests (test_distributed_*.py): a world of P ranks spawned once and
reused by many cases, the float64 reference in flash-attn's layout, and the pass rule.

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
        scores = scores - alibi.to(dtype).view(1, -1, 1, 1) * distance.abs().to(dtype)
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


def _leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def fixed_length_case(rank, world, api, dtype, causal=False, window=(-1, -1), heads=(4, 2),
                      head_dim=32, seqlen=64, batch=2, softcap=0.0, sinks=False, alibi=False,
                      lengths=None, subgroup_size=None, seed=0):
    """Forward and gradients of this rank's shard through `api`, against the whole batch in
    one process (flash_attn_func) and in float64: {name: (error vs float64, error vs one
    process, torch's error at the inputs' precision, largest true value)}.
    subgroup_size: the world is cut into groups of that many consecutive ranks, each running
    its own batch through group=."""
    group = None
    if subgroup_size is not None:  # every rank takes part in creating every group
        groups = [dist.new_group(list(range(first, first + subgroup_size)))
                  for first in range(0, world, subgroup_size)]
        group = groups[rank // subgroup_size]
        seed += rank // subgroup_size
        rank, world = dist.get_rank(group), subgroup_size
    torch.manual_seed(seed)  # every rank (of the group) draws the same whole batch
    hq, hkv = heads
    q = torch.randn(batch, seqlen, hq, head_dim, dtype=dtype)
    k = torch.randn(batch, seqlen, hkv, head_dim, dtype=dtype)
    v = torch.randn(batch, seqlen, hkv, head_dim, dtype=dtype)
    grad_out = torch.randn(batch, seqlen, hq, head_dim, dtype=dtype)
    sink = torch.randn(hq) if sinks else None
    slopes = torch.rand(hq) * 0.3 if alibi else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    cut = lambda t: shard(t, rank, world, api, lengths)  # noqa: E731

    local = _leaves(*(cut(t) for t in (q, k, v)), sink)
    out = FUNCTIONS[api](*local[:3], **options, sinks=local[3], group=group)
    out.backward(cut(grad_out))
    got = [out] + [t.grad for t in local if t is not None]
    if sinks:  # each rank's part of the replicated parameter's gradient, summed
        dist.all_reduce(got[-1], group=group)
    single = _leaves(q, k, v, sink)
    single_out = ipex_flash.flash_attn_func(*single[:3], **options, sinks=single[3])
    single_out.backward(grad_out)
    singles = [single_out] + [t.grad for t in single if t is not None]
    wants = {}
    for precision in (torch.float64, dtype):
        ref = _leaves(q.to(precision), k.to(precision), v.to(precision), sink)
        ref_out = reference(*ref[:3], causal, window, softcap, ref[3], slopes, precision)
        ref_out.backward(grad_out.to(precision))
        wants[precision] = [ref_out] + [t.grad for t in ref if t is not None]
    results = {}
    for i, name in enumerate(["out", "dq", "dk", "dv"] + (["dsinks"] if sinks else [])):
        part = (lambda t: t) if name == "dsinks" else cut
        truth = part(wants[torch.float64][i])
        assert got[i].shape == truth.shape, (name, got[i].shape, truth.shape)
        assert got[i].dtype == (torch.float32 if name == "dsinks" else dtype)
        results[name] = (max_error(got[i], truth), max_error(got[i], part(singles[i])),
                         max_error(part(wants[dtype][i]), truth), truth.abs().max().item())
    return results
