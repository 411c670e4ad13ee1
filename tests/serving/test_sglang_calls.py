"""ipex_flash.integrations.sglang called as SGLang's XPU attention backend calls
sgl_kernel.flash_attn (decode, extend, MLA's extend with qv, MLA prefill's varlen call, the
cascade's merge_state_v2, FP8 queries), against float64. The cache is SGLang's token pool in
pages of 32 (its XPU backend takes 32, 64 or 128), lengths off the page and tile sizes."""
import pytest
import torch

import ipex_flash
from ipex_flash.integrations import sglang
from ipex_flash.kvcache import qv_scores

from helpers.reference import OUTPUT_TOLERANCE
from helpers.sglang_cases import reference, token_pool

PAGE = 32
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 80
LATENT, ROPE, MLA_HEADS = 512, 64, 16
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _packed(lengths_q, heads, dim, dtype):
    q = torch.randn(sum(lengths_q), heads, dim).to(dtype)
    return q, torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)


def _assert_close(actual, expected, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step", ["decode", "extend", "extend_window_softcap"])
def test_mha_call(dtype, step):
    """forward_decode's and forward_extend's call: the pool viewed as pages, packed q, the
    step's keys already in the cache (cache_seqlens counts them), sinks as a keyword, out= in
    extend (its _attn_output), a sliding window and logit cap where the layer has them."""
    seq_lens = [45, 17, 99]
    lengths_q = [1, 1, 1] if step == "decode" else [3, 1, 37]
    window, softcap = ((20, 0), 30.0) if step == "extend_window_softcap" else ((-1, -1), 0.0)
    k_pool, req_to_token, page_table = token_pool(seq_lens, PAGE, HEADS_KV, HEAD_DIM, dtype)
    v_pool = torch.randn_like(k_pool, dtype=torch.float32).to(dtype)
    q, cu = _packed(lengths_q, HEADS_Q, HEAD_DIM, dtype)
    sinks, scale = torch.randn(HEADS_Q), HEAD_DIM ** -0.5
    out = torch.full((q.shape[0], HEADS_Q * HEAD_DIM), 7.0).to(dtype) if step != "decode" \
        else None
    result = sglang.flash_attn_with_kvcache(
        q=q.contiguous().view(-1, HEADS_Q, HEAD_DIM),
        k_cache=k_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM),
        v_cache=v_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM), page_table=page_table,
        cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32), cu_seqlens_q=cu,
        cu_seqlens_k_new=None, max_seqlen_q=max(lengths_q), softmax_scale=scale, causal=True,
        window_size=window, softcap=softcap, k_descale=None, v_descale=None,
        return_softmax_lse=False,
        out=None if out is None else out.view(-1, HEADS_Q, HEAD_DIM), sinks=sinks)
    assert result.shape == (q.shape[0], HEADS_Q, HEAD_DIM) and result.dtype == dtype
    if out is not None:
        assert result.data_ptr() == out.data_ptr()
    for b, n_k in enumerate(seq_lens):
        rows, slots = slice(int(cu[b]), int(cu[b + 1])), req_to_token[b, :n_k].long()
        expected, _ = reference(q[rows], k_pool[slots], v_pool[slots], scale, window=window,
                                softcap=softcap, sinks=sinks)
        _assert_close(result[rows], expected, dtype)


def _mla_pool(seq_lens, dtype):
    """SGLang's MLA pool: one (tokens, 1, 576) latent buffer, the latent then the rope part."""
    return token_pool(seq_lens, PAGE, 1, LATENT + ROPE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_rope_given", [True, False])
def test_mla_extend_with_qv(dtype, q_rope_given):
    """forward_extend's absorbed MLA call: q = q_rope, qv = q_nope, k_cache the rope columns
    and v_cache the latent columns of one buffer, seen as pages; scores q_rope . k_rope +
    q_nope . latent at MLA's scale (1 / sqrt(192)); a decode row and extends in one batch."""
    seq_lens, lengths_q = [45, 17, 70], [1, 5, 19]
    kv_buffer, req_to_token, page_table = _mla_pool(seq_lens, dtype)
    kv_cache = kv_buffer.to(dtype)
    k_rope_cache = kv_cache[:, :, LATENT:].view(-1, PAGE, 1, ROPE)
    c_kv_cache = kv_cache[:, :, :LATENT].view(-1, PAGE, 1, LATENT)
    q_all, cu = _packed(lengths_q, MLA_HEADS, LATENT + ROPE, dtype)
    if q_rope_given:  # (q and q_rope as separate tensors)
        q_nope = q_all[..., :LATENT].contiguous().view(-1, MLA_HEADS, LATENT)
        q_rope = q_all[..., LATENT:].contiguous().view(-1, MLA_HEADS, ROPE)
    else:
        q_nope, q_rope = q_all[:, :, :LATENT], q_all[:, :, LATENT:]
    scale = 192 ** -0.5
    result = sglang.flash_attn_with_kvcache(
        q=q_rope, k_cache=k_rope_cache, v_cache=c_kv_cache, qv=q_nope, page_table=page_table,
        cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32), cu_seqlens_q=cu,
        cu_seqlens_k_new=None, max_seqlen_q=max(lengths_q), softmax_scale=scale,
        causal=True, softcap=0.0, k_descale=None, v_descale=None, return_softmax_lse=False)
    assert result.shape == (q_all.shape[0], MLA_HEADS, LATENT) and result.dtype == dtype
    for b, n_k in enumerate(seq_lens):
        rows, slots = slice(int(cu[b]), int(cu[b + 1])), req_to_token[b, :n_k].long()
        expected, _ = reference(q_all[rows, :, LATENT:], kv_buffer[slots, :, LATENT:],
                                kv_buffer[slots, :, :LATENT], scale, qv=q_all[rows, :, :LATENT])
        _assert_close(result[rows], expected, dtype)


def test_qv_reads_one_latent_cache_without_a_copy_and_separate_caches_by_one():
    """Side by side columns of one buffer are joined as a view of it; separate caches are
    concatenated, and give the same result."""
    seq_lens, lengths_q = [33, 64], [2, 1]
    kv_buffer, _, page_table = _mla_pool(seq_lens, torch.float32)
    k_rope = kv_buffer[:, :, LATENT:].view(-1, PAGE, 1, ROPE)
    latent = kv_buffer[:, :, :LATENT].view(-1, PAGE, 1, LATENT)
    q_all, cu = _packed(lengths_q, MLA_HEADS, LATENT + ROPE, torch.float32)
    q_nope, q_rope = q_all[..., :LATENT], q_all[..., LATENT:]
    _, joined = qv_scores.join_query_and_keys("f", q_rope, q_nope, k_rope, latent, None, None,
                                              None, None)
    assert joined.data_ptr() == kv_buffer.data_ptr() and joined.shape[-1] == LATENT + ROPE
    args = dict(page_table=page_table, cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32),
                cu_seqlens_q=cu, max_seqlen_q=2, softmax_scale=0.05, causal=True)
    shared = sglang.flash_attn_with_kvcache(q_rope, k_rope, latent, qv=q_nope, **args)
    apart = sglang.flash_attn_with_kvcache(q_rope, k_rope.clone(), latent.clone(), qv=q_nope,
                                           **args)
    torch.testing.assert_close(shared, apart, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_prefill_varlen_call(dtype):
    """forward_extend's MHA over the new tokens of an MLA model (192 / 128, causal, lse for
    the chunked-prefix merge), keyword for keyword."""
    lengths = [7, 40]
    q, cu = _packed(lengths, 4, 192, dtype)
    k = torch.randn(sum(lengths), 4, 192).to(dtype)
    v = torch.randn(sum(lengths), 4, 128).to(dtype)
    out, lse, *rest = sglang.flash_attn_varlen_func(
        q=q.view(-1, 4, 192), k=k.view(-1, 4, 192).to(q.dtype), v=v.view(-1, 4, 128).to(q.dtype),
        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40,
        softmax_scale=192 ** -0.5, causal=True, return_softmax_lse=True)
    assert out.shape == (sum(lengths), 4, 128) and lse.shape == (4, sum(lengths)) and not rest
    for b in range(len(lengths)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        expected, expected_lse = reference(q[rows], k[rows], v[rows], 192 ** -0.5)
        _assert_close(out[rows], expected, dtype)
        torch.testing.assert_close(lse[:, rows].double(), expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("given_out", [False, True])
def test_fp8_query_gives_the_models_dtype(monkeypatch, model_dtype, given_out):
    """forward_decode with an FP8 cache: SGLang casts q to the cache's dtype and passes the
    layer's scales expanded to (batch, nheads_k); the output comes back in the model's dtype
    (install(model_dtype=...), or out='s dtype)."""
    monkeypatch.setattr(sglang, "model_dtype", torch.bfloat16 if given_out else model_dtype)
    fp8 = torch.float8_e4m3fn
    seq_lens = [45, 70]
    k_pool, req_to_token, page_table = token_pool(seq_lens, PAGE, HEADS_KV, HEAD_DIM, fp8)
    v_pool = torch.randn(k_pool.shape).to(fp8)
    q, cu = _packed([1, 1], HEADS_Q, HEAD_DIM, model_dtype)
    k_scale, v_scale = torch.tensor([0.5]), torch.tensor([0.25])
    out = torch.empty(2, HEADS_Q, HEAD_DIM, dtype=model_dtype) if given_out else None
    result = sglang.flash_attn_with_kvcache(
        q=q.to(fp8), k_cache=k_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM),
        v_cache=v_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM), page_table=page_table,
        cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32), cu_seqlens_q=cu,
        cu_seqlens_k_new=None, max_seqlen_q=1, softmax_scale=HEAD_DIM ** -0.5, causal=True,
        window_size=(-1, -1), softcap=0.0, k_descale=k_scale.expand(2, HEADS_KV),
        v_descale=v_scale.expand(2, HEADS_KV), return_softmax_lse=False, out=out)
    assert result.dtype == model_dtype
    for b, n_k in enumerate(seq_lens):
        slots = req_to_token[b, :n_k].long()
        expected, _ = reference(q.to(fp8)[b:b + 1], k_pool[slots].double() * 0.5,
                                v_pool[slots].double() * 0.25, HEAD_DIM ** -0.5)
        _assert_close(result[b:b + 1], expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_merge_state_v2(dtype):
    """SGLang's cascade: the shared prefix and each query's own keys as two calls with
    return_softmax_lse (causal=False), merged by merge_state_v2 from their lse transposed:
    the attention over both key sets."""
    prefix, own, lengths_q = [45, 17], [3, 30], [2, 2]
    k_pool, to_token, table = token_pool(prefix + own, PAGE, HEADS_KV, HEAD_DIM, dtype)
    v_pool = torch.randn(k_pool.shape).to(dtype)
    q, cu = _packed(lengths_q, HEADS_Q, HEAD_DIM, dtype)
    caches = dict(k_cache=k_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM),
                  v_cache=v_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM), cu_seqlens_q=cu,
                  cu_seqlens_k_new=None, max_seqlen_q=2, softmax_scale=0.1, causal=False,
                  return_softmax_lse=True)
    o, lse, *_ = sglang.flash_attn_with_kvcache(
        q=q, page_table=table[:2], cache_seqlens=torch.tensor(prefix, dtype=torch.int32),
        **caches)
    o_own, lse_own, *_ = sglang.flash_attn_with_kvcache(
        q=q, page_table=table[2:], cache_seqlens=torch.tensor(own, dtype=torch.int32),
        **caches)
    merged, merged_lse = sglang.merge_state_v2(o, lse.T.contiguous(), o_own,
                                               lse_own.T.contiguous())
    assert merged.dtype == dtype and merged_lse.shape == (q.shape[0], HEADS_Q)
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        slots = torch.cat([to_token[b, :prefix[b]], to_token[2 + b, :own[b]]]).long()
        expected, expected_lse = reference(q[rows], k_pool[slots], v_pool[slots], 0.1,
                                           causal=False)
        _assert_close(merged[rows], expected, dtype)
        torch.testing.assert_close(merged_lse[rows].T.double(), expected_lse, rtol=1e-5,
                                   atol=1e-5)


def test_merge_state_v2_parts_that_saw_no_key():
    """A part with lse -inf (or +inf, NaN) weighs nothing; both empty: 0 and -inf; the
    buffers given are written."""
    v_a, v_b = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    s_a = torch.tensor([[0.5, float("-inf")], [float("inf"), 1.0], [float("-inf")] * 2])
    s_b = torch.tensor([[float("-inf"), 2.0], [0.3, float("nan")], [float("-inf")] * 2])
    v_out, s_out = torch.empty(3, 2, 8), torch.empty(3, 2)
    merged, lse = sglang.merge_state_v2(v_a, s_a, v_b, s_b, v_out, s_out)
    assert merged is v_out and lse is s_out
    for (t, h), alone in (((0, 0), v_a), ((0, 1), v_b), ((1, 0), v_b), ((1, 1), v_a)):
        torch.testing.assert_close(merged[t, h], alone[t, h])
    torch.testing.assert_close(lse[:2], torch.tensor([[0.5, 2.0], [0.3, 1.0]]))
    assert torch.equal(merged[2], torch.zeros(2, 8)) and torch.isneginf(lse[2]).all()


def test_unpacked_q_comes_back_packed_as_sgl_kernel_returns_it():
    """q (batch, seqlen, nheads, headdim) without cu_seqlens_q: out (batch * seqlen, nheads,
    headdim_v) and lse (nheads, batch * seqlen), the packed call's rows."""
    seq_lens = [45, 70]
    k_pool, _, page_table = token_pool(seq_lens, PAGE, HEADS_KV, HEAD_DIM, torch.float32)
    caches = dict(k_cache=k_pool.view(-1, PAGE, HEADS_KV, HEAD_DIM),
                  v_cache=k_pool.flip(0).view(-1, PAGE, HEADS_KV, HEAD_DIM),
                  page_table=page_table, cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32),
                  causal=True, return_softmax_lse=True)
    q = torch.randn(2, 3, HEADS_Q, HEAD_DIM)
    out, lse = sglang.flash_attn_with_kvcache(q, **caches)
    packed, packed_lse = sglang.flash_attn_with_kvcache(
        q.flatten(0, 1), cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32), **caches)
    assert out.shape == (6, HEADS_Q, HEAD_DIM) and lse.shape == (HEADS_Q, 6)
    torch.testing.assert_close(out, packed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, packed_lse, rtol=1e-5, atol=1e-5)
