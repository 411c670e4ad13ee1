"""The serving engines' own calls, exactly as they make them, against float64: vLLM's attention
backend's keyword call of flash_attn_varlen_func (out= a slice of its output buffer, the cache
the two halves of one tensor, descales as expanded views, s_aux), and SGLang's flash-attn 3
style flash_attn_with_kvcache (page_table, packed q, cu_seqlens_k_new appends)."""
import pytest
import torch

import ipex_flash

from helpers.reference import OUTPUT_TOLERANCE
from helpers.engine_cases import SENTINEL, reference, sequence_keys


def vllm_batch(seq_lens, heads, head_dim, block_size, dtype, num_blocks=None):
    """vLLM's layout: query (tokens, H, D), a KV cache (2, num_blocks, block_size, Hkv, D)
    whose halves are the key and value caches, block tables padded with stale entries past each
    sequence's pages (as vLLM's tests draw them), query_start_loc and seq_lens."""
    heads_q, heads_kv = heads
    pages = [-(-n_k // block_size) for _, n_k in seq_lens]
    num_blocks = num_blocks or sum(pages) + 5
    kv_cache = torch.randn(2, num_blocks, block_size, heads_kv, head_dim, dtype=dtype)
    key_cache, value_cache = kv_cache.unbind(0)
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max(pages) + 2), dtype=torch.int32)
    query = torch.randn(sum(n for n, _ in seq_lens), heads_q, head_dim, dtype=dtype)
    cu_q = torch.tensor([0] + [n for n, _ in seq_lens]).cumsum(0).to(torch.int32)
    seqused = torch.tensor([n for _, n in seq_lens], dtype=torch.int32)
    return query, key_cache, value_cache, block_tables, cu_q, seqused


def check_sequences(out, lse, query, key_cache, value_cache, tables, cu_q, seq_lens, dtype,
                    window=(-1, -1), softcap=0.0, sinks=None, scales=(1.0, 1.0, 1.0)):
    q_scale, k_scale, v_scale = scales
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, (_, n_k) in enumerate(seq_lens):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        k = sequence_keys(key_cache, tables[b], n_k).double() * k_scale
        v = sequence_keys(value_cache, tables[b], n_k).double() * v_scale
        ref_out, ref_lse = reference(query[rows].double() * q_scale, k, v, True, window,
                                     softcap, sinks)
        torch.testing.assert_close(out[rows].double(), ref_out, rtol=rtol, atol=atol)
        if lse is not None:
            torch.testing.assert_close(lse[:, rows].double(), ref_lse, rtol=1e-4, atol=1e-4)


# vLLM's tests/kernels/attention/test_flash_attn.py::test_varlen_with_paged_kv draws these
# (its 1328 keys shortened to keep the suite quick).
VLLM_SEQ_LENS = [(1, 523), (5, 18), (129, 463)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,window,softcap,sinks", [
    ((4, 4), None, 0.0, False), ((8, 2), [64, 0], 10.0, True)])
def test_vllm_backend_call(dtype, heads, window, softcap, sinks):
    """vLLM's FlashAttentionImpl.forward call, keyword for keyword."""
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(
        VLLM_SEQ_LENS, heads, 64, 16, dtype)
    num_actual_tokens = query.shape[0]
    output = torch.full((num_actual_tokens + 6, heads[0], 64), SENTINEL, dtype=dtype)
    s_aux = torch.randn(heads[0]) * 2 if sinks else None
    descale_shape = (cu_q.shape[0] - 1, heads[1])
    one = torch.ones(1, dtype=torch.float32)
    result = ipex_flash.flash_attn_varlen_func(
        q=query[:num_actual_tokens], k=key_cache, v=value_cache,
        out=output[:num_actual_tokens], cu_seqlens_q=cu_q, max_seqlen_q=129, seqused_k=seqused,
        max_seqlen_k=523, softmax_scale=64 ** -0.5, causal=True, alibi_slopes=None,
        window_size=window, block_table=tables, softcap=softcap, scheduler_metadata=None,
        fa_version=2, q_descale=one.expand(descale_shape), k_descale=one.expand(descale_shape),
        v_descale=one.expand(descale_shape), num_splits=0, s_aux=s_aux)
    assert result.data_ptr() == output.data_ptr() and result.shape == query.shape
    assert (output[num_actual_tokens:] == SENTINEL).all()  # nothing past the slice written
    check_sequences(output, None, query, key_cache, value_cache, tables, cu_q, VLLM_SEQ_LENS,
                    dtype, tuple(window or (-1, -1)), softcap, s_aux)


def test_vllm_decode_steps_write_into_out():
    """A decode step repeated (its launch plan from the second call on) writes each step's
    result into the out= slice, with the LSE vLLM asks for with return_softmax_lse."""
    lens = [(1, 40), (1, 300), (1, 7)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (8, 2), 64, 16,
                                                                      torch.float32)
    output = torch.full((8, 8, 64), SENTINEL)
    for _ in range(3):
        query = torch.randn_like(query)
        result, lse = ipex_flash.flash_attn_varlen_func(
            q=query, k=key_cache, v=value_cache, out=output[:3], cu_seqlens_q=cu_q,
            max_seqlen_q=1, seqused_k=seqused, max_seqlen_k=300, causal=True,
            block_table=tables, return_softmax_lse=True)
        assert result.data_ptr() == output.data_ptr() and lse.shape == (8, 3)
        assert lse.dtype == torch.float32 and (output[3:] == SENTINEL).all()
        check_sequences(output, lse, query, key_cache, value_cache, tables, cu_q, lens,
                        torch.float32)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_num_splits_is_honoured(num_splits):
    lens = [(1, 200), (1, 77)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (4, 1), 64, 16,
                                                                      torch.float32)
    out = ipex_flash.flash_attn_varlen_func(query, key_cache, value_cache, cu_q, None, 1, 200,
                                            causal=True, block_table=tables, seqused_k=seqused,
                                            num_splits=num_splits)
    check_sequences(out, None, query, key_cache, value_cache, tables, cu_q, lens, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_descales_on_a_16bit_cache_are_applied(dtype):
    """q . k * k_descale and v * v_descale, per (sequence, K/V head) or one value; a 16-bit q
    takes q_descale 1 only (nothing quantised it), in either form. Powers of two: with a 16-bit
    cache the descales scale q and the output in their dtype, whose rounding other factors
    would add to the kernels' error."""
    lens = [(1, 50), (9, 30)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (4, 2), 64, 16,
                                                                      dtype)
    k_scale, v_scale = torch.tensor([[2.0, 0.5], [0.25, 4.0]]), 2.0
    for q_descale in (torch.ones(1).expand(2, 2), torch.ones(2, 2), None):
        out = ipex_flash.flash_attn_varlen_func(
            q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_q, max_seqlen_q=9,
            seqused_k=seqused, max_seqlen_k=50, causal=True, block_table=tables,
            q_descale=q_descale, k_descale=k_scale, v_descale=torch.tensor(v_scale))
        rtol, atol = OUTPUT_TOLERANCE[dtype]
        for b, (_, n_k) in enumerate(lens):
            rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
            k = sequence_keys(key_cache, tables[b], n_k).double() * k_scale[b][:, None]
            v = sequence_keys(value_cache, tables[b], n_k).double() * v_scale
            ref, _ = reference(query[rows].double(), k, v)
            torch.testing.assert_close(out[rows].double(), ref, rtol=rtol, atol=atol)
    for q_descale in (torch.tensor([0.5]).expand(2, 2), torch.tensor([[1.0, 2.0], [1.0, 1.0]])):
        with pytest.raises(ValueError, match="q_descale applies to an FP8 q"):
            ipex_flash.flash_attn_varlen_func(
                q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_q, max_seqlen_q=9,
                seqused_k=seqused, max_seqlen_k=50, causal=True, block_table=tables,
                q_descale=q_descale)



def test_fp8_query_and_cache_with_descales():
    """flash-attn 3's FP8 call: e4m3 q, k, v with their descales; the output is bfloat16."""
    lens = [(1, 64), (4, 40)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (4, 2), 64, 16,
                                                                      torch.float32)
    fp8 = torch.float8_e4m3fn
    q8, k8, v8 = (t.to(fp8) for t in (query, key_cache, value_cache))
    scales = (0.25, 0.5, 2.0)
    descale_shape = (2, 2)
    out = ipex_flash.flash_attn_varlen_func(
        q=q8, k=k8, v=v8, out=torch.empty(5, 4, 64, dtype=torch.bfloat16), cu_seqlens_q=cu_q,
        max_seqlen_q=4, seqused_k=seqused, max_seqlen_k=64, causal=True, block_table=tables,
        **{name: torch.tensor([s]).expand(descale_shape)
           for name, s in zip(("q_descale", "k_descale", "v_descale"), scales)})
    assert out.dtype == torch.bfloat16
    check_sequences(out, None, q8.double(), k8.double(), v8.double(), tables, cu_q, lens,
                    torch.bfloat16, scales=scales)


def test_vllm_encoder_call_without_block_table():
    """vLLM's encoder attention: packed contiguous K/V (cu_seqlens_k), not causal, out=."""
    lens_q, lens_k = [5, 12], [5, 12]
    q = torch.randn(17, 4, 32)
    k, v = torch.randn(17, 2, 32), torch.randn(17, 2, 32)
    cu = torch.tensor([0, 5, 17], dtype=torch.int32)
    output = torch.full((20, 4, 32), SENTINEL)
    one = torch.ones(1)
    result = ipex_flash.flash_attn_varlen_func(
        q=q, k=k, v=v, out=output[:17], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=12,
        max_seqlen_k=12, softmax_scale=32 ** -0.5, causal=False, alibi_slopes=None,
        window_size=None, softcap=0, fa_version=2, q_descale=one.expand(2, 2),
        k_descale=one.expand(2, 2), v_descale=one.expand(2, 2), num_splits=0)
    assert result.data_ptr() == output.data_ptr() and (output[17:] == SENTINEL).all()
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref, _ = reference(q[rows].double(), k[rows].double(), v[rows].double(), causal=False)
        torch.testing.assert_close(output[rows].double(), ref, rtol=1e-5, atol=1e-5)
    assert lens_q == lens_k


def _vllm_args(**change):
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch([(1, 20), (2, 9)], (4, 2),
                                                                      32, 16, torch.float32)
    args = dict(q=query, k=key_cache, v=value_cache, out=torch.full((3, 4, 32), SENTINEL),
                cu_seqlens_q=cu_q, max_seqlen_q=2, seqused_k=seqused, max_seqlen_k=20,
                causal=True, block_table=tables)
    args.update(change)
    return args


@pytest.mark.parametrize("change,error,match", [
    (dict(out=torch.zeros(4, 4, 32)), ValueError, r"out must have shape \(3, 4, 32\)"),
    (dict(out=torch.zeros(3, 4, 32, dtype=torch.bfloat16)), TypeError,
     "out must have dtype torch.float32"),
    (dict(out=torch.zeros(3, 4, 64)[..., ::2]), ValueError, "out must have a contiguous last"),
    (dict(out=torch.zeros(3, 4, 32, device="meta")), ValueError, "out is on meta"),
    (dict(out="buffer"), TypeError, "out must be a torch.Tensor"),
    (dict(fa_version=3), ValueError, "fa_version must be 2"),
    (dict(scheduler_metadata=torch.zeros(4, dtype=torch.int32)), ValueError,
     "scheduler_metadata must be None"),
    (dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    (dict(sinks=torch.zeros(4), s_aux=torch.zeros(4)), ValueError, "as sinks or as s_aux"),
    (dict(return_softmax_lse=True, return_attn_probs=True), ValueError,
     "return_softmax_lse .* or return_attn_probs"),
    (dict(q_descale=torch.ones(3)), ValueError, r"q_descale must hold one value .* \(2, 2\)"),
    (dict(q_descale=torch.tensor(2.0)), ValueError, "q_descale applies to an FP8 q"),
    (dict(k_descale=torch.ones(2, 2, dtype=torch.int32)), TypeError,
     "k_descale must be a floating-point tensor"),
    (dict(block_table=None), ValueError, "cu_seqlens_k is required without a block_table"),
])
def test_vllm_call_bad_input(change, error, match):
    args = _vllm_args(**change)
    with pytest.raises(error, match=match):
        ipex_flash.flash_attn_varlen_func(**args)
    out = args["out"]
    if isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.shape == (3, 4, 32):
        assert (out == SENTINEL).all() or (out == 0).all()  # nothing written


def test_fp8_query_needs_an_fp8_cache():
    args = _vllm_args(out=None)
    args["q"] = args["q"].to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="q is torch.float8_e4m3fn, which needs an FP8 cache"):
        ipex_flash.flash_attn_varlen_func(**args)


def test_table_entries_past_each_sequences_pages_may_hold_anything():
    """transformers marks a sequence's unallocated table slots -1 and vLLM leaves stale pages
    there: entries past a sequence's pages are never read, so any value passes, on the serving
    call's general path and its decode plan, and on the kvcache call with an append; an entry a
    sequence reads is still checked."""
    lens = [(1, 20), (1, 33)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (4, 2), 32, 16,
                                                                      torch.float32)
    tables[0, 2:] = -1  # sequence 0 reads 2 pages, sequence 1 all 3
    tables[1, 3:] = 10 ** 6
    for _ in range(3):  # (the first call checks on the general path, the others run the plan)
        out = ipex_flash.flash_attn_varlen_func(query, key_cache, value_cache, cu_q, None, 1, 33,
                                                causal=True, block_table=tables,
                                                seqused_k=seqused)
        check_sequences(out, None, query, key_cache, value_cache, tables, cu_q, lens,
                        torch.float32)
    new = torch.randn(2, 1, 2, 32)
    ipex_flash.flash_attn_with_kvcache(query[:, None], key_cache, value_cache, k=new, v=new,
                                       cache_seqlens=seqused - 1, block_table=tables)
    assert torch.equal(key_cache[tables[0, 1].long(), 19 - 16], new[0, 0])
    bad = tables.clone()
    bad[0, 1] = -1  # a page sequence 0 reads
    with pytest.raises(ValueError, match=r"block_table entries must be page indices in \[0, "):
        ipex_flash.flash_attn_varlen_func(query, key_cache, value_cache, cu_q, None, 1, 33,
                                          causal=True, block_table=bad, seqused_k=seqused)


def test_a_scale_changed_in_place_is_seen():
    """One-value descales are read on the host once per tensor and version: a scale tensor
    updated in place between steps (a calibration) is applied as updated."""
    lens = [(1, 40), (3, 20)]
    query, key_cache, value_cache, tables, cu_q, seqused = vllm_batch(lens, (4, 2), 32, 16,
                                                                      torch.float32)
    k_scale, v_scale = torch.ones(1), torch.ones(1)
    for value in (1.0, 2.0, 0.5):
        k_scale.fill_(value)
        v_scale.fill_(1 / value)
        out = ipex_flash.flash_attn_varlen_func(
            q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_q, max_seqlen_q=3,
            seqused_k=seqused, max_seqlen_k=40, causal=True, block_table=tables,
            k_descale=k_scale.expand(2, 2), v_descale=v_scale.expand(2, 2))
        check_sequences(out, None, query, key_cache, value_cache, tables, cu_q, lens,
                        torch.float32, scales=(1.0, value, 1 / value))
