"""Launch plans (ops/launch_plans.py) for the decode steps of a KV cache: flash_attn_with_kvcache
attending to a cache it does not append to, and the serving call (flash_attn_varlen_func with
a block_table) when every sequence of the step has the same few new tokens, packed one after
another: the decode step of a served batch. The first call of a signature takes the general
path (every check, the same errors); its repeats run the plan, with the cache's values (lengths,
pages, left pads) checked on every call: on the host where the device shares its memory, else
on the device (launch_plans.checked_on_device)."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ipex_flash._runtime import C
from ipex_flash.kvcache import fp8_quant
from ipex_flash.kvcache.cache_ops import cache_options, kvcache_outputs
from ipex_flash.ops import launch, launch_plans
from ipex_flash.ops.fast_path import plain_layout, plain_sinks
from ipex_flash.ops.launch_plans import tensor_signature as signature
from ipex_flash.ops.validation import check_window, softmax_scale as resolve_scale

Tensor = torch.Tensor
Outputs = tuple[Tensor, Tensor]


def kvcache_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                   v: Optional[Tensor], seqlens_k: Tensor,
                   block_table: Optional[Tensor], k_start: Optional[Tensor],
                   softmax_scale: Optional[float], causal: bool, window: tuple, softcap: float,
                   alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], num_splits: int,
                   k_descale: Optional[Tensor], v_descale: Optional[Tensor], rotary: tuple,
                   want_lse: bool, general: Callable[[], Outputs],
                   cache_batch_idx: Optional[Tensor] = None) -> Outputs:
    """(out, lse) of q (B, Nq, Hq, D) against the cache, after appending k, v (B, Nnew, Hkv,
    D) when given, by the plan of this signature, else by general() (which checks and runs the
    call); lse in natural log when want_lse, else left in the kernels' domain. rotary:
    (rotary_cos, rotary_sin, rotary_interleaved), the tables None without. cache_batch_idx
    (without block_table): each sequence's cache row, read as the general path reads it, as a
    table of one page of the whole capacity per sequence."""
    key = ("kvcache", softmax_scale, causal, window, softcap, num_splits, signature(q),
           signature(k_cache), signature(v_cache), signature(k), signature(v),
           signature(seqlens_k), signature(block_table), signature(cache_batch_idx),
           signature(k_start), signature(alibi_slopes), signature(sinks),
           signature(k_descale), signature(v_descale),
           signature(rotary[0]), signature(rotary[1]), rotary[2])
    if cache_batch_idx is not None and cache_batch_idx.dim() == 1:  # (others: general raises)
        block_table = cache_batch_idx.view(-1, 1)
    plan = launch_plans.cached(key)
    if plan:
        descales = _descales(q, k_cache, k_descale, v_descale)
        out, lse = launch.attention_outputs(q, v_cache.shape[3],
                                            (q.shape[0], q.shape[2], q.shape[1]), want_lse)
        if _run(plan, q, k_cache, v_cache, k, v, out, lse, alibi_slopes, sinks, seqlens_k,
                block_table, k_start, descales, rotary[:2]):
            return out, launch.natural_lse(lse, in_place=True) if want_lse else lse
    out, lse = general()
    if plan is None:
        launch_plans.remember(key, lambda: _plan(
            q, k_cache, v_cache, seqlens_k, block_table, k_start, softmax_scale, causal, window,
            softcap, alibi_slopes, sinks, num_splits, *kvcache_outputs(q, v_cache), k_new=k,
            v_new=v, descales=_descales(q, k_cache, k_descale, v_descale),
            rotary=(*rotary, causal or tuple(window) != (-1, -1))))
    return out, lse


def serving_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                   seqused_k: Tensor, block_table: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: Optional[float], causal: bool, window: tuple, softcap: float,
                   alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
                   k_descale: Optional[Tensor], v_descale: Optional[Tensor], num_splits: int,
                   out: Optional[Tensor], want_lse: bool) -> Optional[Outputs]:
    """(out (total_q, Hq, Dv), lse (Hq, total_q) in the exp2 domain, or None unless want_lse)
    of a serving call whose sequences all have max_seqlen_q new tokens, by the plan of this
    signature; None when there is none yet (the caller takes the general path, then calls
    remember_serving) or the call is not such a step. out: the caller's output (out=), written
    in place; its strides are part of the signature."""
    key = _serving_key(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                       max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, sinks,
                       k_descale, v_descale, num_splits, out)
    plan = launch_plans.cached(key)
    if not plan:
        return None
    max_len_k = launch_plans.cache_values_mode(plan, q.device)  # (and the queries' offsets)
    out, lse = _serving_outputs(q, v_cache, want_lse, out)
    descales = _descales(q, k_cache, k_descale, v_descale, block_table.shape[0])
    if launch_plans.run(plan, q, k_cache, v_cache, out, lse, alibi_slopes, sinks, seqused_k,
                        block_table, descales=descales, cu_seqlens=(cu_seqlens_q, None),
                        max_len_k=max_len_k, max_keys=max_seqlen_k):
        return out, lse
    return None


def remember_serving(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, sinks,
                     k_descale, v_descale, num_splits=0, out=None) -> None:
    """After a general serving call succeeded: the plan of its signature, when it is a decode
    step (every sequence max_seqlen_q new tokens, which see a key each: the split-KV decode
    kernel's rows). On an XPU a step of one token reads no value on the host (the values are
    checked after the attention, launch_plans.cache_values_mode); a step of more tokens waits
    for one read."""
    key = _serving_key(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                       max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, sinks,
                       k_descale, v_descale, num_splits, out)
    if launch_plans.cached(key) is not None:
        return
    batch = block_table.shape[0]

    def build():
        if not (1 <= max_seqlen_q <= C.max_sliced_decode_tokens(k_cache.shape[2])
                and q.shape[0] == batch * max_seqlen_q and cu_seqlens_q.is_contiguous()
                and launch_plans.uniform_sequences(cu_seqlens_q, batch, max_seqlen_q)):
            return None
        q4 = q.view(batch, max_seqlen_q, *q.shape[1:])
        # (an output of out's strides, which the plan's runs then write into)
        out_like, lse = _serving_outputs(q, v_cache, True, None if out is None else
                                         torch.empty_strided(out.shape, out.stride(),
                                                             dtype=out.dtype, device=out.device))
        if not out_like.is_contiguous():  # (the decode kernel's rows: (B, Nq, Hq, Dv) dense)
            return None
        plan = _plan(q4, k_cache, v_cache, seqused_k, block_table, None, softmax_scale, causal,
                     window, softcap, alibi_slopes, sinks, num_splits,
                     out_like.view(batch, max_seqlen_q, *out_like.shape[1:]),
                     lse.view(lse.shape[0], batch, max_seqlen_q).transpose(0, 1),
                     # (a one-token step's sequence with no key gets 0 and an LSE of -inf
                     # from the decode kernel as from the general path; with more tokens
                     # than keys, rows see no key the decode kernel does not serve)
                     min_keys=max_seqlen_q if max_seqlen_q > 1 else 0, max_keys=max_seqlen_k,
                     descales=_descales(q, k_cache, k_descale, v_descale, batch))
        if plan:
            plan.uniform_queries()
        return plan

    launch_plans.remember(key, build)


def _serving_key(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q,
                 max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, sinks,
                 k_descale, v_descale, num_splits, out) -> tuple:
    # (max_seqlen_k is left out: engines change it every step; each run passes it to the
    # plan, which bounds the step's keys by it)
    return ("serving", softmax_scale, causal, window, softcap, max_seqlen_q,
            num_splits, signature(out),
            signature(q), signature(k_cache), signature(v_cache),
            signature(cu_seqlens_q), signature(seqused_k), signature(block_table),
            signature(alibi_slopes), signature(sinks), signature(k_descale),
            signature(v_descale))


def _serving_outputs(q: Tensor, v_cache: Tensor, want_lse: bool = True,
                     out: Optional[Tensor] = None) -> Outputs:
    """out (total_q, Hq, Dv) (the caller's, else new) and lse (Hq, total_q), or None for an
    LSE the caller drops."""
    return launch.attention_outputs(q, v_cache.shape[3], (q.shape[1], q.shape[0]), want_lse,
                                    out)


def _descales(q, k_cache, k_descale, v_descale, batch=None) -> tuple:
    """An FP8 cache's descales as the kernels read them (fp8_quant.descales), for `batch`
    sequences (default q's); (None, None) otherwise."""
    if not fp8_quant.is_fp8(k_cache):
        return None, None
    return fp8_quant.descales("ipex_flash.flash_attn_with_kvcache", k_descale, v_descale, True,
                              q.shape[0] if batch is None else batch, k_cache.shape[2], q.device)


def _run(plan, q, k_cache, v_cache, k, v, out, lse, alibi_slopes, sinks, seqlens_k, block_table,
         k_start, descales, tables) -> bool:
    max_len_k = launch_plans.cache_values_mode(plan, q.device)
    return launch_plans.run(plan, q, k_cache, v_cache, out, lse, alibi_slopes, sinks, seqlens_k,
                            block_table, k_start, k, v, descales, tables, max_len_k=max_len_k)


def _plan(q, k_cache, v_cache, seqlens_k, block_table, k_start, softmax_scale, causal, window,
          softcap, alibi_slopes, sinks, num_splits, out, lse, min_keys=0, max_keys=-1,
          k_new=None, v_new=None, descales=(None, None), rotary=(None, None, True, True)):
    """The plan of a checked call of q (B, Nq, Hq, D), out (B, Nq, Hq, Dv) and lse (B, Hq, Nq)
    against the cache (after appending k_new, v_new; an FP8 cache's descales as _descales
    gives them; rotary: cos, sin, interleaved, whether query positions advance), or None
    where the general path adapts the inputs (copies, conversions)."""
    dense = (t for t in (seqlens_k, block_table, k_start, alibi_slopes) if t is not None)
    appended = [t for t in (k_new, v_new) if t is not None]
    cos, sin, interleaved, advance = rotary
    fp8 = fp8_quant.is_fp8(k_cache)
    if (any(t.dtype not in (k_cache.dtype, q.dtype if fp8 else k_cache.dtype) for t in appended)
            or (fp8 and descales[0] is None)
            or (cos is not None and not (
                q.is_contiguous() and cos.dtype in (torch.float32, q.dtype)
                and sin.dtype == cos.dtype and cos.stride() == sin.stride()
                and cos.stride(1) == 1))
            or not plain_layout(q, k_cache, v_cache, *appended) or not plain_sinks(sinks)
            or not all(t.is_contiguous() for t in dense)
            or (alibi_slopes is not None and alibi_slopes.dtype != torch.float32)):
        return None
    left, right = check_window("ipex_flash.flash_attn_with_kvcache", window)
    options = cache_options(resolve_scale(softmax_scale, q.shape[-1]), causal, left, right,
                            float(softcap), alibi_slopes, sinks, seqlens_k, 1, block_table,
                            k_cache.shape[1], *descales)
    if k_start is not None:
        options.k_start = launch.view(k_start)
    plan = launch_plans.new_plan(*(t.transpose(1, 2) for t in (q, k_cache, v_cache, out)), lse,
                                 options, num_splits, min_keys, max_keys)
    if appended:
        plan.append(*(launch.view(t.transpose(1, 2)) for t in appended))
    if cos is not None:
        if fp8 and not plan.appends_in_decode:  # (the append kernel rotates into 16-bit caches)
            return None
        plan.rotary(launch.view(cos), launch.view(sin), bool(interleaved), advance)
    return plan
