"""The register forward's lean loop takes score changes in forms of their own
(forward/register_scores.hpp), checked here emulated in both widths (emulate: BMG's, PVC's
and Lunar Lake's form, whose Q^T is grouped by sub-group past d = 64; emulate8: DG2's and
Arrow Lake-H's) against float64:
- ALiBi, on key blocks left of every row's diagonal: slope * (the key's offset in the block)
  added to a score, and the row's softmax shifted by -slope * (its distance to the block's
  first key) (ScoreMod::apply_left_of_diagonal), where the other blocks take the distance per
  element. Causal calls with many fully visible blocks and rows far from their keys (the shift
  large beside the scores), non-causal ones whose blocks right of the diagonal keep the
  per-element form, a left window, softcap beside ALiBi, and a bool mask beside both, read as
  bits in the same loop.
- Softcap alone: the lean blocks carry softcap's complements r = 1 / (1 + exp2(x)), their max
  score from the least r, the score's multiply-add folded into the exponent's."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch
from ipex_flash.ops.flash_attn_args import flash_options
from ipex_flash.reference import flash_attn_reference

from helpers.cases import random_qkv, tiered
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)
from helpers.reference import assert_matches_reference

HEADS, HEADS_KV = 8, 2
# ALiBi's own slopes for 8 heads, 2^-1 .. 2^-8: the steepest hides far keys whole, the
# shallowest leaves them a share of the softmax.
SLOPES = torch.tensor([2.0 ** -(i + 1) for i in range(HEADS)])


def _qkv(len_q, len_k, head_dim, dtype):
    return [t.transpose(1, 2)  # flash-attn's (B, N, H, D)
            for t in random_qkv(2, HEADS, HEADS_KV, len_q, len_k, head_dim, dtype)]


def _check(q, k, v, dtype, **options):
    options.setdefault("alibi_slopes", SLOPES)
    out, lse, _ = ipex_flash.flash_attn_func(q, k, v, return_attn_probs=True, **options)
    ref_out, ref_lse = flash_attn_reference(q, k, v, **options)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("dtype", tiered([torch.bfloat16, torch.float16], [torch.bfloat16]))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_alibi_left_and_right_of_the_diagonal(matrix_mode, mode, head_dim, dtype):
    """Bottom-right causal, 130 rows over 530 keys: the first row block's lean loop runs six
    64-key blocks (the 8-wide form's 16-key blocks: 25), its rows 400-530 keys from the first;
    then the same keys without a mask, where the blocks past each row block's diagonal run
    the per-element form; and a left window of 200 keys."""
    matrix_mode(mode)
    name = str(dtype).removeprefix("torch.")
    assert C.plan("forward", "", name, head_dim, 2, 1, mode)["variant"].matrix_registers
    q, k, v = _qkv(130, 530, head_dim, dtype)
    for options in (dict(causal=True), dict(causal=False), dict(window_size=(200, 0))):
        _check(q, k, v, dtype, **options)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mode", ["emulate", "emulate8"])
def test_softcap_alone_as_complements(matrix_mode, mode, head_dim):
    """A strong cap (2.5: scores near it for most keys) and a loose one (30), causal over
    fully visible blocks and without a mask; the LSE too (the max made from the least r)."""
    matrix_mode(mode)
    assert C.plan("forward", "", "bfloat16", head_dim, 1, 1, mode)["variant"].matrix_registers
    q, k, v = _qkv(130, 530, head_dim, torch.bfloat16)
    for softcap, causal in ((2.5, True), (30.0, False)):
        _check(q, k, v, torch.bfloat16, causal=causal, softcap=softcap, alibi_slopes=None)


# Both widths: the 8-wide form in two shares of O^T at d = 64, four at 128.
@pytest.mark.parametrize("mode, head_dim", [("emulate", 64), ("emulate8", 64),
                                            *tiered([("emulate8", 128)], [], multi=True)])
def test_softcap_beside_alibi(matrix_mode, mode, head_dim):
    """Softcap's fused tanh takes ALiBi's per-key term as its multiply-add's addend."""
    matrix_mode(mode)
    assert C.plan("forward", "", "bfloat16", head_dim, 3, 1, mode)["variant"].matrix_registers
    q, k, v = _qkv(100, 333, head_dim, torch.bfloat16)
    for causal in (True, False):
        _check(q, k, v, torch.bfloat16, causal=causal, softcap=5.0)


def _reference_with_mask(q, k, v, keep, softcap):
    """float64, written from the definitions: scores q.k / sqrt(d), softcap * tanh(s /
    softcap), less slope * |i + Nk - Nq - j|, hidden where keep is False or j is right of
    row i's diagonal (bottom-right causal); softmax over the keys; heads of q share K/V."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    k, v = (t.repeat_interleave(HEADS // HEADS_KV, dim=1) for t in (k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = softcap * torch.tanh(s / softcap)
    distance = (torch.arange(n_q)[:, None] + n_k - n_q - torch.arange(n_k)[None, :]).double()
    s = s - SLOPES.double()[:, None, None] * distance.abs()
    s = s.masked_fill(~keep | (distance < 0), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("mode, head_dim", [("emulate", 64), ("emulate8", 64),
                                            *tiered([("emulate8", 128)], [], multi=True)])
def test_bool_mask_beside_softcap_and_alibi(matrix_mode, mode, head_dim):
    """Every score change in one register kernel (the features gpu-check holds to a ratio of
    the plain loop): the mask's bits, softcap and ALiBi on the lean blocks, causal."""
    matrix_mode(mode)
    assert C.plan("forward", "", "bfloat16", head_dim, 7, 1, mode)["variant"].matrix_registers
    dtype = torch.bfloat16
    q, k, v = _qkv(90, 300, head_dim, dtype)
    keep = torch.rand(2, HEADS, 90, 300) > 0.3
    keep[..., 0] = True  # every row sees a key
    options = flash_options(None, None, 0, 0, q.shape[-1] ** -0.5, True, -1, 0, 5.0, SLOPES,
                            0.0, None, None, None)
    options.attn_mask = launch.view(keep)
    bhnd = [t.transpose(1, 2) for t in (q, k, v)]
    out = torch.empty_like(bhnd[0])
    lse = torch.empty(2, HEADS, 90)
    launch.run_forward(*bhnd, out, lse, options)
    ref = _reference_with_mask(q, k, v, keep, 5.0)
    assert_matches_reference(out.transpose(1, 2), None, ref, None, dtype)
