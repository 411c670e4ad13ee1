"""The decode kernel's register form (decode/xmx_kernel.hpp) with the score changes its rows take
one by one (decode/row_scores.hpp): ALiBi slopes of each query head of a GQA group, a user's
mask whose planes differ per query head, softcap beside both; joint_matrix emulated
(IPEX_FLASH_MATRIX=emulate), against the float64 references. Rows span heads and new tokens
(GQA 4 x 3 tokens = 12 rows: two row tiles of 8), and key blocks end off the tiles."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch
from ipex_flash.reference import sdpa_reference

from helpers.caches import make_cache, to_paged
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)
from helpers.reference import OUTPUT_TOLERANCE, check_against_reference
from helpers.sdpa import mask_of

SOFTCAP, ALIBI = 1, 2  # FEATURE_* bits (common/features.hpp), and the mask's by its dtype
MASK_FEATURE = {torch.bool: 4, torch.float32: 8, torch.float16: 16, torch.bfloat16: 32}
DTYPES_16 = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


def assert_register_form(dtype, head_dim, rows, features):
    name = str(dtype).removeprefix("torch.")
    plan = C.plan("decode", "", name, head_dim, features, rows, "emulate")
    assert plan["variant"].matrix_registers, plan["reasons"]


def assert_decode_kernel_serves(q, k, v):
    """The call goes to the decode kernel (not the general forward): q, k, v as (B, H, N, D)."""
    views = (launch.view(t) for t in (q, k, v))
    assert C.flash_decode_supported(*views, launch.queue_handle(q.device))


@pytest.mark.parametrize("dtype", DTYPES_16)
@pytest.mark.parametrize("softcap", [0.0, 6.0], ids=["alibi", "alibi_softcap"])
@pytest.mark.parametrize("paged,num_splits", [(False, 1), (True, 3)],
                         ids=["contiguous", "paged_splits"])
def test_alibi_per_query_head(matrix_mode, dtype, softcap, paged, num_splits):
    """Each of a K/V head's query heads its own slope, per sequence ((B, Hq) slopes); causal
    with 3 new tokens, so distances differ per token too."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    heads_q, heads_kv, head_dim, new_tokens = 8, 2, 64, 3
    assert_register_form(dtype, head_dim, 12, ALIBI | (SOFTCAP if softcap else 0))
    lengths = [5, 200, 131]
    k, v = make_cache(len(lengths), 224, heads_kv, head_dim, dtype)
    cache, extra = (k, v), {}
    if paged:
        k_pages, v_pages, extra["block_table"] = to_paged(k, v, 32)
        cache = (k_pages, v_pages)
    q = torch.randn(len(lengths), new_tokens, heads_q, head_dim, dtype=dtype)
    slopes = torch.rand(len(lengths), heads_q) * 0.3
    assert_decode_kernel_serves(*(t.transpose(1, 2) for t in (q, *cache)))
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, *cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), causal=True,
        softcap=softcap, alibi_slopes=slopes, return_softmax_lse=True, num_splits=num_splits,
        **extra)
    check_against_reference(out, lse, q, k, v, lengths, dtype, causal=True, softcap=softcap,
                            alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", DTYPES_16)
@pytest.mark.parametrize("kind", ["bool", "float32", "same_dtype"])
@pytest.mark.parametrize("len_q,softcap", [(1, 0.0), (3, 5.0)])
def test_mask_per_query_head(matrix_mode, dtype, kind, len_q, softcap):
    """SDPA's small-query route with a (B, Hq, Lq, S) mask, every query head's plane its own
    (a whole key block hidden for one head), over 333 keys (a last block of 13)."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    batch, heads_q, heads_kv, head_dim, len_k = 2, 8, 2, 128, 333
    mask_dtype = {"bool": torch.bool, "float32": torch.float32, "same_dtype": dtype}[kind]
    assert_register_form(dtype, head_dim, 4 * len_q,
                         MASK_FEATURE[mask_dtype] | (SOFTCAP if softcap else 0))
    q = torch.randn(batch, heads_q, len_q, head_dim, dtype=dtype)
    k, v = (torch.randn(batch, heads_kv, len_k, head_dim, dtype=dtype) for _ in range(2))
    mask = mask_of("bool" if kind == "bool" else "float", (batch, heads_q, len_q, len_k),
                   mask_dtype if kind != "bool" else None)
    mask[0, 5, :, 64:128] = False if kind == "bool" else float("-inf")
    mask_before = mask.clone()
    assert_decode_kernel_serves(q, k, v)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                                  softcap=softcap or None)
    assert torch.equal(mask, mask_before)
    want = sdpa_reference(q, k, v, mask, softcap=softcap)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=rtol, atol=atol)



def test_bool_mask_read_as_bits_each_call(matrix_mode):
    """A bool mask is packed into bits for the register form before each call (decode_mask_bits,
    the program's flash_mask_bits_kernel): a (B, 1, 1, S) mask broadcast over heads and the new
    token, over 333 keys in splits; a second call of the same signature (its launch plan) with
    another mask's values gets its own bits, and neither call changes the mask."""
    matrix_mode("emulate")
    torch.manual_seed(1)
    batch, heads_q, heads_kv, head_dim, len_k = 3, 8, 2, 64, 333
    q = torch.randn(batch, heads_q, 1, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads_kv, len_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    views, queue = [launch.view(t) for t in (q, k, v)], launch.queue_handle(q.device)
    options = C.AttentionOptions()
    assert C.decode_scratch_bytes(*views, options, queue) == 0  # no mask, no bits
    rtol, atol = OUTPUT_TOLERANCE[torch.bfloat16]
    for call in range(2):
        keep = torch.rand(batch, 1, 1, len_k) > (0.2 + 0.5 * call)
        keep[..., 7] = True  # every row sees a key
        options.attn_mask = launch.view(keep.expand(batch, heads_q, 1, len_k))
        # A word per 32 keys of each key block, one plane for every head and token.
        assert C.decode_scratch_bytes(*views, options, queue) >= batch * (len_k + 31) // 32 * 4
        keep_before = keep.clone()
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
        assert torch.equal(keep, keep_before)
        want = sdpa_reference(q, k, v, keep)
        torch.testing.assert_close(out.double(), want, rtol=rtol, atol=atol)
