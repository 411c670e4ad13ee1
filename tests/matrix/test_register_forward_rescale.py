"""The register forward rescales O^T lazily (FlashAttention-4's threshold;
OnlineSoftmaxRow::raise_max_past, forward/registers_kernel.hpp): a lean block whose max passes
the row's by at most 8 (log2 units) leaves the row's max and O^T as they are, its
probabilities up to 256 against the stale max; a larger rise rescales. Checked emulated in
both widths (emulate: BMG's, PVC's and Lunar Lake's 64-key blocks; emulate8: DG2's and Arrow
Lake-H's 16-key blocks) against float64, on keys whose scores climb block by block by set
amounts, some rises under the threshold and some over, others falling back; and under
dropout, whose blocks (all general) raise the max at any rise: 1 / (1 - p) beside a P of 256
would pass float16's range."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference, flash_attn_reference

from helpers.cases import tiered
from helpers.reference import assert_matches_reference

BLOCK_KEYS = {"emulate": 64, "emulate8": 16}  # the register forward's key block per width
# Each block's largest score over the row's noise, in log2 units (the kernels' exp2 domain),
# against the max the row keeps: 3 and 7.5 over 0 (kept: probabilities up to 2^7.5), 20
# (raised), 25 and 27.5 (kept), 14 (below), 40 and 70 (raised), 65 and 30 (below), 71 (kept).
# Half a unit or more from the threshold, past bfloat16's rounding of the keys (0.26 at most).
CLIMB = [0.0, 3.0, 7.5, 20.0, 25.0, 27.5, 14.0, 40.0, 70.0, 65.0, 30.0, 71.0]


def _peak_key(peak, head_dim):
    """k's first column that scores `peak` log2 units against q's first column of 1."""
    return peak / math.log2(math.e) * math.sqrt(head_dim)


def _climbing_qkv(dtype, head_dim, block, len_q=70, heads_q=4, heads_kv=2):
    """q, k, v (B, N, H, D): q's first column 1, k's first column sets each key block's peak
    (one key a block scores CLIMB[b] over the others), the rest small noise."""
    len_k = block * len(CLIMB) + 5  # and a partial last block
    q = 0.1 * torch.randn(2, len_q, heads_q, head_dim)
    q[..., 0] = 1.0
    k = 0.1 * torch.randn(2, len_k, heads_kv, head_dim)
    v = torch.randn(2, len_k, heads_kv, head_dim)
    for b, peak in enumerate(CLIMB):
        k[:, b * block + (b * 5) % block, :, 0] = _peak_key(peak, head_dim)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _plan(mode, dtype, head_dim):
    name = str(dtype).removeprefix("torch.")
    assert C.plan("forward", "", name, head_dim, 0, 1, mode)["variant"].matrix_registers


@pytest.mark.parametrize("dtype", tiered([torch.bfloat16, torch.float16], [torch.float16]))
@pytest.mark.parametrize("head_dim", tiered([64, 128], [64]))
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_lazy_rescale_matches_float64(monkeypatch, mode, head_dim, dtype):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    _plan(mode, dtype, head_dim)
    torch.manual_seed(3)
    q, k, v = _climbing_qkv(dtype, head_dim, BLOCK_KEYS[mode])
    for causal in (False, True):
        out, lse = ipex_flash.attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=causal,
                                        return_lse=True)
        ref_out, ref_lse = attention_reference(*(t.transpose(1, 2) for t in (q, k, v)),
                                               causal=causal)
        assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_float16_under_heavy_dropout(monkeypatch, mode):
    """p = 0.999 scales a kept probability by 1000: every key of the second block scores 7.5
    over the first's, so against a max kept from the first block its probabilities would be
    2^7.5 and, kept, 181,000, past float16's largest value. Under dropout every block is a
    general one, which raises the max at any rise."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    dtype, p, block = torch.float16, 0.999, BLOCK_KEYS[mode]
    _plan(mode, dtype, 64)
    torch.manual_seed(4)
    q, k, v = _climbing_qkv(dtype, 64, block, len_q=128)
    k = k[:, :2 * block + 5].clone()
    k[:, block:2 * block, :, 0] = _peak_key(7.5, 64)
    v = v[:, :2 * block + 5]
    out, _, probs = ipex_flash.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    keep = probs >= 0
    assert keep[..., block:2 * block].any() and not keep.all()
    ref_out, _ = flash_attn_reference(q, k, v, keep=keep, dropout_p=p)
    assert torch.isfinite(out).all()
    assert_matches_reference(out, None, ref_out, None, dtype)
