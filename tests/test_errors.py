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
    (dict(v=(2, 2, 12, 257)), r"v's head_dim \(v.shape\[3\]\) must be in \[1, 256\], got 257"),
    (dict(v=(2, 2, 13, 32)), r"v must have k's heads and seq_len"),
    (dict(k=(2, 3, 12, 32), v=(2, 3, 12, 32)), r"head count \(4\) must be a multiple of k's and v's \(3\)"),
    (dict(q=(2, 4, 10, 300), k=(2, 2, 12, 300), v=(2, 2, 12, 300)), r"head_dim .* must be in \[1, 256\], got 300"),
    (dict(k=(2, 2, 0, 32), v=(2, 2, 0, 32)), r"at least one key"),
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
    with pytest.raises(RuntimeError, match=r"(?s)building SYCL kernel .*flash_fwd_kernel<float, 20, 64, 64, 0>.*tile shape"):
        C.build_kernel("flash_fwd.hpp", "ipex_flash::flash_fwd_kernel<float, 20, 64, 64, 0>")
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
