"""The decode kernel's register form over FP8 caches (decode/xmx_kernel.hpp; decode/xmx_tiles.hpp
converts K and V to the queries' 16-bit type in registers on their way into the tiles), run with
joint_matrix emulated (IPEX_FLASH_MATRIX=emulate): e4m3 and e5m2 under float16 and bfloat16
queries against the float64 reference of the dequantised cache; every bit pattern of V exact,
every finite pattern of K, a NaN key; bfloat16 queries beyond a half's range (their tiles are
half, each row scaled); descales per tensor and per (sequence, K/V head);
contiguous and paged caches; head dims whose V rows are read a word per lane (64, 128) and one
read byte by byte (80); partial key blocks, splits, softcap and a window; the append quantising
its tokens into the cache."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.caches import to_paged
from helpers.fp8 import FP8, QUERY_DTYPES, check, quantised_cache
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)

KV_BITS = {torch.float8_e4m3fn: 64, torch.float8_e5m2: 128}  # FEATURE_KV_E4M3, _E5M2


def assert_register_form(dtype, head_dim, rows, fp8):
    plan = C.plan("decode", "", str(dtype).removeprefix("torch."), head_dim, KV_BITS[fp8], rows,
                  "emulate")
    assert plan["variant"].matrix_registers and plan["variant"].matrix_emulated, plan["reasons"]


CASES = {
    "d128_contiguous": dict(head_dim=128),
    "d64_paged16_per_head": dict(head_dim=64, page_size=16, per_head=True),
    "d80_bytes": dict(head_dim=80, per_head=True),
    "d128_splits_softcap": dict(head_dim=128, num_splits=3, options=dict(softcap=6.0)),
    "d64_window_paged32": dict(head_dim=64, page_size=32,
                               options=dict(causal=True, window_size=(70, 0))),
}


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("case", CASES)
def test_fp8_register_decode_matches_reference(matrix_mode, case, fp8, dtype):
    matrix_mode("emulate")
    torch.manual_seed(0)
    spec = CASES[case]
    head_dim, lengths = spec["head_dim"], [200, 131, 5]  # last blocks of 8, 3 and 5 keys
    assert_register_form(dtype, head_dim, 4, fp8)
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        len(lengths), 224, 2, head_dim, fp8, spec.get("per_head", False))
    kwargs = dict(spec.get("options", {}))
    if "page_size" in spec:
        k_cache, v_cache, kwargs["block_table"] = to_paged(k_cache, v_cache, spec["page_size"])
    q = torch.randn(len(lengths), 1, 8, head_dim, dtype=dtype)
    caches_before = k_cache.clone(), v_cache.clone()
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        k_descale=k_descale, v_descale=v_descale, num_splits=spec.get("num_splits", 1), **kwargs)
    assert torch.equal(k_cache.view(torch.uint8), caches_before[0].view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), caches_before[1].view(torch.uint8))
    check(out, q, k64, v64, lengths, dtype, **spec.get("options", {}))


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_every_value_pattern_exact(matrix_mode, fp8, dtype):
    """One key whose value row holds all 256 bit patterns, 8 query heads on it: every output
    row is that row, each value exact (NaN patterns NaN, e5m2's infinities infinite)."""
    matrix_mode("emulate")
    head_dim = 256
    assert_register_form(dtype, head_dim, 8, fp8)
    v_cache = torch.arange(256, dtype=torch.uint8).view(fp8).reshape(1, 1, 1, head_dim)
    k_cache = torch.zeros(1, 1, 1, head_dim).to(fp8)
    q = torch.randn(1, 1, 8, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    expected = v_cache.float().to(dtype).expand(1, 1, 8, head_dim)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def finite_patterns(fp8):
    """Every finite bit pattern of the format (the largest, subnormals and both zeros too)."""
    values = torch.arange(256, dtype=torch.uint8).view(fp8)
    return values[values.float().isfinite()]


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_every_finite_key_pattern(matrix_mode, fp8, dtype):
    """Keys made of every finite pattern, the largest of each format included, with a descale
    that brings them near 1: the scores' dequantisation against the reference."""
    matrix_mode("emulate")
    torch.manual_seed(1)
    head_dim, keys = 64, 150
    patterns = finite_patterns(fp8)
    picks = torch.cat([patterns, patterns[torch.randint(len(patterns), (keys * head_dim,))]])
    k_cache = picks[torch.randperm(len(picks))[:keys * head_dim]].reshape(1, keys, 1, head_dim)
    k_cache.view(torch.uint8).view(-1)[:len(patterns)] = patterns.view(torch.uint8)
    v_cache = torch.randn(1, keys, 1, head_dim).to(fp8)
    k_descale = torch.tensor(1.0 / patterns.float().abs().max().item())
    q = torch.randn(1, 1, 8, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_descale=k_descale)
    check(out, q, k_cache.double() * float(k_descale), v_cache.double(), [keys], dtype)


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_a_nan_key_makes_its_rows_nan(matrix_mode, fp8):
    """A NaN element in one key: that key's score is NaN for every row, and IEEE arithmetic
    carries it into every output row of its sequence (the reference instead zeroes the
    probabilities of a row whose normaliser is NaN); the other sequence matches the reference."""
    matrix_mode("emulate")
    torch.manual_seed(2)
    head_dim, dtype = 64, torch.bfloat16
    k_cache, v_cache = (torch.randn(2, 80, 1, head_dim).to(fp8) for _ in range(2))
    k_cache.view(torch.uint8)[0, 37, 0, 5] = 0x7F  # a NaN in both formats
    q = torch.randn(2, 1, 8, head_dim, dtype=dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache)
    assert out[0].isnan().all()
    check(out[1:], q[1:], k_cache[1:].double(), v_cache[1:].double(), [80], dtype)


@pytest.mark.parametrize("magnitude", [3e5, 1e-6, 1e-30])
def test_bfloat16_queries_outside_a_halfs_range(matrix_mode, magnitude):
    """bfloat16 queries go to half tiles scaled per row by a power of two: rows far above a
    half's largest value (65504) or below its smallest normal, beside an ordinary row, against
    the reference."""
    matrix_mode("emulate")
    torch.manual_seed(4)
    head_dim, keys, dtype = 128, 90, torch.bfloat16
    (k_cache, v_cache), (k_descale, v_descale), (k64, v64) = quantised_cache(
        1, keys, 1, head_dim, torch.float8_e4m3fn, True)
    q = torch.randn(1, 1, 8, head_dim) / head_dim ** 0.5
    q[:, :, :4] *= magnitude / q[:, :, :4].abs().amax()
    q = q.to(dtype)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_descale=k_descale,
                                             v_descale=v_descale, softmax_scale=1.0)
    check(out, q, k64, v64, [keys], dtype, scale=1.0)


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_append_quantises_into_the_cache(matrix_mode, fp8):
    """bfloat16 tokens appended by the register form: quantised with their descales (the
    cache's bytes those of torch's cast), then read back with the cache."""
    matrix_mode("emulate")
    torch.manual_seed(3)
    batch, capacity, heads_kv, head_dim = 2, 96, 2, 64
    assert_register_form(torch.bfloat16, head_dim, 4, fp8)
    descales = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, head_dim).to(fp8)
                        for _ in range(2))
    q = torch.randn(batch, 1, 8, head_dim, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(batch, 1, heads_kv, head_dim, dtype=torch.bfloat16)
                    for _ in range(2))
    lengths = torch.tensor([40, 77], dtype=torch.int32)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                             cache_seqlens=lengths, k_descale=descales[0],
                                             v_descale=descales[1])
    exact = []
    for cache, new, descale in ((k_cache, k_new, descales[0]), (v_cache, v_new, descales[1])):
        for b in range(batch):
            want = (new[b, 0].float() / descale[b, :, None]).to(fp8)
            assert torch.equal(cache[b, int(lengths[b])].view(torch.uint8),
                               want.view(torch.uint8))
        exact.append(cache.double() * descale.double()[:, None, :, None])
    check(out, q, *exact, [int(n) + 1 for n in lengths], torch.bfloat16)
