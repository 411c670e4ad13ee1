"""The register forward rescales O^T lazily (FlashAttention-4's threshold;
OnlineSoftmaxRow::raise_max_past, forward/registers_kernel.hpp): a block whose max passes the
row's by at most 2^8 leaves the row's max and O^T as they are, its probabilities up to 256
against the stale max; a larger rise rescales. Checked emulated in both widths (emulate:
BMG's, PVC's and Lunar Lake's 64-key blocks; emulate8: DG2's and Arrow Lake-H's 16-key
blocks) against float64, on keys whose scores climb block by block by set amounts, some below
the threshold and some above, others falling back."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.cases import tiered
from helpers.reference import assert_matches_reference

GROUP = 16  # keys per step of the climb: one 8-wide block, a quarter of a 64-key block
# A step's largest score over the row's noise, in log2 units (the kernels' exp2 domain): 3 and
# 5 above the last (under the threshold of 8: the max stays), 12 (rescaled), back down, then
# 20 and 30 above the highest so far (rescaled twice).
CLIMB = [0.0, 3.0, 8.0, 20.0, 14.0, 2.0, 24.0, 40.0, 70.0, 65.0, 30.0, 71.0]


def _climbing_qkv(dtype, head_dim, len_q, heads_q=4, heads_kv=2):
    """q, k, v (B, H, N, D): q's first column 1, k's first column sets each key group's peak
    (one key a group scores CLIMB[g] over the others), the rest small noise."""
    scale = 1.0 / math.sqrt(head_dim)
    len_k = GROUP * len(CLIMB) + 5  # and a partial last block
    q = 0.1 * torch.randn(2, heads_q, len_q, head_dim)
    q[..., 0] = 1.0
    k = 0.1 * torch.randn(2, heads_kv, len_k, head_dim)
    v = torch.randn(2, heads_kv, len_k, head_dim)
    for g, peak in enumerate(CLIMB):
        # A score of peak log2 units is peak / log2(e) / scale on q's first column.
        k[:, :, g * GROUP + (g * 5) % GROUP, 0] = peak / math.log2(math.e) / scale
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("dtype", tiered([torch.bfloat16, torch.float16], [torch.float16]))
@pytest.mark.parametrize("head_dim", tiered([64, 128], [64]))
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_lazy_rescale_matches_float64(monkeypatch, mode, head_dim, dtype):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    name = str(dtype).removeprefix("torch.")
    assert C.plan("forward", "", name, head_dim, 0, 1, mode)["variant"].matrix_registers
    torch.manual_seed(3)
    q, k, v = _climbing_qkv(dtype, head_dim, len_q=70)
    for causal in (False, True):
        out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
        ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
        assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
