"""A bool attn_mask packed into bits for the register kernels (score/mask_bits_kernel.hpp): the
plan packs it exactly where a register kernel reads it, forward and backward, and the output
(against float64) and the gradients (the backward suite's rule) hold in every layout the pack
reads through the mask's strides: a mask per head, one shared by every batch entry and head, a
transposed view, lengths off the 32-key words, a key block hidden whole (the backward's skip
votes read the bits too), with softcap beside it. Emulated, 16 and 8 wide."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import sdpa_reference

from helpers.cases import random_qkv
from helpers.reference import assert_matches_reference
from helpers.sdpa import B, HKV, HQ, assert_grads_close, grads_of, mask_of

PACK = "ipex_flash::flash_mask_bits_kernel"
MODES = ["emulate", "emulate8"]
LEN_Q, LEN_K = 75, 101


@pytest.mark.parametrize("mode", MODES)
def test_plan_packs_the_bool_mask_for_register_kernels(mode):
    # bool mask, float mask, none, softcap + ALiBi + bool mask (on the 8-wide engines dK/dV is
    # SLM-staged there, reading the mask in place, and the register dQ the bits)
    for features, packs in ((4, True), (8, False), (0, False), (1 | 2 | 4, True)):
        plan = C.plan("backward", "", "bfloat16", 64, features, 1, mode)
        assert plan["variant"].matrix_registers, plan
        assert (PACK in plan["kernels"]) == packs, (features, plan)
    plan = C.plan("backward", "", "bfloat16", 256, 4, 1, mode)  # past the register kernels
    assert not plan["variant"].matrix_registers and not plan["variant"].dkdv_registers, plan
    assert PACK not in plan["kernels"], plan


def layout_mask(layout):
    """A random bool mask broadcastable to (B, HQ, LEN_Q, LEN_K) in `layout`, key 0 always
    visible (no row hidden whole), and batch entry 0's keys from 64 on hidden (a whole key
    block of 64 for dK/dV, and half of each query row's keys)."""
    shape = {"per_head": (B, HQ, LEN_Q, LEN_K), "shared": (LEN_Q, LEN_K),
             "transposed": (B, 1, LEN_K, LEN_Q)}[layout]
    mask = mask_of("bool", shape, torch.bool)
    if layout == "transposed":
        mask = mask.transpose(-1, -2)
        assert mask.stride(-1) != 1
    mask[..., 0] = True
    if mask.dim() == 4:
        mask[0, ..., 64:] = False
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["per_head", "shared", "transposed"])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_through_the_bits(monkeypatch, mode, layout, causal):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    assert PACK in C.plan("backward", "", "bfloat16", 64, 4, 1, mode)["kernels"]
    dtype = torch.bfloat16
    q, k, v = random_qkv(B, HQ, HKV, LEN_Q, LEN_K, 64, dtype)
    mask = layout_mask(layout)
    got = grads_of(lambda a, b, c: ipex_flash.scaled_dot_product_attention(
        a, b, c, attn_mask=mask, is_causal=causal, enable_gqa=True), q, k, v)
    truth = grads_of(lambda a, b, c: sdpa_reference(a, b, c, mask, causal),
                     q.double(), k.double(), v.double())
    plain = grads_of(lambda a, b, c: sdpa_reference(a, b, c, mask, causal, compute_dtype=dtype),
                     q, k, v)
    assert_grads_close(got, truth, plain, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_forward_plan_packs_the_bool_mask_for_its_register_kernel(mode):
    for features, packs in ((4, True), (8, False), (0, False), (1 | 2 | 4, True), (2 | 4, True)):
        plan = C.plan("forward", "", "bfloat16", 64, features, 1, mode)
        registers = plan["variant"].matrix_registers
        assert (PACK in plan["kernels"]) == (packs and registers), (features, plan)
    assert PACK in C.plan("forward", "", "bfloat16", 64, 4, 1, mode)["kernels"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["per_head", "shared", "transposed"])
@pytest.mark.parametrize("mode", MODES)
def test_forward_through_the_bits(monkeypatch, mode, layout, causal):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    dtype = torch.float16
    q, k, v = random_qkv(B, HQ, HKV, LEN_Q, LEN_K, 64, dtype)
    mask = layout_mask(layout)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
    ref = sdpa_reference(q.double(), k.double(), v.double(), mask, causal)
    assert_matches_reference(out, None, ref, None, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_forward_bits_beside_softcap(monkeypatch, mode):
    """Softcap's fused tanh and the mask's bits in one register kernel, GQA, both masks."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    dtype = torch.bfloat16
    q, k, v = random_qkv(B, HQ, HKV, LEN_Q, LEN_K, 64, dtype)
    mask = layout_mask("per_head")
    for causal in (False, True):
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                      enable_gqa=True, softcap=5.0)
        ref = sdpa_reference(q.double(), k.double(), v.double(), mask, causal, softcap=5.0)
        assert_matches_reference(out, None, ref, None, dtype)
