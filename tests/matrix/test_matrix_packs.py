"""The matrix kernels' packs (fwd_pack_kv.hpp, bwd_packed.hpp) sized by the real sequences
(pack_rows.hpp): a packed batch (cu_seqlens) or a KV cache of many short sequences and one long
one packs about its own keys, not batch x the longest. Scratch sizes against their bounds, and
the kernels that write and read the packs against the float64 reference on batches of very
unequal lengths, empty sequences included, with joint_matrix emulated so they run on any CPU:
  emulate   the register kernels (the forward and backward up to head dim 128)
  emulate8  the same in DG2 / Arrow Lake-H's 8-wide shape (their packs in tile order)"""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.kvcache.cache_ops import cache_options
from ipex_flash.ops import launch
from ipex_flash.ops.flash_attn_args import bhnd, flash_options
from ipex_flash.reference import flash_attn_reference

from helpers.caches import paged_batch
from helpers.flash_attn import assert_close_with_lse, pack
from helpers.reference import OUTPUT_TOLERANCE

# (query rows, keys) per sequence: empty ones, rows without keys, keys without rows, one
# sequence far longer than the rest, lengths off the 64-row blocks.
UNEQUAL = [(1, 300), (0, 0), (70, 3), (0, 9), (5, 0), (130, 130), (2, 65), (17, 1), (1, 2)]
DTYPES_OF = {"emulate": [torch.float16, torch.bfloat16, torch.float32],
             "emulate8": [torch.bfloat16, torch.float32]}


@pytest.fixture
def matrix_mode(monkeypatch):
    """Sets IPEX_FLASH_MATRIX; returns the variant of (family, dtype, head dim), checked to be
    a matrix one for 16-bit inputs (float32 always runs the vector kernels)."""
    def use(mode, family, dtype, head_dim):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        variant = C.plan(family, "", str(dtype).removeprefix("torch."), head_dim, 0, 1,
                         mode)["variant"]
        assert (variant.matrix_m > 0) == (dtype != torch.float32)
        return variant
    return use


@pytest.fixture
def pack_calls(monkeypatch):
    """The (keys per sequence, total) of each call that sizes a KV cache's pack by its keys."""
    calls = []
    pack_keys_used = launch.pack_keys_used

    def record(options, keys, total):
        calls.append((keys.tolist(), total))
        return pack_keys_used(options, keys, total)
    monkeypatch.setattr(launch, "pack_keys_used", record)
    return calls


def views(q, k, v):
    return [launch.view(t) for t in (q, k, v)]


@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_varlen_scratch_is_bounded_by_the_real_sequences(matrix_mode, mode):
    """64 sequences of 16 keys and one of 8192, d = 128: each pack holds every sequence's rows
    rounded up to whole blocks, and no more than total + batch x block rows."""
    heads_q, heads_kv = 4, 2
    lengths = [16] * 64 + [8192]
    batch, total = len(lengths), sum(lengths)
    fwd = matrix_mode(mode, "forward", torch.bfloat16, 128)
    bwd = matrix_mode(mode, "backward", torch.bfloat16, 128)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.empty(total, heads_q, 128, dtype=torch.bfloat16)
    k, v = (torch.empty(total, heads_kv, 128, dtype=torch.bfloat16) for _ in range(2))
    options = flash_options(cu, cu, max(lengths), max(lengths), 128 ** -0.5, True, -1, -1, 0.0,
                            None, 0.0, None)
    args = views(*(bhnd(t, True) for t in (q, k, v)))

    def rows_bounds(block):  # (every sequence in whole blocks, total + batch x block)
        return sum(-(-n // block) * block for n in lengths), total + batch * block

    d, element = fwd.head_dim, 2
    exact, bound = rows_bounds(fwd.block_n)
    scratch = C.fwd_scratch_bytes(*args, options, 0)  # K and V^T per key row
    assert heads_kv * exact * 2 * d * element <= scratch <= heads_kv * bound * 2 * d * element
    assert scratch < batch * max(lengths) * heads_kv * 2 * d * element / 10  # batch x longest

    key_tiles, row_tiles = (5, 6) if bwd.dkdv_registers else (3, 4)  # the dK/dV kernel's layout
    keys_exact, keys_bound = rows_bounds(bwd.block_n)
    rows_exact, rows_bound = rows_bounds(bwd.block_m)
    scratch = C.bwd_scratch_bytes(*args, options, 0)
    per_row = bwd.head_dim * element
    assert (heads_kv * keys_exact * key_tiles + heads_q * rows_exact * row_tiles) * per_row \
        <= scratch <= (heads_kv * keys_bound * key_tiles + heads_q * rows_bound * row_tiles) * per_row


def test_cache_scratch_follows_the_keys_used(matrix_mode):
    """A KV cache's pack: by the keys each sequence attends to where the caller gives their
    prefix sums (launch.pack_keys_used), else max_seqlen_k keys per sequence."""
    variant = matrix_mode("emulate", "forward", torch.bfloat16, 64)
    keys = torch.tensor([1] * 31 + [0, 4000], dtype=torch.int32)
    batch, heads_kv, capacity = keys.shape[0], 2, 4096
    q = torch.empty(batch, 40, 8, 64, dtype=torch.bfloat16)
    k, v = (torch.empty(batch, capacity, heads_kv, 64, dtype=torch.bfloat16) for _ in range(2))
    args = views(*(t.transpose(1, 2) for t in (q, k, v)))
    options = cache_options(0.125, True, -1, -1, 0.0, None, None, keys, int(keys.max()), None, 0)
    block_bytes = heads_kv * 2 * variant.block_n * variant.head_dim * 2  # K and V^T, 16-bit
    assert C.fwd_scratch_bytes(*args, options, 0) == batch * -(-4000 // variant.block_n) * block_bytes
    _kept = launch.pack_keys_used(options, keys, int(keys.sum()))
    blocks = sum(-(-int(n) // variant.block_n) for n in keys)
    assert blocks * block_bytes <= C.fwd_scratch_bytes(*args, options, 0) \
        <= (blocks + batch) * block_bytes
    options.keys_used = 2**31  # int32 prefix sums cannot hold it
    with pytest.raises(ValueError, match="keys_used in"):
        C.fwd_scratch_bytes(*args, options, 0)


def packed_batch(lengths, heads_q, heads_kv, head_dim, dtype):
    qs, ks, vs = zip(*[(torch.randn(nq, heads_q, head_dim, dtype=dtype),
                        torch.randn(nk, heads_kv, head_dim, dtype=dtype),
                        torch.randn(nk, heads_kv, head_dim, dtype=dtype)) for nq, nk in lengths])
    (q, cu_q, max_q), (k, cu_k, max_k), (v, _, _) = pack(qs), pack(ks), pack(vs)
    return q, k, v, cu_q, cu_k, max_q, max_k, (qs, ks, vs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [40, 128])
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_varlen_forward_matches_reference(matrix_mode, mode, head_dim, causal):
    for dtype in DTYPES_OF[mode]:
        matrix_mode(mode, "forward", dtype, head_dim)
        q, k, v, cu_q, cu_k, max_q, max_k, seqs = packed_batch(UNEQUAL, 4, 2, head_dim, dtype)
        out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                        causal=causal, return_attn_probs=True)
        for i, (n_q, n_k) in enumerate(UNEQUAL):
            rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
            if n_k == 0:  # rows that see no key: zeros, LSE -inf
                assert not out[rows].any() and torch.isneginf(lse[:, rows]).all()
                continue
            ref_out, ref_lse = flash_attn_reference(*(t[i][None] for t in seqs), causal)
            assert_close_with_lse(out[rows][None], lse[:, rows][None], ref_out, ref_lse, dtype)


@pytest.mark.parametrize("mode,head_dim", [("emulate", 40), ("emulate", 128), ("emulate8", 64),
                                           pytest.param("emulate8", 128, marks=pytest.mark.full)])
def test_varlen_gradients_match_reference(matrix_mode, mode, head_dim):
    for dtype in DTYPES_OF[mode]:
        matrix_mode(mode, "backward", dtype, head_dim)
        q, k, v, cu_q, cu_k, max_q, max_k, seqs = packed_batch(UNEQUAL, 4, 2, head_dim, dtype)
        grad_out = torch.randn(q.shape, dtype=dtype)
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        ipex_flash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, max_q, max_k,
                                          causal=True).backward(grad_out)
        rtol, _ = OUTPUT_TOLERANCE[dtype]
        for i, (n_q, n_k) in enumerate(UNEQUAL):
            rows_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
            rows_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
            if n_q == 0 or n_k == 0:  # no score: every gradient of the sequence is zero
                assert not a.grad[rows_q].any() and not b.grad[rows_k].any()
                assert not c.grad[rows_k].any()
                continue
            a64, b64, c64 = (t[i].double()[None].requires_grad_() for t in seqs)
            flash_attn_reference(a64, b64, c64, causal=True)[0].backward(
                grad_out[rows_q].double()[None])
            for got, want in ((a.grad[rows_q], a64.grad[0]), (b.grad[rows_k], b64.grad[0]),
                              (c.grad[rows_k], c64.grad[0])):
                assert got.dtype == dtype
                error = (got.double() - want).abs().max().item()
                assert error <= rtol * max(1.0, want.abs().max().item()), (dtype, i, error)


# Serving steps: decodes, short prefills, a sequence without keys, one with no new token, and
# one long chunked prefill; the general kernel's K/V pack holds only its sequences' keys.
SERVING = [(1, 40), (9, 9), (0, 5), (3, 0), (200, 260), (17, 17), (1, 1), (33, 500), (2, 70)]


@pytest.mark.parametrize("dtype", DTYPES_OF["emulate"])
def test_paged_serving_matches_reference(matrix_mode, pack_calls, dtype):
    matrix_mode("emulate", "forward", dtype, 64)
    q, k_pages, v_pages, table, cu_q, seqused, seqs = paged_batch(SERVING, 8, 2, 64, 16, dtype)
    out, lse, _ = ipex_flash.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, max(n for n, _ in SERVING), max(n for _, n in SERVING),
        causal=True, return_attn_probs=True, block_table=table, seqused_k=seqused)
    general = [n_k for n_q, n_k in SERVING if not 1 <= n_q <= C.max_sliced_decode_tokens(2)
               or n_k < n_q]
    assert pack_calls == [(general, sum(general))]  # the general call's pack: its keys
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if k_b.shape[0] == 0:
            assert not out[rows].any() and torch.isneginf(lse[:, rows]).all()
            continue
        ref_out, ref_lse = flash_attn_reference(q_b[None], k_b[None], v_b[None], True)
        assert_close_with_lse(out[rows][None], lse[:, rows][None], ref_out, ref_lse, dtype)


@pytest.mark.parametrize("leftpad", [False, True])
def test_kvcache_prefill_matches_reference(matrix_mode, pack_calls, leftpad):
    """flash_attn_with_kvcache with many new rows (the general kernel) over caches of very
    unequal fill, one empty, and with cache_leftpad the keys after each pad."""
    dtype = torch.bfloat16
    matrix_mode("emulate", "forward", dtype, 64)
    seqlens = torch.tensor([3, 0, 300, 70, 1], dtype=torch.int32)
    pad = torch.tensor([1, 0, 77, 5, 0], dtype=torch.int32) if leftpad else None
    batch, capacity = seqlens.shape[0], 320
    q = torch.randn(batch, 40, 4, 64, dtype=dtype)
    k_cache, v_cache = (torch.randn(batch, capacity, 2, 64, dtype=dtype) for _ in range(2))
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                  cache_leftpad=pad, return_softmax_lse=True)
    used = seqlens if pad is None else seqlens - pad
    assert pack_calls == [(used.tolist(), int(used.sum()))]
    for b in range(batch):
        keys = slice(0 if pad is None else int(pad[b]), int(seqlens[b]))
        if keys.stop == keys.start:
            assert not out[b].any() and torch.isneginf(lse[b]).all()
            continue
        ref_out, ref_lse = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, keys],
                                                v_cache[b:b + 1, keys])
        assert_close_with_lse(out[b:b + 1], lse[b:b + 1], ref_out, ref_lse, dtype)
