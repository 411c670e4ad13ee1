"""The decode kernel's register form (decode/xmx_kernel.hpp: Q, K^T, P and V through the matrix
engine with S and O in registers, the query rows of a K/V head as the tiles' rows), run with
joint_matrix emulated (IPEX_FLASH_MATRIX=emulate) against the float64 reference: 8 and 16 rows,
row slices, head dims 64 to 256 (80: five tiles), contiguous, head-major and paged caches,
partial key blocks, splits, causal and windowed masks, softcap, sinks, flash_attn_with_kvcache's
append and its rotary embedding, both 16-bit dtypes."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.cache_checks import after_append, check, check_cache_attention
from helpers.caches import cache_in_layout, make_cache, to_paged
from helpers.matrix import matrix_mode  # noqa: F401 (a fixture)
from helpers.reference import check_against_reference, check_sinks_against_reference
from helpers.rotary import expected as rotary_expected

# heads (q, kv) x new tokens = the rows of a K/V head: 4 (8-row tiles, one row tile), 12 and 16
# (two row tiles), 32 (two slices of 16 rows).
CASES = {
    "gqa4_d128": dict(heads=(8, 2), head_dim=128),
    "gqa4_d80_paged16": dict(heads=(8, 2), head_dim=80, page_size=16),
    "mha_d64_head_major": dict(heads=(4, 4), head_dim=64, layout="head_major"),
    "gqa8_d256_softcap": dict(heads=(8, 1), head_dim=256, options=dict(softcap=4.0)),
    "three_tokens_causal_paged32": dict(heads=(8, 2), head_dim=64, new_tokens=3, page_size=32,
                                        options=dict(causal=True)),
    "gqa16_d128_window": dict(heads=(16, 1), head_dim=128,
                              options=dict(causal=True, window_size=(70, 0))),
    "two_slices_d64": dict(heads=(16, 2), head_dim=64, new_tokens=4, options=dict(causal=True)),
    "gqa4_d128_splits": dict(heads=(8, 2), head_dim=128, num_splits=3),
}


def run_case(case, dtype):
    lengths = [5, 200, 131]  # a block's worth and less; a last block of 8 or 3 keys
    heads_q, heads_kv = case["heads"]
    head_dim = case["head_dim"]
    k, v = cache_in_layout(case.get("layout", "contiguous"), len(lengths), 224, heads_kv,
                           head_dim, dtype)
    kwargs = dict(case.get("options", {}))
    if "page_size" in case:
        k_pages, v_pages, table = to_paged(k, v, case["page_size"])
        cache = (k_pages, v_pages)
        kwargs["block_table"] = table
    else:
        cache = (k, v)
    q = torch.randn(len(lengths), case.get("new_tokens", 1), heads_q, head_dim, dtype=dtype)
    q_before = q.clone()
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, *cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        return_softmax_lse=True, num_splits=case.get("num_splits", 1), **kwargs)
    assert torch.equal(q, q_before)
    check_against_reference(out, lse, q, k, v, lengths, dtype, **case.get("options", {}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES)
def test_register_decode_matches_reference(matrix_mode, case, dtype):
    matrix_mode("emulate")
    torch.manual_seed(0)
    spec = CASES[case]
    rows = spec["heads"][0] // spec["heads"][1] * spec.get("new_tokens", 1)
    variant = C.warmup_decode(str(dtype).removeprefix("torch."), spec["head_dim"],
                              min(rows, 16), 0)
    assert variant.matrix_registers and variant.matrix_emulated
    assert variant.block_m == (8 if rows <= 8 else 16)
    run_case(spec, dtype)


@pytest.mark.parametrize("head_dim,rows,subgroups,why", [
    (128, 8, 1, None),
    (128, 16, 2, None),
    (256, 8, 2, None),
    (256, 16, 4, None),
    (512, 16, 8, None),
    (72, 4, 0, "head dim 72 is not a multiple of 16"),
])
def test_register_form_takes_what_its_registers_hold(head_dim, rows, subgroups, why):
    """O's accumulators at most 64 registers a sub-group: past that, sub-groups share the
    work-group (value_split). Where a head dim is not whole tiles, the vector form serves the
    call and the plan says why (planned emulated on this device, and for BMG's XMX)."""
    for profile, mode in (("", "emulate"), ("bmg", "1")):
        plan = C.plan("decode", profile, "bfloat16", head_dim, 0, rows, mode)
        assert plan["variant"].matrix_registers == (why is None), (profile, plan["reasons"])
        if why is not None:
            assert any(why in reason for reason in plan["reasons"]), plan["reasons"]
        else:
            assert plan["variant"].value_split == subgroups


DTYPES_16 = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
APPEND, ROTARY_F32 = 1024, 2048  # FEATURE_APPEND, FEATURE_ROTARY_F32 (common/features.hpp)


def takes_register_form(dtype, head_dim, rows, features):
    name = str(dtype).removeprefix("torch.")
    plan = C.plan("decode", "", name, head_dim, features, rows, "emulate")
    return plan["variant"].matrix_registers


@pytest.mark.parametrize("dtype", DTYPES_16)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("heads_kv,new_tokens,head_dim", [(2, 3, 64), (4, 1, 64), (2, 3, 128)])
def test_register_decode_appends(matrix_mode, dtype, paged, heads_kv, new_tokens, head_dim):
    """The new keys and values written by the work-group of their split (4 splits of about 130
    keys: new tokens across their boundaries), then attended with the cache: 12 and 2 rows per
    K/V head; 12 rows at head dim 128 take two sub-groups, the first writing the rows both
    read."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    batch, capacity = 4, 200
    assert takes_register_form(dtype, head_dim, 8 // heads_kv * new_tokens, APPEND)
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
    lengths = torch.tensor([46, 62, 94, 127], dtype=torch.int32)
    q = torch.randn(batch, new_tokens, 8, head_dim, dtype=dtype)
    k_new, v_new = (torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=dtype)
                    for _ in range(2))
    args = dict(cache_seqlens=lengths, causal=True, return_softmax_lse=True, num_splits=4)
    k_in, v_in, table = k_cache, v_cache, None
    if paged:
        k_in, v_in, table = to_paged(k_cache, v_cache, 16)
        args["block_table"] = table
    expected = [after_append(c, table, lengths, n) for c, n in ((k_in, k_new), (v_in, v_new))]
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k_in, v_in, k_new, v_new, **args)
    assert torch.equal(k_in, expected[0]) and torch.equal(v_in, expected[1])
    check_cache_attention(out, lse, q, (k_in, v_in), table, torch.zeros(batch, dtype=torch.int32),
                          lengths + new_tokens, dtype)


@pytest.mark.parametrize("dtype", DTYPES_16)
@pytest.mark.parametrize("interleaved", [True, False])
def test_register_decode_rotates(matrix_mode, dtype, interleaved):
    """The rotary embedding (rotary_dim 32 of 64, float32 tables) of the new keys as they are
    appended and of the queries as they are staged: 12 rows per K/V head."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    batch, capacity, heads_kv, head_dim, new_tokens = 2, 96, 2, 64, 3
    assert takes_register_form(dtype, head_dim, 12, APPEND | ROTARY_F32)
    k_cache, v_cache = make_cache(batch, capacity, heads_kv, head_dim, dtype)
    before = k_cache.clone(), v_cache.clone()
    q = torch.randn(batch, new_tokens, 8, head_dim, dtype=dtype)
    k_new, v_new = (torch.randn(batch, new_tokens, heads_kv, head_dim, dtype=dtype)
                    for _ in range(2))
    lengths = torch.tensor([0, 70], dtype=torch.int32)
    angles = torch.rand(capacity, 16, dtype=torch.float64) * 2 * math.pi
    cos, sin = angles.cos().float(), angles.sin().float()
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin, lengths,
                                             causal=True, rotary_interleaved=interleaved)
    used = torch.atan2(sin.double(), cos.double())
    want = rotary_expected(q, *before, k_new, v_new, lengths, [0, 1], True, used, interleaved)
    check(out, want, dtype)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["one_split", "three_splits"])
@pytest.mark.parametrize("heads_kv,head_dim", [(4, 64), (1, 256)], ids=["d64", "d256_subgroups"])
def test_register_decode_sinks(matrix_mode, num_splits, heads_kv, head_dim):
    """A head's sink as one more term of each row's denominator: with one split the kernel
    folds it in itself (decode/rows.hpp, decode_row_finish), with three the merge kernel does;
    16 rows at head dim 256 take four sub-groups, whose row sums meet first."""
    matrix_mode("emulate")
    torch.manual_seed(0)
    dtype = torch.bfloat16
    assert takes_register_form(dtype, head_dim, 16 // heads_kv, 0)
    q = torch.randn(3, 1, 16, head_dim, dtype=dtype)
    k_cache, v_cache = make_cache(3, 300, heads_kv, head_dim, dtype)
    lengths = [300, 133, 2]
    sinks = torch.randn(16) * 2
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), sinks=sinks,
        num_splits=num_splits)
    check_sinks_against_reference(out, q, k_cache, v_cache, lengths, sinks, dtype)
