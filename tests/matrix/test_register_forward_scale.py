"""The register forward up to d = 64 without score changes folds the softmax scale into the
exponent's multiply-add (forward/registers_kernel.hpp): the max over the raw dot products, a
negative scale made positive by loading Q negated, a zero one made the smallest normal float.
Any scale SDPA takes gives the float64 result, with a bool mask and sinks (which keep the fold)
and without; 16 and 8 wide, emulated."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import sdpa_reference

from helpers.cases import random_qkv
from helpers.reference import assert_matches_reference

MODES = ["emulate", "emulate8"]


@pytest.mark.parametrize("scale", [0.125, -0.3, 0.0, 2.5])
@pytest.mark.parametrize("mode", MODES)
def test_any_scale(monkeypatch, mode, scale):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    assert C.plan("forward", "", "float16", 64, 0, 1, mode)["variant"].matrix_registers
    dtype = torch.float16
    torch.manual_seed(1)
    q, k, v = random_qkv(2, 4, 2, 37, 91, 64, dtype)
    for causal in (False, True):
        out = ipex_flash.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                      enable_gqa=True)
        ref = sdpa_reference(q.double(), k.double(), v.double(), is_causal=causal, scale=scale)
        assert_matches_reference(out, None, ref, None, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_negative_scale_with_a_bool_mask_and_sinks(monkeypatch, mode):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    dtype = torch.bfloat16
    torch.manual_seed(2)
    q, k, v = random_qkv(2, 4, 2, 45, 70, 48, dtype)
    mask = torch.rand(2, 1, 45, 70) > 0.3
    mask[..., 0] = True
    sinks = torch.randn(4)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=-0.2,
                                                  enable_gqa=True, sinks=sinks)
    ref = sdpa_reference(q.double(), k.double(), v.double(), attn_mask=mask, scale=-0.2,
                         sinks=sinks.double())
    assert_matches_reference(out, None, ref, None, dtype)
