"""Head dims past 256: v's up to C.MAX_HEAD_DIM (512), q's and k's up to C.MAX_QK_HEAD_DIM (576,
DeepSeek's MLA: a 512-column latent and 64 rope columns). The forward against the float64
reference at sizes off the tiles' powers of two (320, 448), at 512, and with V's head dim apart
(512 / 256, 576 / 512); float32, bfloat16 and float16, causal and not, GQA; the vector kernel,
the matrix kernels emulated (the SLM-staged forms GPUs run past head dim 128), and the vector
kernel's K/V slabs, which GPUs with 64 KiB of local memory run (their profiles on the CPU
device); and the limits' errors."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.cases import tiered
from helpers.reference import assert_matches_reference

# (dtype, D, Dv). The default tier runs float32 at every size (the vector kernel, as on every
# GPU), and one 16-bit case of each kind; the long tier the rest.
DIMS = [(320, 320), (448, 448), (512, 512), (512, 256), (576, 512)]
CASES = [(dtype, d, d_v) for dtype in (torch.float32, torch.bfloat16, torch.float16)
         for d, d_v in DIMS]
DEFAULT = [*((torch.float32, d, d_v) for d, d_v in DIMS), (torch.bfloat16, 320, 320),
           (torch.bfloat16, 576, 512), (torch.float16, 448, 448)]


def qkv(batch, heads_q, heads_kv, len_q, len_k, d, d_v, dtype):
    return (torch.randn(batch, heads_q, len_q, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d_v, dtype=dtype))


def check_forward(dtype, d, d_v, causal, len_q=37, len_k=83):
    """GQA 2, and lengths that leave every query and key block partial."""
    q, k, v = qkv(1, 4, 2, len_q, len_k, d, d_v, dtype)
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (1, 4, len_q, d_v)
    assert_matches_reference(out, lse, *attention_reference(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,d,d_v", tiered(CASES, DEFAULT, multi=True))
def test_forward_matches_reference(dtype, d, d_v, causal):
    check_forward(dtype, d, d_v, causal)


@pytest.fixture
def profile(monkeypatch):
    """A GPU profile on the CPU device (C.set_device_profile): the CPU runs that GPU's
    variants; the CPU's own limits restored after."""
    def set_profile(name, mode="auto"):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        C.set_device_profile(name)
    yield set_profile
    C.set_device_profile("")


@pytest.mark.parametrize("name,d,d_v,rows", [
    ("mtl", 512, 512, 8), ("mtl", 576, 512, 8), ("dg2", 320, 320, 16),
    pytest.param("bmg", 576, 512, 16, marks=pytest.mark.full)])
def test_vector_slabs_on_gpu_profiles(profile, name, d, d_v, rows):
    """Whole K/V rows of the vector forward fit 64 KiB up to head dim 256 and 128 KiB up to
    512: past them it walks K and V through local memory in slabs (flash_fwd_slab_kernel), with
    8 query rows per block where Q and the accumulator of 16 would not fit. The CPU runs that
    variant here: its plan is checked to be the slab kernel, then its results."""
    profile(name)
    plan = C.plan("forward", name, "float32", d, 0, 1, "auto", d_v)
    variant = plan["variant"]
    assert variant.kv_cols > 0 and variant.block_n == 16 and variant.block_m == rows, variant
    assert "flash_fwd_slab_kernel" in plan["kernels"][0]
    assert plan["slm_bytes"] <= C.profile_limits(name)["local_mem_bytes"]
    # (the variant a call on the CPU device gets with the profile set)
    assert repr(C.device_plan("forward", "float32", d, 0, 1, d_v)["variant"]) == repr(variant)
    for causal in (False, True):
        check_forward(torch.float32, d, d_v, causal)


@pytest.mark.parametrize("mode,d,d_v", [
    ("emulate", 576, 512), ("emulate", 320, 320),
    pytest.param("emulate8", 448, 448, marks=pytest.mark.full)])
def test_matrix_kernels_emulated(monkeypatch, mode, d, d_v):
    """bfloat16 on the matrix kernels, whose joint_matrix calls are emulated on any device:
    past head dim 128 (256 with V's head dim apart) the SLM-staged forward, as GPUs with XMX run
    it at these sizes (AMX's 16-wide shape; emulate8 DG2 and Arrow Lake-H's 8-wide one)."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    plan = C.plan("forward", "", "bfloat16", d, 0, 1, mode, d_v)
    assert plan["variant"].matrix_m > 0 and not plan["variant"].matrix_registers
    assert plan["header"] == "programs/flash_fwd_matrix.hpp"
    for causal in (False, True):
        check_forward(torch.bfloat16, d, d_v, causal)


def test_every_profile_plans_the_new_head_dims():
    """Forward and decode at 320, 448, 512 and MLA's 576 / 512 plan on every GPU within its
    local memory, every dtype: tiles shrink, the vector forward walks K/V in slabs, and a
    decode the decode kernel cannot hold (past 480 in 64 KiB) goes to the general forward."""
    for name in C.profile_names():
        limit = C.profile_limits(name)["local_mem_bytes"]
        for dtype in ("float32", "float16", "bfloat16"):
            for d, d_v in [(320, 0), (448, 0), (512, 0), (512, 256), (576, 512)]:
                plan = C.plan("forward", name, dtype, d, 0, 1, "auto", d_v)
                assert 0 < plan["slm_bytes"] <= limit, (name, dtype, d, d_v, plan)
                widest = max(d, d_v)
                for rows in (1, 16):
                    fits, reasons = C.decode_fits(dtype, widest, rows, 0, name)
                    if not fits:
                        assert limit < 128 * 1024 and widest > 480, (name, dtype, d, rows)
                        assert "general forward kernel" in reasons[0]
                        continue
                    plan = C.plan("decode", name, dtype, widest,
                                  C.FEATURE_VALUE_DIM if d_v else 0, rows, "auto")
                    assert 0 < plan["slm_bytes"] <= limit, (name, dtype, d, rows, plan)


def test_head_dim_limits_are_named():
    """q's and k's head dim up to 576, v's up to 512: past them an error naming the argument
    and its limit; the largest sizes themselves run (above)."""
    assert (C.MAX_HEAD_DIM, C.MAX_QK_HEAD_DIM) == (512, 576)
    q, k, v = qkv(1, 2, 2, 3, 5, 577, 64, torch.float32)
    with pytest.raises(ValueError, match=r"head_dim \(q\.shape\[3\]\) must be in \[1, 576\], "
                                         r"got 577"):
        ipex_flash.attention(q, k, v)
    q, k, v = qkv(1, 2, 2, 3, 5, 576, 576, torch.float32)
    with pytest.raises(ValueError, match=r"v's head_dim \(v\.shape\[3\]\) must be in \[1, 512\], "
                                         r"got 576"):
        ipex_flash.attention(q, k, v)
    with pytest.raises(ValueError, match=r"must be in \[1, 512\], got 576"):
        ipex_flash.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)))
    # SDPA's override hands such calls back to torch (its own limits), not to the kernels.
    with pytest.raises(ValueError, match=r"must be in \[1, 512\], got 576"):
        ipex_flash.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match=r"v's head dim must be in \[1, 512\], got 576"):
        C.plan("forward", "bmg", "float32", 64, 0, 1, "auto", 576)
    with pytest.raises(ValueError, match=r"head dim must be in \[1, 576\].*got 608"):
        C.plan("backward", "bmg", "float32", 608)
