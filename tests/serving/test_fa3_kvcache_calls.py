"""flash_attn_with_kvcache called as flash-attn 3 and sgl-kernel define it and as SGLang's
flash-attention backend calls it (page_table, packed queries with cu_seqlens_q, appends with
cu_seqlens_k_new, return_softmax_lse, sinks, descales, the scheduling hints), against
float64."""
import pytest
import torch

import ipex_flash

from helpers.reference import OUTPUT_TOLERANCE
from helpers.engine_cases import SENTINEL, reference, sequence_keys

HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 64


def paged_cache(lengths, page_size, dtype):
    """A shuffled pool of pages, one page more per sequence than its keys need."""
    width = max(-(-n // page_size) for n in lengths) + 1
    pool = len(lengths) * width
    k_cache = torch.randn(pool, page_size, HEADS_KV, HEAD_DIM, dtype=dtype)
    v_cache = torch.randn(pool, page_size, HEADS_KV, HEAD_DIM, dtype=dtype)
    table = torch.randperm(pool).view(len(lengths), width)
    return k_cache, v_cache, table.to(torch.int32)


def packed_queries(lengths_q, dtype):
    q = torch.randn(sum(lengths_q), HEADS_Q, HEAD_DIM, dtype=dtype)
    cu = torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)
    return q, cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths_q", [[1, 1, 1], [3, 1, 17]])
def test_sglang_paged_call(dtype, lengths_q):
    """SGLang's decode and extend steps: the cache already holds the step's keys
    (cache_seqlens counts them); packed q; sinks; the hints it passes."""
    seqlens = [40, 17, 90]
    k_cache, v_cache, table = paged_cache(seqlens, 16, dtype)
    q, cu = packed_queries(lengths_q, dtype)
    sinks = torch.randn(HEADS_Q)
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q=q, k_cache=k_cache, v_cache=v_cache, page_table=table,
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32), cu_seqlens_q=cu,
        cu_seqlens_k_new=None, max_seqlen_q=max(lengths_q), softmax_scale=HEAD_DIM ** -0.5,
        causal=True, window_size=(-1, -1), softcap=0.0, k_descale=None, v_descale=None,
        return_softmax_lse=True, sinks=sinks, scheduler_metadata=None, num_splits=0,
        pack_gqa=None, sm_margin=0)
    assert out.shape == (sum(lengths_q), HEADS_Q, HEAD_DIM) and lse.shape == (HEADS_Q, q.shape[0])
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, n_k in enumerate(seqlens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref_out, ref_lse = reference(q[rows].double(), sequence_keys(k_cache, table[b], n_k).double(),
                                     sequence_keys(v_cache, table[b], n_k).double(), sinks=sinks)
        torch.testing.assert_close(out[rows].double(), ref_out, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[:, rows].double(), ref_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("paged", [True, False])
def test_packed_append_with_cu_seqlens_k_new(paged):
    """flash-attn 3's varlen append: k, v packed (total_new, Hkv, D) written at
    cache_seqlens[b] of each sequence (paged, or contiguous rows through cache_batch_idx),
    then attended to; nothing else in the cache changes; out= written in place."""
    old, new = [10, 0, 33], [3, 1, 6]
    if paged:
        k_cache, v_cache, table = paged_cache([o + n for o, n in zip(old, new)], 16,
                                              torch.float32)
        where = dict(page_table=table)
        keys_of = lambda cache, b, n: sequence_keys(cache, table[b], n)  # noqa: E731
    else:
        k_cache, v_cache = (torch.randn(4, 64, HEADS_KV, HEAD_DIM) for _ in range(2))
        rows = torch.tensor([2, 0, 3], dtype=torch.int32)
        where = dict(cache_batch_idx=rows)
        keys_of = lambda cache, b, n: cache[int(rows[b]), :n]  # noqa: E731
    k_before = k_cache.clone()
    q, cu = packed_queries(new, torch.float32)
    k_new, v_new = (torch.randn(sum(new), HEADS_KV, HEAD_DIM) for _ in range(2))
    out = torch.full((sum(new) + 2, HEADS_Q, HEAD_DIM), SENTINEL)
    result = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new,
        cache_seqlens=torch.tensor(old, dtype=torch.int32), cu_seqlens_q=cu,
        cu_seqlens_k_new=cu, max_seqlen_q=max(new), causal=True, out=out[:sum(new)], **where)
    assert result.data_ptr() == out.data_ptr() and (out[sum(new):] == SENTINEL).all()
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b, (n_old, n_new) in enumerate(zip(old, new)):
        rows_q = slice(int(cu[b]), int(cu[b + 1]))
        k_seq, v_seq = keys_of(k_cache, b, n_old + n_new), keys_of(v_cache, b, n_old + n_new)
        torch.testing.assert_close(k_seq[:n_old], keys_of(k_before, b, n_old), rtol=0, atol=0)
        torch.testing.assert_close(k_seq[n_old:], k_new[rows_q], rtol=0, atol=0)
        torch.testing.assert_close(v_seq[n_old:], v_new[rows_q], rtol=0, atol=0)
        ref, _ = reference(q[rows_q].double(), k_seq.double(), v_seq.double())
        torch.testing.assert_close(out[rows_q].double(), ref, rtol=1e-5, atol=1e-5)
        written |= _positions(k_cache, keys_of, b, n_old, n_old + n_new)
    untouched = ~written
    assert torch.equal(k_cache[untouched], k_before[untouched])


def _positions(cache, keys_of, b, start, stop):
    """Which (page or row, slot) entries of the cache hold sequence b's keys start..stop."""
    index = torch.arange(cache.shape[0] * cache.shape[1]).view(cache.shape[0], cache.shape[1])
    chosen = keys_of(index[..., None, None], b, stop)[start:].flatten()
    mask = torch.zeros(cache.shape[0] * cache.shape[1], dtype=torch.bool)
    mask[chosen] = True
    return mask.view(cache.shape[:2])


@pytest.mark.parametrize("quantised", [False, True])
@pytest.mark.parametrize("packed", [True, False])
def test_fp8_cache_append_and_descales(packed, quantised):
    """flash-attn 3's FP8 call: 16-bit k, v appended are stored divided by their descales, k, v
    already FP8 are stored as given; an FP8 q's q_descale folds into the scores; the descales
    in SGLang's (batch, nheads_k) expanded form; packed (cu_seqlens_k_new) and 4-D q alike."""
    old, new = [20, 5], [2, 2]
    k_cache, v_cache, table = paged_cache([o + n for o, n in zip(old, new)], 16, torch.float32)
    fp8 = torch.float8_e4m3fn
    k_cache, v_cache = k_cache.to(fp8), v_cache.to(fp8)
    q, cu = packed_queries(new, torch.bfloat16)
    q8 = q.to(fp8)
    k_new, v_new = (torch.randn(sum(new), HEADS_KV, HEAD_DIM, dtype=torch.bfloat16)
                    for _ in range(2))
    k_scale, v_scale, q_scale = 0.5, 0.25, 2.0
    if quantised:  # (what the cache is to hold)
        k_new, v_new = (k_new.double() / k_scale).to(fp8), (v_new.double() / v_scale).to(fp8)
    stored_k = k_new if quantised else (k_new.double() / k_scale).to(fp8)
    shape = dict(cu_seqlens_q=cu, cu_seqlens_k_new=cu, max_seqlen_q=2) if packed else {}
    as_call = (lambda t: t) if packed else (lambda t: t.view(2, 2, *t.shape[1:]))
    out = ipex_flash.flash_attn_with_kvcache(
        as_call(q8), k_cache, v_cache, k=as_call(k_new), v=as_call(v_new), page_table=table,
        cache_seqlens=torch.tensor(old, dtype=torch.int32), causal=True,
        q_descale=torch.tensor([q_scale]).expand(2, HEADS_KV),
        k_descale=torch.tensor([k_scale]).expand(2, HEADS_KV),
        v_descale=torch.tensor([v_scale]).expand(2, HEADS_KV), **shape).reshape(q.shape)
    assert out.dtype == torch.bfloat16
    for b, (n_old, n_new) in enumerate(zip(old, new)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        k_seq = sequence_keys(k_cache, table[b], n_old + n_new).double()
        v_seq = sequence_keys(v_cache, table[b], n_old + n_new).double()
        assert torch.equal(k_seq[n_old:], stored_k[rows].double())
        ref, _ = reference(q8[rows].double() * q_scale, k_seq * k_scale, v_seq * v_scale)
        torch.testing.assert_close(out[rows].double(), ref, rtol=1e-2, atol=1e-2)


def _args(**change):
    k_cache, v_cache, table = paged_cache([20, 9], 16, torch.float32)
    q, cu = packed_queries([1, 2], torch.float32)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=table,
                cache_seqlens=torch.tensor([20, 9], dtype=torch.int32), cu_seqlens_q=cu,
                max_seqlen_q=2, causal=True)
    args.update(change)
    return args


@pytest.mark.parametrize("change,error,match", [
    (dict(qv=torch.zeros(3, 8, 32)), ValueError, r"qv must have q's shape .*\(3, 8, 64\)"),
    (dict(attention_chunk=128), ValueError, "attention_chunk must be 0"),
    (dict(rotary_seqlens=torch.zeros(2, dtype=torch.int32)), ValueError, "rotary_seqlens"),
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError,
     "as block_table or as page_table, not both"),
    (dict(max_seqlen_q=None), ValueError, "packed q needs max_seqlen_q"),
    (dict(cu_seqlens_q=None), ValueError, "packed q .* needs cu_seqlens_q"),
    (dict(cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32)), ValueError,
     "cu_seqlens_k_new is given without k and v"),
    (dict(k=torch.zeros(3, 2, 64), v=torch.zeros(3, 2, 64)), ValueError,
     "packed k .* needs cu_seqlens_k_new"),
    (dict(pack_gqa="yes"), TypeError, "pack_gqa must be None or a bool"),
    (dict(sm_margin=-1), ValueError, "sm_margin must be an int >= 0"),
    (dict(out=torch.zeros(3, 8, 32)), ValueError, r"out must have shape \(3, 8, 64\)"),
    (dict(cache_seqlens=torch.tensor([20, 9])), TypeError, "cache_seqlens must be an int or an int32"),
    # An append is checked with the attention's arguments before it writes.
    (dict(k=torch.ones(3, 2, 64), v=torch.ones(3, 2, 64), cache_seqlens=torch.tensor(
        [10, 5], dtype=torch.int32), cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32),
        out=torch.zeros(3, 8, 32)), ValueError, r"out must have shape \(3, 8, 64\)"),
    (dict(k=torch.ones(3, 2, 64), v=torch.ones(3, 2, 64), cache_seqlens=torch.tensor(
        [10, 5], dtype=torch.int32), cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32),
        softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(k=torch.ones(4, 2, 64), v=torch.ones(4, 2, 64), cache_seqlens=torch.tensor(
        [10, 5], dtype=torch.int32), cu_seqlens_k_new=torch.tensor([1, 2, 4], dtype=torch.int32)),
     ValueError, "cu_seqlens_k_new must start at 0"),
])
def test_bad_input(change, error, match):
    args = _args(**change)
    before = args["k_cache"].clone()
    with pytest.raises(error, match=match):
        ipex_flash.flash_attn_with_kvcache(**args)
    assert torch.equal(args["k_cache"], before)


def test_contiguous_cache_rows_not_a_multiple_of_16_are_refused():
    args = _args(page_table=None, k_cache=torch.zeros(2, 40, 2, 64),
                 v_cache=torch.zeros(2, 40, 2, 64))
    with pytest.raises(ValueError, match=r"seq_len \(k_cache.shape\[1\] = 40\) to be a multiple"):
        ipex_flash.flash_attn_with_kvcache(**args)


def test_append_past_capacity_is_refused_before_writing():
    args = _args(k=torch.ones(3, 2, 64), v=torch.ones(3, 2, 64),
                 cache_seqlens=torch.tensor([47, 9], dtype=torch.int32),
                 cu_seqlens_k_new=torch.tensor([0, 2, 3], dtype=torch.int32))
    before = args["k_cache"].clone()
    with pytest.raises(ValueError, match="within the cache's capacity"):
        ipex_flash.flash_attn_with_kvcache(**args)
    assert torch.equal(args["k_cache"], before)
