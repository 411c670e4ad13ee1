"""ipex_flash.scaled_dot_product_attention against the float64 reference: masks (bool and
additive, every broadcast shape, read in place), sinks, softcap, leading dimensions, the
small-query (decode kernel) route, and gradients in q, k, v, sinks and a learned mask."""
import pytest
import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash.reference import sdpa_reference

from helpers.cases import DTYPES, random_qkv
from helpers.reference import OUTPUT_TOLERANCE
from helpers.sdpa import B, HKV, HQ, check_masked_gradients, grads_of, mask_of


def check_output(out, ref, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


MASK_SHAPES = {  # (Nq, Nk) = (70, 90): neither a multiple of the 64-row tiles
    "full": (B, HQ, 70, 90),
    "per_batch": (B, 1, 70, 90),
    "shared_2d": (70, 90),
    "padding": (B, 1, 1, 90),
    "per_head_row": (1, HQ, 70, 1),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", list(MASK_SHAPES))
@pytest.mark.parametrize("kind", ["bool", "float32", "query_dtype"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_forward_matches_reference(dtype, kind, shape, causal):
    q, k, v = random_qkv(B, HQ, HKV, 70, 90, 64, dtype)
    mask_dtype = torch.float32 if kind == "float32" else dtype
    mask = mask_of(kind, MASK_SHAPES[shape], mask_dtype)
    before = mask.clone()
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
    check_output(out, sdpa_reference(q, k, v, mask, causal), dtype)
    assert torch.equal(mask, before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_read_through_strides(dtype):
    """A transposed mask and one expanded over heads (stride 0) are read in place."""
    q, k, v = random_qkv(B, HQ, HKV, 70, 90, 48, dtype)
    transposed = (torch.rand(B, 1, 90, 70) > 0.3).transpose(-1, -2)
    expanded = (torch.rand(B, 1, 70, 90) > 0.3).expand(B, HQ, 70, 90)
    for mask in (transposed, expanded):
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        check_output(out, sdpa_reference(q, k, v, mask), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hidden_blocks_and_fully_masked_rows(dtype):
    """Padding that hides whole 64-key blocks (which the kernels skip), and rows that see no
    key at all: their output is 0, as torch's SDPA gives."""
    q, k, v = random_qkv(B, HQ, HKV, 150, 300, 64, dtype)
    lengths = torch.tensor([300, 97])
    mask = (torch.arange(300).view(1, 1, 1, -1) < lengths.view(-1, 1, 1, 1)).expand(B, 1, 150, 300)
    mask = mask.clone()
    mask[:, :, 5] = False
    mask[1, :, 120:] = False
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    check_output(out, sdpa_reference(q, k, v, mask), dtype)
    assert out[:, :, 5].abs().max() == 0 and out[1, :, 120:].abs().max() == 0
    torch_out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                               enable_gqa=True)
    assert torch_out[:, :, 5].abs().max() == 0  # the behaviour matched is torch's own


@pytest.mark.parametrize("len_q", [1, 3, 16])
@pytest.mark.parametrize("kind", ["none", "bool", "float32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_queries_take_the_decode_kernel(dtype, kind, len_q):
    """Few query rows per K/V head run the split-KV decode kernel, masks and sinks included."""
    q, k, v = random_qkv(B, 8, 2, len_q, 333, 64, dtype)
    mask = None if kind == "none" else mask_of(kind, (B, 1, len_q, 333), torch.float32)
    sinks = torch.randn(8)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                                  sinks=sinks, is_causal=len_q > 1)
    check_output(out, sdpa_reference(q, k, v, mask, len_q > 1, sinks=sinks), dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_and_softcap_forward(dtype, causal):
    q, k, v = random_qkv(B, HQ, HKV, 70, 90, 64, dtype)
    sinks = torch.randn(HQ) * 2
    mask = mask_of("bool", (B, 1, 70, 90), dtype)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True, sinks=sinks, softcap=5.0)
    check_output(out, sdpa_reference(q, k, v, mask, causal, softcap=5.0, sinks=sinks), dtype)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_leading_dimensions(lead):
    """(..., H, L, E) with any number of leading dimensions; (L, E) too."""
    dtype = torch.float32
    q = torch.randn(*lead, HQ, 33, 32)
    k, v = torch.randn(*lead, 1, 41, 32), torch.randn(*lead, 1, 41, 32)
    mask = torch.rand(33, 41) > 0.2
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert out.shape == want.shape
    check_output(out, want, dtype)
    two_d = ipex_flash.scaled_dot_product_attention(q.reshape(-1, 33, 32)[0], k.reshape(-1, 41, 32)[0],
                                                    v.reshape(-1, 41, 32)[0], is_causal=True)
    check_output(two_d, F.scaled_dot_product_attention(
        *(t.reshape(-1, t.shape[-2], 32)[0].double() for t in (q, k, v)), is_causal=True), dtype)


# ---- gradients ----

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "float32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_gradients(dtype, kind, causal):
    check_masked_gradients(dtype, kind, causal)


def test_sink_gradient():
    q, k, v = random_qkv(B, HQ, HKV, 50, 70, 32, torch.float32)
    sinks = torch.randn(HQ)
    mask = torch.rand(B, 1, 50, 70) > 0.3
    ours = grads_of(lambda a, b, c, s: ipex_flash.scaled_dot_product_attention(
        a, b, c, attn_mask=mask, enable_gqa=True, is_causal=True, sinks=s), q, k, v, sinks)
    ref = grads_of(lambda a, b, c, s: sdpa_reference(a, b, c, mask, True, sinks=s),
                   q.double(), k.double(), v.double(), sinks.double())
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 40, 60), (B, HQ, 40, 60), (HQ, 1, 60)])
def test_learned_mask_gradient(shape):
    """A float mask that requires grad (a learned bias, as T5's) gets its gradient, summed over
    its broadcast dimensions."""
    q, k, v = random_qkv(B, HQ, HKV, 40, 60, 32, torch.float32)
    bias = torch.randn(shape)
    ours = grads_of(lambda a, b, c, m: ipex_flash.scaled_dot_product_attention(
        a, b, c, attn_mask=m, enable_gqa=True, is_causal=True), q, k, v, bias)
    ref = grads_of(lambda a, b, c, m: sdpa_reference(a, b, c, m, True), q.double(), k.double(),
                   v.double(), bias.double())
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert ours[3].shape == bias.shape


MEMORY_SCRIPT = r"""
import resource, sys
import ipex_flash, torch
n = 16384
q, k, v = (torch.randn(1, 1, n, 64, requires_grad=True) for _ in range(3))
mask = torch.ones(n, n, dtype=torch.bool).tril_().view(1, 1, n, n)  # 256 MB, read in place
grad = torch.randn(1, 1, n, 64)
kb = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# Kernels are built (or loaded from the disk cache) in this process on first use, which takes
# memory of its own: do that first, on a corner of the same problem.
w = [t[:, :, :100].detach().clone().requires_grad_() for t in (q, k, v)]
ipex_flash.scaled_dot_product_attention(*w, attn_mask=mask[..., :100, :100]).sum().backward()
before = kb()
out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask)
forward = kb()
out.backward(grad)
print(before, forward, kb())
"""


def test_mask_costs_no_memory_beyond_itself():
    """A (1, 1, N, N) bool mask at N = 16384 (256 MB) is read in place: the forward and the
    backward stay within 64 MB above the inputs, the mask and the outputs (peak resident set
    of a fresh process; out and lse are 4 MB, the gradients 12 MB)."""
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True,
                            text=True, check=True)
    before, forward, backward = (int(x) for x in result.stdout.split())
    outputs_kb = (4 + 12) * 1024 + 2 * 64
    assert forward - before <= 64 * 1024 + outputs_kb, (before, forward)
    assert backward - before <= 64 * 1024 + outputs_kb, (before, backward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_broadcast_mask_gradient_is_one_float32_sum(dtype):
    """A (1, 1) float mask is added to every score, which moves no probability: its exact
    gradient is 0, the sum of every dS. Ours must be within one float32 sum's error of the
    float64 reference (2^-24 of the sum of |dS|), however many terms (250k here) and whatever
    the dtype: dS is summed in float32 before the one rounding to the mask's dtype, and each
    row's dS from its own P and dP."""
    q = torch.randn(2, 3, 184, 59, dtype=dtype) * 0.5
    k = torch.randn(2, 3, 227, 59, dtype=dtype) * 0.5
    v = torch.randn(2, 3, 227, 59, dtype=dtype)
    mask = torch.zeros(1, 1, dtype=dtype, requires_grad=True)
    ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    full_mask = torch.zeros(2, 3, 184, 227, dtype=torch.float64, requires_grad=True)
    F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                   attn_mask=full_mask).sum().backward()
    reference = full_mask.grad.sum().item()
    bound = 2.0 ** -24 * full_mask.grad.abs().sum().item()
    assert abs(mask.grad.double().item() - reference) <= bound, (mask.grad.item(), bound)
