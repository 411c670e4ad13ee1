"""Launch plans kept per call signature (C.LaunchPlan, sycl_src/host/plans/launch_plan.hpp).

An entry point's first call of a signature (shapes, strides, dtypes, devices, address
alignments, flags) goes through its general path, whose checks raise the errors; a plan is
then built from the same arguments, and later calls of that signature are a lookup, the
outputs' allocation and one crossing into C++ with the tensors' addresses, on the CPU device or
the XPU stream's queue alike. Checks of values (a KV cache's lengths, its block table) still
run on every call: in C++ where the device shares host memory; elsewhere by a kernel, after
the attention without the host waiting (a flash_attn_with_kvcache decode step), or before it
as one read the host waits for (cache_values_mode). A plan fixes the kernel (decode or
general), not its variant, which each launch chooses (IPEX_FLASH_MATRIX included)."""
from __future__ import annotations

import os
import warnings
from typing import Callable, Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.ops import launch

Tensor = torch.Tensor

# Signatures a process meets are few (one per layer shape and batch size in a model); the cap
# only guards against a workload whose shapes never repeat.
MAX_PLANS = 512
_PLANS: dict = {}


def tensor_signature(t: Optional[Tensor]) -> tuple:
    """What a plan depends on in a tensor: all but its data. The address's alignment matters
    too: it decides whether the decode kernel's word loads serve a 16-bit tensor."""
    if t is None:
        return ()
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def cached(key: tuple) -> Optional["C.LaunchPlan"]:
    return _PLANS.get(key)


def remember(key: tuple, build: Callable[[], Optional["C.LaunchPlan"]]) -> None:
    """Builds and keeps the plan of `key` after a general call of that signature succeeded;
    build returns None for a signature the plans do not serve."""
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    try:
        _PLANS[key] = build() or False  # False: looked at, not served
    except (RuntimeError, TypeError, ValueError) as error:
        # The call itself succeeded: its signature keeps the general path, and says why once.
        _PLANS[key] = False
        warnings.warn(f"ipex_flash: no launch plan for a call signature, which keeps the "
                      f"general path: {error}", RuntimeWarning, stacklevel=3)


def clear() -> None:
    _PLANS.clear()


def new_plan(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             options: "C.AttentionOptions", num_splits: int = 0, min_keys: int = 0,
             max_keys: int = -1) -> "C.LaunchPlan":
    """A plan for q, out (B, Hq, Nq, D) and k, v (B, Hkv, Nk, D) views (or a cache seen so),
    lse (B, Hq, Nq), and options as the general path builds them."""
    return C.LaunchPlan(launch.view(q), launch.view(k), launch.view(v), launch.view(out),
                        launch.view(lse), options,
                        # (splits past one per key block are empty: any count above that
                        # runs as that count, however large)
                        C.PlanLimits(min(num_splits, 2**31 - 1), min_keys, max_keys),
                        launch.queue_handle(q.device))


def address(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def run(plan: "C.LaunchPlan", q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
        alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
        seqlens_k: Optional[Tensor] = None, block_table: Optional[Tensor] = None,
        k_start: Optional[Tensor] = None, k_new: Optional[Tensor] = None,
        v_new: Optional[Tensor] = None, descales: tuple = (None, None),
        rotary: tuple = (None, None), attn_mask: Optional[Tensor] = None,
        cu_seqlens: tuple = (None, None), max_len_k: int = -1,
        max_keys: Optional[int] = None) -> bool:
    """Runs `plan` on these tensors (the layouts it was built for); False when a cache's values
    are out of range or no key is attended to (nothing launched: the general path takes the
    call). lse None: the caller has no use for it (it stays in the plan's scratch). descales:
    an FP8 cache's (k_descale, v_descale) as fp8_quant.descales gives them. rotary: the
    (rotary_cos, rotary_sin) tables. attn_mask: SDPA's mask, read through the strides the plan
    was built with. cu_seqlens: packed sequences' (cu_seqlens_q, cu_seqlens_k), whose values
    packed_values checks on a device that does not share host memory (C++ reads them on the CPU
    device). max_len_k: see cache_values_mode. max_keys: the call's bound of each sequence's
    keys (a serving call's max_seqlen_k) from this run on, where the plan's signature leaves it
    out; None keeps the plan's."""
    return plan.run(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), address(lse),
                    address(alibi_slopes), address(sinks), address(descales[0]),
                    address(descales[1]), address(seqlens_k),
                    address(block_table), address(k_start), address(k_new), address(v_new),
                    address(rotary[0]), address(rotary[1]), address(attn_mask),
                    address(cu_seqlens[0]), address(cu_seqlens[1]), max_len_k,
                    launch.queue_handle(q.device),
                    C.LaunchPlan.PLAN_BOUND if max_keys is None else max_keys)


# IPEX_FLASH_SYNC_CACHE_CHECKS=1: every decode step reads its cache's values before launching
# (READ_ON_DEVICE) and raises at once, at the cost of waiting for the device each step.
SYNC_CACHE_CHECKS = os.environ.get("IPEX_FLASH_SYNC_CACHE_CHECKS", "0") == "1"


def cache_values_mode(plan: "C.LaunchPlan", device: torch.device) -> int:
    """max_len_k for LaunchPlan.run of a KV-cache plan: -1 where C++ reads the cache's values
    from host memory (the CPU device); elsewhere CHECK_ON_DEVICE where the plan allows it (a
    flash_attn_with_kvcache decode step, or the serving call's step of one token per sequence:
    the host never waits for the device; a value out of
    range gives NaN output, and the next call on the device raises the ValueError naming the
    argument), else READ_ON_DEVICE (one kernel reads them, and the host waits for it)."""
    if reads_host_memory(device):
        return -1
    if not SYNC_CACHE_CHECKS and plan.checks_on_device:
        return C.LaunchPlan.CHECK_ON_DEVICE
    return C.LaunchPlan.READ_ON_DEVICE


def reads_host_memory(device: torch.device) -> bool:
    """Whether the kernels' device shares host memory, so that C++ reads a cache's lengths
    itself (the SYCL CPU device); on a GPU a kernel does (cache_values_mode)."""
    return device.type == "cpu"


def uniform_sequences(cu_seqlens: Tensor, batch: int, length: int) -> bool:
    """cu_seqlens (contiguous) is 0, length, 2 * length, ...: read by C++ where the device shares
    host memory, else from one read of the device."""
    if reads_host_memory(cu_seqlens.device):
        return C.uniform_sequences(cu_seqlens.data_ptr(), batch, length)
    expected = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32,
                            device=cu_seqlens.device)
    return bool(torch.equal(cu_seqlens, expected))


def packed_values(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, q: Tensor, k: Tensor,
                  max_seqlen_q: int, max_seqlen_k: int, queries: int = 0) -> int:
    """max_len_k for LaunchPlan.run of packed sequences, q (total_q, ...) and k (total_k, ...),
    on a device that does not share host memory, from one read: the most keys a sequence has,
    or -1 where the offsets are not valid (from 0, never decreasing, no sequence longer than
    max_seqlen_q / max_seqlen_k, ending within q and k; the general path then names the
    argument) or, for a plan of `queries` queries per sequence (LaunchPlan.packed_queries), the
    sequences are not such or one has fewer keys than queries (the general path serves it)."""
    offsets = torch.cat([cu_seqlens_q, cu_seqlens_k]).tolist()
    cu_q, cu_k = offsets[:len(cu_seqlens_q)], offsets[len(cu_seqlens_q):]
    lengths_q, lengths_k = ([b - a for a, b in zip(cu, cu[1:])] for cu in (cu_q, cu_k))
    fits = (cu_q[0] == 0 == cu_k[0] and cu_q[-1] <= q.shape[0] and cu_k[-1] <= k.shape[0]
            and all(0 <= n <= max_seqlen_q for n in lengths_q)
            and all(0 <= n <= max_seqlen_k for n in lengths_k))
    if queries:
        fits = fits and all(n == queries for n in lengths_q) and min(lengths_k) >= queries
    return max(lengths_k) if fits else -1
