"""flash-attn's layout and options: (B, N, H, D) inputs, packed sequences (cu_seqlens), every
score option alone and combined, the output-and-LSE check and the gradient check. Shared by
api/test_flash_attn_api.py, api/test_flash_attn_packed.py and the matrix tests."""
import ipex_flash
import torch
from ipex_flash.reference import flash_attn_reference

from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE

# (causal, window, softcap, alibi): every option alone, and combined.
OPTIONS = [
    (False, (-1, -1), 0.0, False),
    (True, (-1, -1), 0.0, False),
    (False, (16, 5), 0.0, False),
    (False, (0, 0), 0.0, False),
    (True, (30, -1), 0.0, False),
    (False, (-1, -1), 4.0, False),
    (False, (-1, -1), 0.0, True),
    (True, (20, -1), 2.5, True),
    (False, (40, 7), 10.0, True),
]


def random_bnhd(batch, len_q, len_k, heads_q, heads_kv, head_dim, dtype):
    return (torch.randn(batch, len_q, heads_q, head_dim, dtype=dtype),
            torch.randn(batch, len_k, heads_kv, head_dim, dtype=dtype),
            torch.randn(batch, len_k, heads_kv, head_dim, dtype=dtype))


def assert_close_with_lse(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
    # Rows that see no key: LSE -inf in both; others compared as numbers.
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = ~torch.isneginf(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=LSE_TOLERANCE[0],
                               atol=LSE_TOLERANCE[1])


def pack(tensors_per_seq):
    lengths = [t.shape[0] for t in tensors_per_seq]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return torch.cat(tensors_per_seq), cu, max(lengths)


def check_gradients_match_reference(dtype, causal, window, softcap, alibi, head_dim=64,
                                    lengths=(70, 90)):
    """flash_attn_func's dq, dk, dv against float64 autograd through the reference, within
    the dtype's tolerance relative to each gradient's largest element; lengths: (queries,
    keys)."""
    q, k, v = random_bnhd(2, *lengths, 4, 2, head_dim, dtype)
    slopes = torch.rand(4) * 0.3 if alibi else None
    grad_out = torch.randn(q.shape, dtype=dtype)
    a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
    ipex_flash.flash_attn_func(a, b, c, causal=causal, window_size=window, softcap=softcap,
                               alibi_slopes=slopes).backward(grad_out)
    a64, b64, c64 = (t.double().requires_grad_() for t in (q, k, v))
    flash_attn_reference(a64, b64, c64, causal, window, softcap, slopes)[0].backward(grad_out.double())
    rtol, _ = OUTPUT_TOLERANCE[dtype]
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad), (c.grad, c64.grad)):
        assert got.dtype == dtype
        error = (got.double() - want).abs().max().item()
        assert error <= rtol * max(1.0, want.abs().max().item()), error
