"""Dropout: the kernels apply exactly the mask that dropout_mask reports, forward and
backward; the kept fraction is 1 - p; seeds make it reproducible."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash.reference import attention_reference

from helpers.cases import DTYPES, random_qkv
from helpers.dropout import check_reported_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_and_backward_apply_the_reported_mask(dtype, causal):
    check_reported_mask(dtype, causal)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction(p):
    seed = launch.draw_dropout_seed(torch.device("cpu"))
    keep = torch.ops.ipex_flash.dropout_mask(seed, [2, 3, 100, 130], p)
    n = keep.numel()
    kept = keep.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(kept - (1 - p)) < 5 * sigma, (kept, 1 - p, sigma)
    # Not a striped pattern: neighbouring keys and rows are independent.
    both = (keep[..., 1:] & keep[..., :-1]).double().mean().item()
    assert abs(both - (1 - p) ** 2) < 0.02


def test_same_seed_same_output_different_seed_different_output():
    q, k, v = random_qkv(1, 2, 2, 50, 50, 32, torch.float32)
    torch.manual_seed(1234)
    first = ipex_flash.attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(1234)
    again = ipex_flash.attention(q, k, v, dropout_p=0.2)
    different = ipex_flash.attention(q, k, v, dropout_p=0.2)
    assert torch.equal(first, again)
    assert not torch.equal(first, different)
    no_dropout = ipex_flash.attention(q, k, v)
    assert torch.equal(no_dropout, ipex_flash.attention(q, k, v, dropout_p=0.0))
    assert not torch.equal(first, no_dropout)


def test_expected_output_is_unbiased():
    """Averaged over many seeds, dropout's output tends to the output without it."""
    q, k, v = random_qkv(1, 1, 1, 8, 16, 16, torch.float32)
    mean = sum(torch.ops.ipex_flash.attention(q, k, v, dropout_p=0.5) for _ in range(2000)) / 2000
    want, _ = attention_reference(q, k, v)
    assert (mean.double() - want).abs().max().item() < 0.1


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_dropout_p(p):
    q, k, v = random_qkv(1, 1, 1, 4, 4, 16, torch.float32)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        ipex_flash.attention(q, k, v, dropout_p=p)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        torch.ops.ipex_flash.attention(q, k, v, dropout_p=p)


def test_missing_seed():
    q, k, v = random_qkv(1, 1, 1, 4, 4, 16, torch.float32)
    with pytest.raises(ValueError, match=r"dropout_p > 0 needs dropout_seed"):
        torch.ops.ipex_flash.attention_forward(q, k, v, False, None, 0.5, None)
