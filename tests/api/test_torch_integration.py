"""The ops under torch.library's own checks and under torch.compile."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.caches import make_cache
from helpers.cases import DTYPES, random_qkv
from helpers.reference import assert_matches_reference, check_against_reference


def sample_inputs():
    yield random_qkv(1, 2, 2, 20, 20, 32, torch.float32), dict(causal=False)
    yield random_qkv(2, 4, 2, 33, 17, 64, torch.float16), dict(causal=True)
    yield random_qkv(1, 2, 1, 5, 40, 16, torch.bfloat16, layout="bnhd"), dict(causal=True, scale=0.3)


@pytest.mark.parametrize("index", range(3))
def test_opcheck_attention_forward(index):
    (q, k, v), kwargs = list(sample_inputs())[index]
    torch.library.opcheck(torch.ops.ipex_flash.attention_forward.default, (q, k, v), kwargs)


@pytest.mark.parametrize("index", range(3))
def test_opcheck_attention(index):
    (q, k, v), kwargs = list(sample_inputs())[index]
    torch.library.opcheck(torch.ops.ipex_flash.attention.default, (q, k, v), kwargs)


def test_fake_tensor_shapes_and_strides():
    """Meta tensors give the same shapes, dtypes and strides as the real kernel."""
    for (q, k, v), kwargs in sample_inputs():
        real = torch.ops.ipex_flash.attention_forward(q, k, v, **kwargs)
        fake = torch.ops.ipex_flash.attention_forward(q.to("meta"), k.to("meta"), v.to("meta"), **kwargs)
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_compile_fullgraph(dtype):
    def block(q, k, v):
        # Surrounding ops that inductor fuses, around an op it must treat as opaque.
        return torch.ops.ipex_flash.attention(q * 1.5, k, v, causal=True).float()

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    q, k, v = random_qkv(2, 4, 2, 45, 45, 64, dtype)
    expected, _ = attention_reference(q * 1.5, k, v, causal=True)
    got = compiled(q, k, v)
    assert_matches_reference(got.to(dtype), None, expected, None, dtype)
    torch.testing.assert_close(got, block(q, k, v), rtol=0, atol=0)


def test_kernel_cache_reuses_builds():
    q, k, v = random_qkv(1, 1, 1, 8, 8, 48, torch.float32)
    ipex_flash.attention(q, k, v)
    before = C.kernel_cache_stats()
    for _ in range(3):
        ipex_flash.attention(q, k, v)
    after = C.kernel_cache_stats()
    assert after["builds"] == before["builds"]
    assert after["hits"] == before["hits"] + 3


def test_warmup_decode_builds_the_kernels_decode_runs():
    """`python -m ipex_flash warmup` builds decode kernels per (dtype, head dim, rows per K/V
    head): a decode call of that shape afterwards builds nothing."""
    variant = C.warmup_decode("bfloat16", 96, 4, 0)
    assert (variant.head_dim, variant.block_m) == (96, 4)
    before = C.kernel_cache_stats()
    # GQA 8/2 with one new token: 4 query rows per K/V head.
    q = torch.randn(2, 1, 8, 96, dtype=torch.bfloat16)
    k_cache, v_cache = make_cache(2, 70, 2, 96, torch.bfloat16)
    lengths = [70, 33]
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        return_softmax_lse=True)
    assert C.kernel_cache_stats()["builds"] == before["builds"]
    check_against_reference(out, lse, q, k_cache, v_cache, lengths, torch.bfloat16)


def test_warmup_decode_builds_mla_decode():
    """v's head dim apart (MLA: q and k 576, v 512 over one latent cache): the warm-up builds
    the kernel such a call runs, which then builds nothing."""
    variant = C.warmup_decode("bfloat16", 576, 16, 0, head_dim_v=512)
    assert variant.features & C.FEATURE_VALUE_DIM
    before = C.kernel_cache_stats()
    latent = torch.randn(1, 40, 1, 576, dtype=torch.bfloat16)
    q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16)
    out = ipex_flash.flash_attn_with_kvcache(
        q, latent, latent[..., :512], cache_seqlens=torch.tensor([40], dtype=torch.int32))
    assert out.shape == (1, 1, 16, 512)
    assert C.kernel_cache_stats()["builds"] == before["builds"]
    with pytest.raises(ValueError, match="head_dim_v must be"):
        C.warmup_decode("bfloat16", 576, 16, 0, head_dim_v=513)


@pytest.mark.parametrize("rows", [0, C.MAX_DECODE_ROWS + 1])
def test_warmup_decode_rejects_rows_out_of_range(rows):
    with pytest.raises(ValueError, match="rows must be in"):
        C.warmup_decode("float32", 64, rows, 0)
