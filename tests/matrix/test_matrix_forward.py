"""The matrix-engine forward kernel (flash_fwd_matrix.hpp: joint_matrix, AMX on this project's
Xeons, XMX on Intel GPUs): its tile shapes forced one by one through IPEX_FLASH_MATRIX, and the
same kernel with joint_matrix emulated (IPEX_FLASH_MATRIX=emulate), which runs on any machine,
against the float64 reference and against the vector kernel; flash-attn's options, dropout, and
the scratch its K/V pack needs."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.cases import random_qkv, tiered
from helpers.matrix import (  # noqa: F401 (matrix_mode: a fixture)
    EMULATED, ONE_RUN_MODE, RUN_MODES, matrix_mode)
from helpers.reference import assert_matches_reference


# Default tier: the common and a padded head dim above 128 (80, 16-deep steps, runs in
# test_emulated_matches_reference); the long tier all.
@pytest.mark.parametrize("len_q,len_k", [(1, 1), (17, 300), (127, 127), (300, 113)])
@pytest.mark.parametrize("head_dim", tiered([16, 40, 64, 80, 128, 200], [128, 200]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", RUN_MODES)
def test_matches_reference(matrix_mode, mode, causal, head_dim, len_q, len_k):
    matrix_mode(mode)
    q, k, v = random_qkv(2, 4, 2, len_q, len_k, head_dim, torch.bfloat16)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)


# Emulated, float16 too (AMX takes only bfloat16 here): sizes that are no multiple of the 64-row
# blocks, GQA 3, head dims 80 (16-deep steps) and 64, 128 (32-deep; long tier: the default
# runs 128 in test_matches_reference).
@pytest.mark.parametrize("len_q,len_k", [(77, 130), (130, 77)])
@pytest.mark.parametrize("head_dim", tiered([64, 80, 128], [80]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", EMULATED)
def test_emulated_matches_reference(matrix_mode, mode, dtype, causal, head_dim, len_q, len_k):
    matrix_mode(mode)
    q, k, v = random_qkv(2, 6, 2, len_q, len_k, head_dim, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("mode", RUN_MODES)
def test_selected_and_distinct_from_vector_kernel(matrix_mode, mode):
    """The forced mode really builds the matrix variant, and its output differs from the
    vector kernel's (it rounds P to bfloat16 before P.V) while both match the reference."""
    matrix_mode(mode)
    variant = C.warmup_fwd("bfloat16", 64, 0)
    height = {"emulate": 16, "emulate8": 8}.get(mode) or int(mode)
    # DG2's shape takes only 16-deep steps.
    assert (variant.matrix_m, variant.matrix_k) == (height, 16 if mode == "emulate8" else 32)
    assert variant.matrix_emulated == (mode in EMULATED)
    assert C.warmup_fwd("bfloat16", 80, 0).matrix_k == 16  # 80 is not a multiple of 32
    q, k, v = random_qkv(1, 2, 2, 200, 200, 64, torch.bfloat16)
    out_matrix = ipex_flash.attention(q, k, v)
    matrix_mode("0")
    assert C.warmup_fwd("bfloat16", 64, 0).matrix_m == 0
    out_vector = ipex_flash.attention(q, k, v)
    assert not torch.equal(out_matrix, out_vector)
    ref_out, _ = attention_reference(q, k, v)
    for out in (out_matrix, out_vector):
        assert_matches_reference(out, None, ref_out, None, torch.bfloat16)


@pytest.mark.parametrize("mode", RUN_MODES)
def test_options_through_flash_attn_api(matrix_mode, mode):
    """Windows, softcap, ALiBi and bottom-right causal masks take the same kernel."""
    from ipex_flash.reference import flash_attn_reference
    matrix_mode(mode)
    q, k, v = (t.transpose(1, 2) for t in random_qkv(2, 4, 2, 90, 150, 64, torch.bfloat16))
    slopes = torch.rand(4)
    kwargs = dict(causal=True, window_size=(40, 0), softcap=30.0, alibi_slopes=slopes)
    out = ipex_flash.flash_attn_func(q, k, v, **kwargs)
    ref = flash_attn_reference(q, k, v, **kwargs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ONE_RUN_MODE + ["emulate8"])  # emulate8: the 8-wide registers
def test_dropout_applies_the_reported_mask(matrix_mode, mode, causal):
    from ipex_flash.ops import launch
    from helpers.dropout import reference_with_mask
    matrix_mode(mode)
    p = 0.3
    q, k, v = random_qkv(2, 4, 2, 45, 70, 64, torch.bfloat16)
    seed = launch.draw_dropout_seed(q.device)
    keep = torch.ops.ipex_flash.dropout_mask(seed, [2, 4, 45, 70], p)
    out, _ = torch.ops.ipex_flash.attention_forward(q, k, v, causal, None, p, seed)
    ref = reference_with_mask(q.double(), k.double(), v.double(), keep, p, causal)
    assert_matches_reference(out, None, ref, None, torch.bfloat16)


@pytest.mark.parametrize("mode", ONE_RUN_MODE)
def test_forward_scratch_is_checked(matrix_mode, mode):
    """The matrix kernel reads K and V from a packed copy in the scratch Python allocates
    (launch.flash_fwd): its size follows from the problem, and a short one is refused before
    anything runs."""
    from ipex_flash.ops import launch
    from ipex_flash.ops.attention_forward import sdpa_options
    matrix_mode(mode)
    q, k, v = random_qkv(2, 4, 2, 30, 100, 40, torch.bfloat16)
    options = sdpa_options(q, False, None, 0.0, None)
    views = [launch.view(t) for t in (q, k, v)]
    # 2 sequences x 2 K/V heads x 2 blocks of 64 keys x (K + V^T) x 64 x 48 (head dim padded to
    # 48) x 2 bytes.
    assert C.fwd_scratch_bytes(*views, options, 0) == 2 * 2 * 2 * 2 * 64 * 48 * 2
    out, lse = torch.zeros_like(q), torch.zeros(2, 4, 30)
    short = torch.empty(2 * 2 * 2 * 2 * 64 * 48 * 2 - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="scratch must be a uint8 tensor of at least"):
        C.flash_fwd(*views, launch.view(out), launch.view(lse), launch.view(short), options, 0)
    assert not out.any()
    matrix_mode("0")
    assert C.fwd_scratch_bytes(*views, options, 0) == 0
