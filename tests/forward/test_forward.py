"""The forward kernel against a float64 reference, over dtypes, head dims, lengths that are
not multiples of the tiles, masks, GQA ratios and layouts."""
import pytest
import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash.reference import attention_reference

from helpers.cases import DTYPES, random_qkv, tiered
from helpers.reference import assert_matches_reference

HEAD_DIMS = [1, 32, 59, 64, 80, 96, 111, 128, 256]
# (Nq, Nk): single rows and keys, lengths around and off the 16/64 tile sizes, Nq != Nk.
LENGTHS = [(1, 1), (1, 17), (17, 1), (127, 127), (113, 203), (300, 300), (300, 127)]


# Default tier: the smallest, two odd, the common and the largest head dim; the long tier all.
@pytest.mark.parametrize("len_q,len_k", LENGTHS)
@pytest.mark.parametrize("head_dim", tiered(HEAD_DIMS, [1, 59, 111, 128, 256]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype, causal, head_dim, len_q, len_k):
    q, k, v = random_qkv(2, 2, 1, len_q, len_k, head_dim, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (4, 2), (6, 1), (8, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_query_heads(dtype, causal, heads_q, heads_kv):
    q, k, v = random_qkv(3, heads_q, heads_kv, 70, 90, 64, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_inputs_keep_their_layout(dtype, causal):
    q, k, v = random_qkv(2, 4, 2, 77, 100, 96, dtype, layout="bnhd")
    assert not q.is_contiguous()
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
    assert out.stride() == q.stride(), "output should come back in q's (B, N, H, D) layout"


@pytest.mark.parametrize("len_q", [1, 3])  # the decode kernel, the forward
@pytest.mark.parametrize("matrix", ["0", "emulate", "emulate8"])
def test_bfloat16_outputs_round_like_torch(monkeypatch, matrix, len_q):
    """bfloat16 outputs are rounded as torch rounds: to nearest, ties to even, subnormals kept.
    With equal scores over two keys each output is (v1 + v2) / 2, exact in float32; v2 one or
    two steps above v1 makes it a tie or a representable value, and random pairs of one
    binade anything else."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", matrix)
    bits = torch.randint(0, 0x7f7e, (8, 1, 1, 128), dtype=torch.int32)
    bits[..., :8] = torch.arange(8, dtype=torch.int32)  # zero and the smallest subnormals
    step = torch.randint(1, 3, bits.shape, dtype=torch.int32)
    step[..., 64:] = torch.randint(0, 128, (8, 1, 1, 64), dtype=torch.int32)  # same binade
    second = torch.where(torch.arange(128) < 64, bits + step, (bits & ~0x7f) | step)
    sign = (torch.randint(0, 2, bits.shape, dtype=torch.int32) << 15)
    as_bf16 = lambda b: (b | sign).to(torch.int16).view(torch.bfloat16)
    v = torch.cat([as_bf16(bits), as_bf16(second)], dim=2)  # (8, 1, 2, 128)
    k = torch.randn(8, 1, 2, 128, dtype=torch.bfloat16)
    q = torch.zeros(8, 1, len_q, 128, dtype=torch.bfloat16)
    out = ipex_flash.attention(q, k, v)
    expected = ((v[:, :, :1].float() + v[:, :, 1:].float()) * 0.5).bfloat16()
    assert torch.equal(out.view(torch.int16), expected.expand_as(out).view(torch.int16))


def test_broadcast_and_noncontiguous_last_dim():
    """K shared across the batch by a stride-0 view, V with a strided last dimension (which
    costs a copy), Q a slice of a larger tensor."""
    q_big = torch.randn(2, 3, 50, 128)
    q = q_big[:, :, 5:45, :64]
    k = torch.randn(1, 3, 61, 64).expand(2, 3, 61, 64)
    v = torch.randn(2, 3, 61, 128)[..., ::2]
    assert v.stride(-1) == 2 and k.stride(0) == 0
    out, lse = ipex_flash.attention(q, k, v, causal=True, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=True)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_explicit_scale(scale):
    q, k, v = random_qkv(1, 2, 2, 40, 40, 32, torch.float32)
    out, lse = ipex_flash.attention(q, k, v, scale=scale, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, scale=scale)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_long_sequence(causal):
    """Many K/V blocks per work-group and many Q blocks: the online softmax rescaling and the
    causal block skipping over a long row."""
    q, k, v = random_qkv(1, 2, 1, 1100, 1500, 64, torch.float32)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


def test_large_scores_do_not_overflow():
    """Scores around 1e3 overflow a naive exp; the running max must keep them finite."""
    q, k, v = random_qkv(1, 1, 1, 65, 130, 64, torch.float32)
    out, lse = ipex_flash.attention(q * 30, k * 30, v, return_lse=True)
    ref_out, ref_lse = attention_reference(q * 30, k * 30, v)
    assert torch.isfinite(out).all()
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_matches_torch_sdpa(dtype, causal):
    """torch.ops.ipex_flash.attention against SDPA at the same precision: the kernel may not
    be further from the float64 truth than twice SDPA's own error (plus float32 noise)."""
    q, k, v = random_qkv(2, 8, 2, 150, 150, 64, dtype)
    out = torch.ops.ipex_flash.attention(q, k, v, causal=causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    ref, _ = attention_reference(q, k, v, causal=causal)
    kernel_error = (out.double() - ref).abs().max().item()
    sdpa_error = (sdpa.double() - ref).abs().max().item()
    assert kernel_error <= 2 * sdpa_error + 1e-5, (kernel_error, sdpa_error)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_sdpa(causal):
    """The reference itself, against torch's SDPA in float64, including GQA and Nq != Nk."""
    q, k, v = (t.double() for t in random_qkv(2, 6, 3, 33, 47, 40, torch.float32))
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(ref_out, sdpa, rtol=1e-12, atol=1e-12)
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)) / 40**0.5
    if causal:
        scores = scores.masked_fill(~torch.ones(33, 47, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(ref_lse, scores.logsumexp(-1), rtol=1e-12, atol=1e-12)


def test_repeated_calls_are_identical_and_inputs_untouched():
    q, k, v = random_qkv(2, 4, 2, 129, 257, 80, torch.bfloat16, layout="bnhd")
    originals = [t.clone() for t in (q, k, v)]
    first = ipex_flash.attention(q, k, v, causal=True)
    for _ in range(3):
        assert torch.equal(ipex_flash.attention(q, k, v, causal=True), first)
    for t, original in zip((q, k, v), originals):
        assert torch.equal(t, original)
        assert t.stride() == original.stride() or not t.is_contiguous()


@pytest.mark.parametrize("shape", [(0, 2, 10, 32), (1, 2, 0, 32)])
def test_empty_batch_or_queries_give_empty_output(shape):
    q = torch.randn(shape)
    k = torch.randn(shape[0], 2, 7, 32)
    out, lse = ipex_flash.attention(q, k, k, return_lse=True)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
