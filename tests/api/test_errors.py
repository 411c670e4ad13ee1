"""Bad input raises a Python exception naming the argument, from the op and from the
wrapper, eagerly and with meta tensors; SYCL build failures become RuntimeErrors."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C


def good(**shapes):
    base = dict(q=(2, 4, 10, 32), k=(2, 2, 12, 32), v=(2, 2, 12, 32))
    base.update(shapes)
    return [torch.randn(base[n]) for n in ("q", "k", "v")]


BAD_SHAPES = [
    (dict(q=(4, 10, 32)), r"q must be 4-D"),
    (dict(k=(2, 2, 12, 32, 1)), r"k must be 4-D"),
    (dict(k=(3, 2, 12, 32)), r"k.shape\[0\] \(batch\) is 3"),
    (dict(v=(3, 2, 12, 32)), r"v.shape\[0\] \(batch\) is 3"),
    (dict(k=(2, 2, 12, 16)), r"k.shape\[3\] \(head_dim\) is 16"),
    (dict(v=(2, 2, 12, 513)), r"v's head_dim \(v.shape\[3\]\) must be in \[1, 512\], got 513"),
    (dict(v=(2, 2, 13, 32)), r"v must have k's heads and seq_len"),
    (dict(k=(2, 3, 12, 32), v=(2, 3, 12, 32)), r"head count \(4\) must be a multiple of k's and v's \(3\)"),
    (dict(q=(2, 4, 10, 600), k=(2, 2, 12, 600), v=(2, 2, 12, 64)), r"head_dim .* must be in \[1, 576\], got 600"),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("shapes,message", BAD_SHAPES)
def test_bad_shapes(shapes, message, device):
    q, k, v = (t.to(device) for t in good(**shapes))
    with pytest.raises(ValueError, match=message):
        torch.ops.ipex_flash.attention(q, k, v)


def test_mixed_dtypes():
    q, k, v = good()
    with pytest.raises(TypeError, match=r"k.dtype \(torch.float16\) must equal q.dtype"):
        ipex_flash.attention(q, k.half(), v)
    with pytest.raises(TypeError, match=r"v.dtype \(torch.bfloat16\) must equal q.dtype"):
        ipex_flash.attention(q, k, v.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
def test_unsupported_dtype(dtype):
    q, k, v = (t.to(dtype) for t in good())
    with pytest.raises(TypeError, match=rf"q has dtype {dtype}; expected torch.float32"):
        ipex_flash.attention(q, k, v)


def test_mixed_devices():
    q, k, v = good()
    with pytest.raises(ValueError, match=r"k is on meta but q is on cpu"):
        torch.ops.ipex_flash.attention(q, k.to("meta"), v)


def test_not_a_tensor():
    q, k, v = good()
    with pytest.raises(TypeError, match=r"v must be a torch.Tensor, got list"):
        ipex_flash.attention(q, k, v.tolist())


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_non_finite_scale(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite number"):
        ipex_flash.attention(*good(), scale=scale)


def test_kernel_build_failure_is_a_runtime_error_with_the_log():
    """A variant the device code rejects (head dim not a multiple of the unroll) fails in the
    kernel compiler; the error must come back as an exception carrying its message."""
    with pytest.raises(RuntimeError, match=r"(?s)building SYCL kernel .*flash_fwd_kernel<float, 20, 64, 64, 0, 20>.*tile shape"):
        C.build_kernel("programs/flash_fwd.hpp", "ipex_flash::flash_fwd_kernel<float, 20, 64, 64, 0, 20>")
    # The process survives and the op still works afterwards.
    q, k, v = good()
    assert torch.isfinite(ipex_flash.attention(q, k, v)).all()


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_meaningless_scale_is_refused_everywhere(scale):
    """A NaN or infinite scale would make every output NaN: each entry point refuses it,
    naming its argument, before anything is computed or written."""
    q, k, v = (torch.randn(2, 10, 4, 32), torch.randn(2, 12, 2, 32), torch.randn(2, 12, 2, 32))
    with pytest.raises(ValueError, match="scale must be a finite number or None, got"):
        ipex_flash.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2), scale=scale, enable_gqa=True)
    with pytest.raises(ValueError, match=r"ipex_flash.attention: scale must be a finite number"):
        torch.ops.ipex_flash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       scale=scale)
    with pytest.raises(ValueError, match="flash_attn_func: softmax_scale must be a finite"):
        ipex_flash.flash_attn_func(q, k, v, softmax_scale=scale)
    cu_q = torch.tensor([0, 10, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 12, 24], dtype=torch.int32)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: softmax_scale must be a finite"):
        ipex_flash.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                          cu_q, cu_k, 10, 12, softmax_scale=scale)
    k_cache, v_cache = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    before = k_cache.clone(), v_cache.clone()
    with pytest.raises(ValueError, match="flash_attn_with_kvcache: softmax_scale must be a finite"):
        ipex_flash.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, k=k[:, :1], v=v[:, :1],
                                           cache_seqlens=3, softmax_scale=scale)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    page_table = torch.arange(2, dtype=torch.int32).view(2, 1)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: softmax_scale must be a finite"):
        ipex_flash.flash_attn_varlen_func(q[:, :1].flatten(0, 1), k_cache, v_cache,
                                          torch.tensor([0, 1, 2], dtype=torch.int32), cu_k, 1,
                                          12, softmax_scale=scale, block_table=page_table)


def _head_dim_zero_calls():
    """Every entry point, called with head dim 0 (q, k, v (B, N, H, 0) in flash-attn's layout)."""
    q, k = torch.randn(1, 5, 2, 0), torch.randn(1, 6, 2, 0)
    cu_q, cu_k = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 6], dtype=torch.int32)
    pages = torch.randn(2, 16, 2, 0)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    bhnd = [t.transpose(1, 2) for t in (q, k, k)]
    return {
        "sdpa": lambda: ipex_flash.scaled_dot_product_attention(*bhnd),
        "op": lambda: torch.ops.ipex_flash.attention(*bhnd),
        "attention": lambda: ipex_flash.attention(*bhnd),
        "flash_attn_func": lambda: ipex_flash.flash_attn_func(q, k, k),
        "varlen": lambda: ipex_flash.flash_attn_varlen_func(q[0], k[0], k[0], cu_q, cu_k, 5, 6),
        "kvcache": lambda: ipex_flash.flash_attn_with_kvcache(q, k, k),
        "qkvpacked": lambda: ipex_flash.flash_attn_qkvpacked_func(torch.randn(1, 5, 3, 2, 0)),
        "kvpacked": lambda: ipex_flash.flash_attn_kvpacked_func(q, torch.randn(1, 6, 2, 2, 0)),
        "paged": lambda: ipex_flash.flash_attn_varlen_func(q[0], pages, pages, cu_q, cu_k, 5, 6,
                                                           block_table=table),
    }


@pytest.mark.parametrize("entry", sorted(_head_dim_zero_calls()))
def test_head_dim_zero_is_refused_everywhere(entry):
    """1 / sqrt(head_dim) is undefined: every entry point names the head dim, never divides."""
    with pytest.raises(ValueError, match=r"head dim .* must be at least 1|head_dim \(q.shape\[3\]\) "
                                         r"must be in \[1, 576\], got 0"):
        _head_dim_zero_calls()[entry]()


def test_empty_kv_cache_is_refused():
    """A KV cache holds keys; attention itself takes none (test_empty_inputs.py)."""
    q, cache = torch.randn(1, 1, 2, 32), torch.randn(1, 0, 2, 32)
    with pytest.raises(ValueError, match=r"flash_attn_with_kvcache: k and v must have at least one key"):
        ipex_flash.flash_attn_with_kvcache(q, cache, cache)


def test_sdpa_zero_query_rows_with_leading_dims():
    """As torch: an empty output of the right shape, also with leading dimensions."""
    q, k = torch.randn(1, 1, 1, 0, 1), torch.randn(1, 1, 1, 3, 1)
    out = ipex_flash.scaled_dot_product_attention(q, k, k)
    assert out.shape == torch.nn.functional.scaled_dot_product_attention(q, k, k).shape


def test_window_wider_than_32_bits_is_no_window():
    """The kernels' windows are 32-bit; a wider one hides nothing, as no window."""
    q, k, v = torch.randn(1, 20, 2, 32), torch.randn(1, 30, 2, 32), torch.randn(1, 30, 2, 32)
    unbounded = ipex_flash.flash_attn_func(q, k, v, window_size=(-1, -1))
    for window in [(2**31, 2**31), (2**40, 2**63)]:
        assert torch.equal(ipex_flash.flash_attn_func(q, k, v, window_size=window), unbounded)
    k_cache, v_cache = torch.randn(1, 30, 2, 32), torch.randn(1, 30, 2, 32)
    assert torch.equal(
        ipex_flash.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, window_size=(2**40, 0)),
        ipex_flash.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache))


def test_window_wider_than_any_sequence_is_no_window_in_the_varlen_calls():
    """Up to and past the 32-bit boundary, packed and paged alike."""
    q, k, v = torch.randn(20, 2, 32), torch.randn(30, 2, 32), torch.randn(30, 2, 32)
    cu_q, cu_k = (torch.tensor([0, 7, n], dtype=torch.int32) for n in (20, 30))
    pages = torch.randn(4, 16, 2, 32), torch.randn(4, 16, 2, 32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    for call in (lambda w: ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 13, 23,
                                                             window_size=w),
                 lambda w: ipex_flash.flash_attn_varlen_func(q, *pages, cu_q, cu_k, 13, 23,
                                                             window_size=w, block_table=table)):
        unbounded = call((-1, -1))
        for window in [(2**31 - 1, 2**31 - 1), (2**31, 2**31), (2**40, -1)]:
            assert torch.equal(call(window), unbounded)


def test_max_seqlen_beyond_32_bits_is_refused():
    q = torch.randn(5, 2, 32)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    pages = torch.randn(1, 16, 2, 32)
    table = torch.tensor([[0]], dtype=torch.int32)
    for name, lengths in (("max_seqlen_q", (2**31, 5)), ("max_seqlen_k", (5, 2**40)),
                          ("max_seqlen_k", (5, -1))):
        with pytest.raises(ValueError, match=name + r" must be an int in \[0, 2\^31 - 1\]"):
            ipex_flash.flash_attn_varlen_func(q, q, q, cu, cu, *lengths)
        with pytest.raises(ValueError, match=name + r" must be an int in \[0, 2\^31 - 1\]"):
            ipex_flash.flash_attn_varlen_func(q, pages, pages, cu, cu, *lengths, block_table=table)


def test_more_splits_than_key_blocks_is_one_per_block():
    """num_splits is a hint: past one split per 16 keys (the decode kernel's smallest key
    block) it would only add empty splits, and once asked for memory in proportion."""
    q, k_cache, v_cache = torch.randn(2, 1, 4, 32), torch.randn(2, 50, 2, 32), torch.randn(2, 50, 2, 32)
    assert C.most_splits(50) == 4 and C.DECODE_MIN_BLOCK_KEYS == 16
    huge = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=2**40)
    for splits in (4, 50):
        assert torch.equal(huge, ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                                    num_splits=splits))


@pytest.mark.parametrize("which", ["expanded", "requires_grad"])
def test_append_into_a_shared_or_differentiable_cache_is_refused(which):
    k_cache = torch.zeros(2, 8, 2, 32)
    v_cache = torch.zeros(2, 8, 2, 32)
    if which == "expanded":
        k_cache = torch.zeros(1, 8, 2, 32).expand(2, 8, 2, 32)
        message = r"k_cache is expanded \(stride 0 in dimension 0\)"
    else:
        v_cache.requires_grad_()
        message = "v_cache requires grad"
    before = k_cache.clone(), v_cache.detach().clone()
    new = torch.randn(2, 1, 2, 32)
    with pytest.raises(ValueError, match=message):
        ipex_flash.flash_attn_with_kvcache(torch.randn(2, 1, 2, 32), k_cache, v_cache, k=new,
                                           v=new, cache_seqlens=1)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache.detach(), before[1])


@pytest.mark.parametrize("which", ["expanded", "requires_grad"])
def test_append_op_refuses_a_shared_or_differentiable_cache(which):
    """torch.ops.ipex_flash.kvcache_append checks for itself, whoever calls it."""
    k_cache, v_cache = torch.zeros(2, 8, 2, 32), torch.zeros(1, 8, 2, 32).expand(2, 8, 2, 32)
    message = r"v_cache is expanded \(stride 0 in dimension 0\)"
    if which == "requires_grad":
        v_cache = torch.zeros(2, 8, 2, 32)
        k_cache.requires_grad_()
        message = "k_cache requires grad"
    new, seqlens = torch.randn(2, 1, 2, 32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        torch.ops.ipex_flash.kvcache_append(k_cache, v_cache, new, new, seqlens, None)
    assert not k_cache.detach().any() and not v_cache.any()
