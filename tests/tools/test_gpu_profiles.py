"""What each Intel GPU would run, run here: with a GPU profile set on the SYCL CPU device
(C.set_device_profile), variant selection uses that GPU's limits (local memory, work-group
size, matrix shapes, loop forms), so the CPU executes the same template instances, tiles and
block sizes the GPU would build, against the float64 reference. The XMX instructions
themselves run on AMX where this CPU has it (IPEX_FLASH_MATRIX=1 picks the GPU's 8-row
tiles)."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.tools.gpu_grid import ALL_HEAD_DIMS
from ipex_flash.reference import attention_reference

from helpers.caches import make_cache
from helpers.cases import random_qkv, tiered
from helpers.reference import assert_matches_reference, check_against_reference

PROFILES = C.profile_names()
# GPUs with XMX, all served by the matrix kernels: with N = 16 and sub-group 16 (PVC, BMG,
# Lunar Lake), or in their 8-wide form, N = 8 with sub-group 8 (DG2, Arrow Lake-H, whose XMX
# takes nothing else). Meteor Lake has no XMX.
XMX_SHAPED = {"pvc", "bmg", "lnl", "dg2", "arl-h"}
XMX_WIDTH = {"pvc": 16, "bmg": 16, "lnl": 16, "dg2": 8, "arl-h": 8}


@pytest.fixture
def profile(request, monkeypatch):
    """Sets the GPU profile for the test (and the matrix mode), restoring the CPU's own."""
    def set_profile(name, mode="auto"):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        C.set_device_profile(name)
    yield set_profile
    C.set_device_profile("")


# The gaps (docs/gpus.md): the vector backward's dK/dV kernel keeps K, V, dK, dV and a Q and
# dO tile of 16 rows in float32 local memory, 74 KB at head dim 192, so head dims above 160
# have no vector backward on GPUs with 64 KiB per work-group, and above 320 with 128 KiB. The
# matrix backward (16-bit inputs on XMX) fits with smaller key blocks up to 480 in 64 KiB and
# every head dim in 128 KiB. The error names the GPU and that limit.
def backward_limit(name, dtype="float32"):
    small = C.profile_limits(name)["local_mem_bytes"] < 128 * 1024
    matrix = name in XMX_SHAPED and dtype != "float32"
    return (480 if small else 576) if matrix else (160 if small else 320)


def no_variant_expected(name, family, head_dim, dtype="float32"):
    return family == "backward" and head_dim > backward_limit(name, dtype)


@pytest.mark.parametrize("name", PROFILES)
def test_every_call_has_a_variant_that_fits(name):
    """Every head dim, dtype, feature set and decode row count plans on every GPU, within its
    local memory (Arc A-series' 64 KiB made decode throw at head dims 32 and 64), except the
    backward gaps above, which are refused with an error naming the limit; decodes the decode
    kernel cannot hold (past head dim 480 in 64 KiB) go to the general forward, planned above."""
    limit = C.profile_limits(name)["local_mem_bytes"]
    for dtype in ["float32", "float16", "bfloat16"]:
        for head_dim in [1, 8, 59, *ALL_HEAD_DIMS]:
            for mode in ["auto", "1"]:
                for family, rows in [("forward", 1), ("backward", 1), *(
                        ("decode", r) for r in (1, 2, 3, 4, 8, 16))]:
                    if no_variant_expected(name, family, head_dim, dtype):
                        message = (f"no backward kernel for head dim {head_dim} on {name} .*"
                                   f"{limit // 1024} KiB .* fits head dims up to "
                                   f"{backward_limit(name, dtype)}")
                        with pytest.raises(RuntimeError, match=message):
                            C.plan(family, name, dtype, head_dim, 3, rows, mode)
                        continue
                    if family == "decode" and not C.decode_fits(dtype, head_dim, rows, 3,
                                                                name)[0]:
                        assert limit < 128 * 1024 and head_dim > 480, (dtype, head_dim, rows)
                        continue
                    plan = C.plan(family, name, dtype, head_dim, 3, rows, mode)
                    assert 0 < plan["slm_bytes"] <= limit, (family, dtype, head_dim, rows, plan)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matrix_shape_per_gpu(name, dtype):
    """XMX, by default and under IPEX_FLASH_MATRIX=1, takes 8-row tiles with 16-deep steps,
    16 or 8 columns wide as the GPU's engine takes them (forward, backward; the decode
    kernel's scores only 16 wide, its sub-group), and the vector kernels elsewhere;
    IPEX_FLASH_MATRIX=0 opts out; naming a tile height the GPU does not take is an error
    that says so."""
    width = XMX_WIDTH.get(name, 0)
    for mode in ["auto", "1"]:
        for family, rows in [("forward", 1), ("backward", 1), ("decode", 4)]:
            variant = C.plan(family, name, dtype, 128, 0, rows, mode)["variant"]
            on = width == 16 or (width == 8 and family != "decode")
            expected = (8, 16, width) if on else (0, 0, 16)
            got = (variant.matrix_m, variant.matrix_k, variant.matrix_n)
            assert got == expected, (family, mode)
    for family, rows in [("forward", 1), ("backward", 1), ("decode", 4)]:
        assert C.plan(family, name, dtype, 128, 0, rows, "0")["variant"].matrix_m == 0
    with pytest.raises(RuntimeError, match="no matrix engine for " + dtype):
        C.plan("forward", name, dtype, 128, 0, 1, "16")


def _check_forward_backward(dtype, head_dim, causal):
    q, k, v = random_qkv(2, 4, 2, 77, 100, head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
    grad = torch.randn_like(out)
    out.backward(grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal,
                                                           enable_gqa=True)
    ref.backward(grad.double())
    # The gradient tolerance of test_backward.py for float32 (exact accumulation); 16-bit
    # gradients are checked there against torch's own error, here on float32 only.
    if dtype == torch.float32:
        for ours, theirs in [(q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)]:
            torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype,mode", [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                        (torch.bfloat16, "1")])
# Default tier: head dim 128, where the GPUs' local memory shapes the tiles most; the long
# tier 64 and a padded one (80) too.
@pytest.mark.parametrize("head_dim", tiered([64, 80, 128], [128]))
def test_gpu_variants_run_here(profile, name, dtype, mode, head_dim):
    if dtype != torch.float32 and name in XMX_SHAPED and not C.device_info()["matrix_engine"]:
        pytest.skip("the GPU's XMX variant (its default for 16-bit inputs) needs a matrix "
                    "engine to run here (AMX); gpu-check still compiles it for the GPU, and "
                    "test_matrix_*.py run the matrix kernels emulated")
    profile(name, mode)
    dtype_name = str(dtype).removeprefix("torch.")
    planned = C.plan("forward", name, dtype_name, head_dim, 0, 1, mode)["variant"]
    assert repr(C.warmup_fwd(dtype_name, head_dim, 0)) == repr(planned)
    _check_forward_backward(dtype, head_dim, causal=True)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", tiered([32, 64, 128], [128]))
def test_gpu_decode_variants_run_here(profile, name, dtype, head_dim):
    """A GPU's decode kernel holds one sub-group's query rows (decode_row_capacity): 5 K/V
    heads of 4 rows take two work-groups per sequence and split, the second with one head."""
    profile(name)
    batch, heads_kv, group = 2, 5, 4
    k_cache, v_cache = make_cache(batch, 300, heads_kv, head_dim, dtype)
    q = torch.randn(batch, 1, heads_kv * group, head_dim, dtype=dtype)
    lengths = torch.tensor([300, 123], dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                  return_softmax_lse=True)
    check_against_reference(out, lse, q, k_cache, v_cache, lengths.tolist(), dtype)
