"""The KV-cache and paged serving calls have no backward (kvcache/inference_only.py): with
inputs that need gradients their forward still matches float64, and a backward through them,
eager or compiled, raises an error that says they are inference ops and names the calls to
train with."""
import pytest
import torch

import ipex_flash
from helpers.engine_cases import reference, sequence_keys
from helpers.reference import OUTPUT_TOLERANCE

HEADS_Q, HEADS_KV, HEAD_DIM, PAGE_SIZE = 4, 2, 32, 16
KEYS = [5, 40]  # per sequence, in the cache
NO_BACKWARD = (r"is an inference op \(KV cache, paged serving call\) and has no backward\. "
               r"To train, .*ipex_flash\.flash_attn_func .*flash_attn_varlen_func without "
               r"block_table.*ipex_flash\.attention or ipex_flash\.scaled_dot_product_attention")


def paged_cache(dtype):
    """Caches of shuffled pages and the block table of the sequences holding KEYS keys."""
    width = -(-max(KEYS) // PAGE_SIZE)
    pool = len(KEYS) * width
    k_cache, v_cache = (torch.randn(pool, PAGE_SIZE, HEADS_KV, HEAD_DIM).to(dtype)
                        for _ in range(2))
    table = torch.randperm(pool).view(len(KEYS), width).to(torch.int32)
    return k_cache, v_cache, table


def check_sequence(out, q, k_cache, v_cache, row, n_k, sinks=None):
    """out and q of one sequence, (Nq, H, D), against float64 over its first n_k keys."""
    ref, _ = reference(q.detach().double(), sequence_keys(k_cache, row, n_k).detach().double(),
                       sequence_keys(v_cache, row, n_k).detach().double(),
                       sinks=None if sinks is None else sinks.detach())
    rtol, atol = OUTPUT_TOLERANCE[q.dtype]
    torch.testing.assert_close(out.detach().double(), ref, rtol=rtol, atol=atol)


def kvcache_call(q, k_cache, v_cache, table, sinks=None):
    return ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(KEYS, dtype=torch.int32),
        block_table=table, causal=True, sinks=sinks)


def serving_call(q, k_cache, v_cache, table, sinks=None, out=None):
    """One new token per sequence, the cache already holding it (vLLM's call)."""
    cu_q = torch.arange(len(KEYS) + 1, dtype=torch.int32)
    return ipex_flash.flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, None, 1, max(KEYS), causal=True, block_table=table,
        seqused_k=torch.tensor(KEYS, dtype=torch.int32), sinks=sinks, out=out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("needs_grad", ["q", "sinks", "k_cache"])
def test_kvcache_call_has_no_backward(dtype, needs_grad):
    k_cache, v_cache, table = paged_cache(dtype)
    q = torch.randn(len(KEYS), 1, HEADS_Q, HEAD_DIM).to(dtype)
    sinks = torch.randn(HEADS_Q)
    {"q": q, "sinks": sinks, "k_cache": k_cache}[needs_grad].requires_grad_()
    out = kvcache_call(q, k_cache, v_cache, table, sinks)
    for b, n_k in enumerate(KEYS):
        check_sequence(out[b], q[b], k_cache, v_cache, table[b], n_k, sinks)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="flash_attn_with_kvcache " + NO_BACKWARD):
        out.sum().backward()


def test_kvcache_append_then_backward():
    """New keys appended by the call and q needing gradients: the same error."""
    k_cache, v_cache, table = paged_cache(torch.float32)
    q = torch.randn(len(KEYS), 1, HEADS_Q, HEAD_DIM, requires_grad=True)
    k, v = (torch.randn(len(KEYS), 1, HEADS_KV, HEAD_DIM, requires_grad=True) for _ in range(2))
    lens = torch.tensor(KEYS, dtype=torch.int32) - 1  # the new token is each sequence's last
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=lens,
                                             block_table=table, causal=True)
    for b, n_k in enumerate(KEYS):
        check_sequence(out[b], q[b], k_cache, v_cache, table[b], n_k)
    with pytest.raises(NotImplementedError, match=NO_BACKWARD):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("into_out", [False, True], ids=["returned", "out="])
def test_serving_call_has_no_backward(dtype, into_out):
    """flash_attn_varlen_func with block_table, its output returned or written into out=
    (which then carries the same backward)."""
    k_cache, v_cache, table = paged_cache(dtype)
    q = torch.randn(len(KEYS), HEADS_Q, HEAD_DIM).to(dtype).requires_grad_()
    out = torch.zeros(len(KEYS), HEADS_Q, HEAD_DIM, dtype=dtype) if into_out else None
    result = serving_call(q, k_cache, v_cache, table, out=out)
    if into_out:
        assert result is out
    for b, n_k in enumerate(KEYS):
        check_sequence(result[b:b + 1], q[b:b + 1], k_cache, v_cache, table[b], n_k)
    with pytest.raises(NotImplementedError,
                       match="flash_attn_varlen_func with block_table .*" + NO_BACKWARD):
        result.sum().backward()


def test_without_gradients_nothing_changes():
    """Under no_grad (and with inputs that need none) the output carries no backward."""
    k_cache, v_cache, table = paged_cache(torch.float32)
    q = torch.randn(len(KEYS), HEADS_Q, HEAD_DIM, requires_grad=True)
    with torch.no_grad():
        out = serving_call(q, k_cache, v_cache, table, out=torch.empty(q.shape))
    assert not out.requires_grad
    assert not kvcache_call(q.detach()[:, None], k_cache, v_cache, table).requires_grad


@pytest.mark.parametrize("call", ["kvcache", "serving"])
def test_compiled_forward_runs_and_backward_raises(call):
    """torch.compile traces the backward ahead (on fake tensors): the forward compiles and
    matches, and the backward raises when it runs."""
    k_cache, v_cache, table = paged_cache(torch.float32)
    shape = (len(KEYS), 1, HEADS_Q, HEAD_DIM) if call == "kvcache" else (len(KEYS), HEADS_Q,
                                                                          HEAD_DIM)
    q = torch.randn(shape, requires_grad=True)
    function = kvcache_call if call == "kvcache" else serving_call
    compiled = torch.compile(lambda q: function(q, k_cache, v_cache, table), backend="aot_eager")
    out = compiled(q)
    for b, n_k in enumerate(KEYS):
        check_sequence(out[b].view(-1, HEADS_Q, HEAD_DIM), q[b].view(-1, HEADS_Q, HEAD_DIM),
                       k_cache, v_cache, table[b], n_k)
    with pytest.raises(NotImplementedError, match=NO_BACKWARD):
        out.sum().backward()
