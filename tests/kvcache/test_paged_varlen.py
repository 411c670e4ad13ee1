"""The serving call: flash_attn_varlen_func over a paged KV cache with prefills, chunked
prefills, one-token decodes and speculative steps of a few tokens mixed in one batch, each
sequence against the float64 reference of its own keys."""
import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.caches import paged_batch
from helpers.reference import OUTPUT_TOLERANCE

# (new tokens, keys in the cache including them): decodes, a prefill, a chunked prefill, a
# few-token step, a sequence with a single key.
MIXED = [(1, 300), (1, 17), (70, 70), (40, 333), (1, 1), (3, 40), (1, 129)]


@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("causal,window,softcap,alibi", [
    (True, (-1, -1), 0.0, False), (False, (-1, -1), 0.0, False), (True, (32, -1), 0.0, False),
    (True, (-1, -1), 8.0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_batch_matches_reference(dtype, causal, window, softcap, alibi, page_size):
    heads_q, heads_kv = 8, 2
    q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(MIXED, heads_q, heads_kv, 64,
                                                                  page_size, dtype)
    slopes = torch.rand(len(MIXED), heads_q) * 0.3 if alibi else None
    out, lse, probs = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, max(n for n, _ in MIXED), max(n for _, n in MIXED),
        causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
        return_attn_probs=True, block_table=table, seqused_k=seqused)
    assert out.shape == q.shape and lse.shape == (heads_q, q.shape[0]) and probs is None
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref_out, ref_lse = flash_attn_reference(q_b[None], k_b[None], v_b[None], causal, window,
                                                softcap, None if slopes is None else slopes[b])
        torch.testing.assert_close(out[rows].double(), ref_out[0], rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[:, rows].double(), ref_lse[0], rtol=1e-4, atol=1e-4)


# (new tokens, keys): speculative steps of 5 tokens (one decode call for both), 16 and 17
# tokens (the decode kernel's bound with four and with two K/V heads), 33 (past it: general),
# and 2 tokens on one key (a row that sees no key under causal: general).
DRAFTS = [(1, 300), (5, 80), (5, 200), (16, 16), (17, 60), (33, 100), (2, 1)]


@pytest.mark.parametrize("heads_kv", [2, 4])
@pytest.mark.parametrize("causal,window,alibi", [(True, (-1, -1), False), (True, (24, 0), True),
                                                 (False, (-1, -1), False)])
def test_speculative_steps_take_the_decode_kernel(monkeypatch, causal, window, alibi,
                                                  heads_kv):
    """Sequences of up to C.max_sliced_decode_tokens new tokens whose rows all see a key are
    served by the decode kernel, one call per length; the rest by the general kernel, given
    only those sequences (its K/V pack is sized by its batch); every row against the
    reference."""
    calls, general = [], []
    run_forward, flash_fwd = launch.run_forward, launch.flash_fwd
    monkeypatch.setattr(launch, "run_forward", lambda q, *args: calls.append(tuple(q.shape)) or
                        run_forward(q, *args))
    monkeypatch.setattr(launch, "flash_fwd", lambda q, k, v, out, lse, options, device: general.append(
        (q.sizes[2], options.cu_seqlens_q.sizes[0] - 1)) or
        flash_fwd(q, k, v, out, lse, options, device))
    heads_q, dtype = 8, torch.bfloat16
    q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(DRAFTS, heads_q, heads_kv, 64,
                                                                  16, dtype)
    q = torch.cat([q, torch.randn(3, *q.shape[1:], dtype=dtype)])  # rows past the last sequence
    slopes = torch.rand(len(DRAFTS), heads_q) * 0.3 if alibi else None
    out, lse, _ = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, 33, 300, causal=causal, window_size=window,
        alibi_slopes=slopes, return_attn_probs=True, block_table=table, seqused_k=seqused)
    limit = C.max_sliced_decode_tokens(heads_kv)
    served = sorted({n for n, k in DRAFTS if n <= limit and k >= n})
    assert sorted((shape[2], shape[0]) for shape in calls) == [
        (n, sum(1 for m, k in DRAFTS if m == n and k >= n)) for n in served]
    rest = [n for n, k in DRAFTS if n > limit or k < n]
    assert general == [(sum(rest), len(rest))]  # (packed rows, sequences)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref_out, ref_lse = flash_attn_reference(q_b[None], k_b[None], v_b[None], causal, window,
                                                0.0, None if slopes is None else slopes[b])
        if not causal or DRAFTS[b][1] >= DRAFTS[b][0]:  # rows that see no key: not compared
            torch.testing.assert_close(out[rows].double(), ref_out[0], rtol=rtol, atol=atol)
            torch.testing.assert_close(lse[:, rows].double(), ref_lse[0], rtol=1e-4, atol=1e-4)


def test_cu_seqlens_k_gives_the_lengths_and_sinks_join_the_softmax():
    lengths = [(1, 50), (30, 90), (1, 200)]
    q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(lengths, 4, 4, 32, 32,
                                                                  torch.float32)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int32), seqused.cumsum(0, dtype=torch.int32)])
    sinks = torch.randn(4)
    out = ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 30, 200,
                                            block_table=table, sinks=sinks)
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref = sdpa_reference(*(t.transpose(0, 1)[None] for t in (q_b, k_b, v_b)), sinks=sinks)
        torch.testing.assert_close(out[rows].double(), ref[0].transpose(0, 1), rtol=1e-5,
                                   atol=1e-5)


def test_all_decodes_and_all_prefills():
    """Batches of only decodes (decode kernel alone) and only prefills (general kernel alone)."""
    for lengths in ([(1, 100), (1, 7), (1, 260)], [(40, 40), (35, 99)]):
        q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(lengths, 8, 2, 64, 16,
                                                                      torch.float32)
        out = ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 40, 260,
                                                causal=True, block_table=table,
                                                seqused_k=seqused)
        for b, (q_b, k_b, v_b) in enumerate(seqs):
            rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
            ref, _ = flash_attn_reference(q_b[None], k_b[None], v_b[None], True)
            torch.testing.assert_close(out[rows].double(), ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,error,message", [
    (dict(dropout_p=0.1), ValueError, "dropout is not supported with a paged KV cache"),
    (dict(seqused_k=None), ValueError, "give seqused_k or cu_seqlens_k"),
    (dict(seqused_k=torch.tensor([5, 500], dtype=torch.int32)), ValueError,
     r"keys per sequence must be in \[0, min\(max_seqlen_k"),
    (dict(block_table=torch.tensor([[0], [99]], dtype=torch.int32)), ValueError,
     r"block_table entries must be page indices"),
    (dict(seqused_k=torch.tensor([5, 50])), TypeError, "seqused_k must be an int32 tensor"),
])
def test_bad_arguments(change, error, message):
    q, k_pages, v_pages, table, cu_q, seqused, _ = paged_batch([(1, 5), (4, 50)], 4, 2, 32, 64,
                                                               torch.float32)
    args = dict(dropout_p=0.0, block_table=table, seqused_k=seqused)
    args.update(change)
    with pytest.raises(error, match=message):
        ipex_flash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 4, 64, **args)


def test_opcheck():
    """The op's fake (meta) implementation, schema and dispatch agree with the real one
    (torch.compile traces it), on a batch that takes both kernels."""
    q, k_pages, v_pages, table, cu_q, seqused, _ = paged_batch([(1, 40), (40, 70)], 4, 2, 32,
                                                               16, torch.float32)
    torch.library.opcheck(torch.ops.ipex_flash.paged_varlen_attention.default,
                          (q, k_pages, v_pages, cu_q, seqused, table, 40, 70, None, True, -1, -1,
                           0.0, None))
