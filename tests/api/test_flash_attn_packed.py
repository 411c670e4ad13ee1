"""flash-attn's four packed functions against the float64 reference of the unpacked inputs:
outputs, LSE and the gradient that flows back into the packed tensor."""
import pytest
import torch

import ipex_flash
from ipex_flash.reference import flash_attn_reference

from helpers.cases import DTYPES
from helpers.flash_attn import pack
from helpers.reference import OUTPUT_TOLERANCE


def assert_close(got, want, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


def assert_grad_close(got, want, dtype):
    """Gradients sum over many rows: the tolerance is relative to the largest element."""
    rtol, _ = OUTPUT_TOLERANCE[dtype]
    error = (got.double() - want).abs().max().item()
    assert error <= rtol * max(1.0, want.abs().max().item()), error


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (9, 3))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qkvpacked(dtype, causal, window):
    qkv = torch.randn(2, 77, 3, 4, 40, dtype=dtype)
    packed = qkv.clone().requires_grad_()
    out, lse, _ = ipex_flash.flash_attn_qkvpacked_func(packed, 0.0, None, causal, window,
                                                       return_attn_probs=True)
    grad = torch.randn(out.shape, dtype=dtype)
    out.backward(grad)
    ref64 = qkv.double().requires_grad_()
    q, k, v = ref64.unbind(2)
    ref_out, ref_lse = flash_attn_reference(q, k, v, causal, window)
    ref_out.backward(grad.double())
    assert_close(out, ref_out.detach(), dtype)
    torch.testing.assert_close(lse.double(), ref_lse.detach(), rtol=1e-4, atol=1e-4)
    assert packed.grad.shape == qkv.shape
    assert_grad_close(packed.grad, ref64.grad, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvpacked_grouped_heads(dtype, causal):
    q = torch.randn(2, 50, 6, 64, dtype=dtype)
    kv = torch.randn(2, 90, 2, 2, 64, dtype=dtype)
    a, b = q.clone().requires_grad_(), kv.clone().requires_grad_()
    out = ipex_flash.flash_attn_kvpacked_func(a, b, causal=causal, softcap=5.0)
    grad = torch.randn(out.shape, dtype=dtype)
    out.backward(grad)
    a64, b64 = q.double().requires_grad_(), kv.double().requires_grad_()
    k, v = b64.unbind(2)
    ref_out, _ = flash_attn_reference(a64, k, v, causal, (-1, -1), 5.0)
    ref_out.backward(grad.double())
    assert_close(out, ref_out.detach(), dtype)
    assert_grad_close(a.grad, a64.grad, dtype)
    assert_grad_close(b.grad, b64.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_packed_functions(dtype):
    lengths = [(5, 5), (1, 1), (70, 70), (33, 33)]
    qkvs = [torch.randn(n, 3, 4, 32, dtype=dtype) for n, _ in lengths]
    qkv, cu, max_len = pack(qkvs)
    packed = qkv.clone().requires_grad_()
    out = ipex_flash.flash_attn_varlen_qkvpacked_func(packed, cu, max_len, causal=True)
    grad = torch.randn(out.shape, dtype=dtype)
    out.backward(grad)
    q, kv = qkv[:, 0], qkv[:, 1:]
    out_kv = ipex_flash.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max_len, max_len,
                                                        causal=True)
    for i, seq in enumerate(qkvs):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        ref64 = seq.double()[None].requires_grad_()
        ref_out, _ = flash_attn_reference(*ref64.unbind(2), True)
        ref_out.backward(grad[rows].double()[None])
        assert_close(out[rows], ref_out[0].detach(), dtype)
        assert_close(out_kv[rows], ref_out[0].detach(), dtype)
        assert_grad_close(packed.grad[rows], ref64.grad[0], dtype)


@pytest.mark.parametrize("fn,args,message", [
    ("flash_attn_qkvpacked_func", lambda: (torch.randn(2, 8, 2, 4, 16),), "qkv must have shape"),
    ("flash_attn_kvpacked_func", lambda: (torch.randn(2, 8, 4, 16), torch.randn(2, 8, 4, 16)),
     "kv must have shape"),
    ("flash_attn_varlen_qkvpacked_func",
     lambda: (torch.randn(8, 3, 4, 16, 1), torch.tensor([0, 8], dtype=torch.int32), 8),
     "qkv must have shape"),
])
def test_bad_packing_names_the_argument(fn, args, message):
    with pytest.raises(ValueError, match=message):
        getattr(ipex_flash, fn)(*args())
