"""Launch plans (ipex_flash/ops/launch_plans.py) of the SDPA drop-in and flash_attn_func: a
repeated call of the same signature runs the plan built after its first call, on new data each
time, against the float64 reference; inputs the general path adapts get no plan. The KV-cache
calls' plans are tested in test_kvcache_call_plans.py and test_serving_step_plans.py."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.ops import launch_plans
from ipex_flash.reference import flash_attn_reference, sdpa_reference

from helpers.cases import DTYPES, PLAN_CALLS as CALLS
from helpers.reference import OUTPUT_TOLERANCE, assert_matches_reference


def check(out, ref, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("len_q,len_k,head_dim", [(1, 100, 64), (37, 70, 48)])
@pytest.mark.parametrize("mask", [None, "bool_padding", "float_per_row"])
def test_sdpa_repeats(dtype, causal, len_q, len_k, head_dim, mask, plan_runs):
    for _ in range(CALLS):
        q = torch.randn(2, 8, len_q, head_dim, dtype=dtype)
        k, v = (torch.randn(2, 2, len_k, head_dim, dtype=dtype) for _ in range(2))
        attn_mask = None
        if mask == "bool_padding":  # (B, 1, 1, Nk), a new padding each call
            attn_mask = torch.rand(2, 1, 1, len_k) > 0.3
            attn_mask[..., 0] = True
        elif mask == "float_per_row":
            attn_mask = torch.randn(len_q, len_k).to(dtype)
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                      is_causal=causal, enable_gqa=True)
        check(out, sdpa_reference(q, k, v, attn_mask, is_causal=causal), dtype)
    assert plan_runs == [True] * (CALLS - 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [
    dict(causal=True), dict(window_size=(20, 3)), dict(softcap=5.0, alibi=True),
    dict(sinks=True)])
@pytest.mark.parametrize("len_q", [1, 45])
def test_flash_attn_func_repeats(dtype, options, len_q, plan_runs):
    options = dict(options)
    alibi, sinks = options.pop("alibi", False), options.pop("sinks", False)
    for _ in range(CALLS):
        q = torch.randn(2, len_q, 6, 40, dtype=dtype)
        k, v = (torch.randn(2, 77, 2, 40, dtype=dtype) for _ in range(2))
        extra = dict(alibi_slopes=torch.rand(6) * 0.3) if alibi else {}
        if sinks:
            extra = dict(sinks=torch.randn(6))
        out, lse, _ = ipex_flash.flash_attn_func(q, k, v, return_attn_probs=True, **options,
                                                 **extra)
        if sinks:  # the flash reference has no sinks; SDPA's, without a causal mask, agrees
            ref = sdpa_reference(*(t.transpose(1, 2) for t in (q, k, v)), sinks=extra["sinks"])
            check(out, ref.transpose(1, 2), dtype)
            continue
        assert_matches_reference(out, lse, *flash_attn_reference(q, k, v, **options, **extra),
                                 dtype)
    assert plan_runs == [True] * (CALLS - 1)


@pytest.mark.parametrize("case", ["strided_last_dim", "odd_16bit_head_dim"])
def test_kernel_choice_of_plans(case, plan_runs):
    """A strided last dimension, which the general path copies, gets no plan; 16-bit rows not
    word-aligned, which the decode kernel's word loads do not serve, get a plan that runs the
    general kernel."""
    dtype = torch.bfloat16 if case == "odd_16bit_head_dim" else torch.float32
    for _ in range(CALLS):
        q = torch.randn(2, 8, 2, 33 if case == "odd_16bit_head_dim" else 64, dtype=dtype)
        k, v = (torch.randn(2, 2, 100, q.shape[-1], dtype=dtype) for _ in range(2))
        if case == "strided_last_dim":
            k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
        out = ipex_flash.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        check(out, sdpa_reference(q, k, v, is_causal=True), dtype)
    (plan,) = launch_plans._PLANS.values()
    if case == "strided_last_dim":
        assert plan is False and plan_runs == []
    else:
        assert not plan.uses_decode_kernel and plan_runs == [True] * (CALLS - 1)


def random_offsets(batch: int, total: int, longest: int) -> torch.Tensor:
    """(batch + 1,) int32 offsets of `batch` sequences of at most `longest` rows, some empty,
    ending at or before `total` (rows past the last sequence belong to none)."""
    while True:
        lengths = torch.randint(0, longest + 1, (batch,))
        if int(lengths.sum()) <= total:
            return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [
    dict(causal=True), dict(window_size=(20, 3)), dict(softcap=5.0, alibi=True), dict()])
def test_varlen_repeats(dtype, options, plan_runs):
    """flash_attn_varlen_func: one signature (totals, batch, max lengths) with new sequence
    lengths each call, each sequence against its own reference."""
    options = dict(options)
    alibi = options.pop("alibi", False)
    batch, max_q, max_k = 4, 40, 90
    for _ in range(CALLS):
        cu_q, cu_k = random_offsets(batch, 100, max_q), random_offsets(batch, 250, max_k)
        q = torch.randn(100, 6, 40, dtype=dtype)
        k, v = (torch.randn(250, 2, 40, dtype=dtype) for _ in range(2))
        slopes = torch.rand(batch, 6) * 0.3 if alibi else None
        out, lse, _ = ipex_flash.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=slopes, return_attn_probs=True,
            **options)
        for b in range(batch):
            rows, keys = (slice(int(cu[b]), int(cu[b + 1])) for cu in (cu_q, cu_k))
            if rows.start == rows.stop or keys.start == keys.stop:
                continue  # (a sequence without keys: test_flash_attn_api's cases)
            ref = flash_attn_reference(q[None, rows], k[None, keys], v[None, keys],
                                       alibi_slopes=None if slopes is None else slopes[b],
                                       **options)
            assert_matches_reference(out[None, rows], lse[None, :, rows], *ref, dtype)
    assert plan_runs == [True] * (CALLS - 1)


def test_packed_functions_run_plans(plan_runs):
    """The packed functions' strided slices run the plans of flash_attn_func and
    flash_attn_varlen_func."""
    for _ in range(CALLS):
        qkv = torch.randn(2, 30, 3, 4, 32)
        out = ipex_flash.flash_attn_qkvpacked_func(qkv, causal=True)
        check(out, flash_attn_reference(*qkv.unbind(2), causal=True)[0], torch.float32)
        cu = random_offsets(3, 50, 30)
        packed = torch.randn(50, 3, 4, 32)
        out = ipex_flash.flash_attn_varlen_qkvpacked_func(packed, cu, 30, causal=True)
        for b in range(3):
            rows = slice(int(cu[b]), int(cu[b + 1]))
            if rows.start < rows.stop:
                ref = flash_attn_reference(*(t[None] for t in packed[rows].unbind(1)), causal=True)
                check(out[None, rows], ref[0], torch.float32)
    assert plan_runs == [True] * (2 * (CALLS - 1))


@pytest.mark.parametrize("bad", ["decreasing", "past_total", "longer_than_max_seqlen"])
def test_varlen_offsets_checked_on_planned_calls(bad, plan_runs):
    """Offsets the general path rejects are rejected on a planned signature too, with its
    error; the plan launches nothing."""
    q, k, v = torch.randn(20, 2, 16), torch.randn(30, 2, 16), torch.randn(30, 2, 16)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    for _ in range(2):
        ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, 8, 8)
    wrong = {"decreasing": [0, 6, 4], "past_total": [0, 10, 31],
             "longer_than_max_seqlen": [0, 9, 10]}[bad]
    cu_k = torch.tensor(wrong, dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k|max_seqlen_k"):
        ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu_k, 8, 8)
    assert plan_runs == [True, False]


def test_packed_values_off_the_cpu_device():
    """launch_plans.packed_values, the check a GPU's plans of packed sequences make from one
    read of the device: the longest sequence's keys, or -1 for offsets out of range and, for a
    decode step's plan, sequences that are not of its query count or have fewer keys."""
    q, k = torch.empty(20, 2, 16), torch.empty(30, 2, 16)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    assert launch_plans.packed_values(cu, cu, q, k, 8, 8) == 5
    for wrong, max_k in (([0, 6, 4], 8), ([0, 10, 31], 30), ([0, 9, 10], 8), ([1, 2, 3], 8)):
        assert launch_plans.packed_values(cu, torch.tensor(wrong, dtype=torch.int32), q, k, 8,
                                          max_k) == -1
    uniform = torch.tensor([0, 2, 4], dtype=torch.int32)
    assert launch_plans.packed_values(uniform, cu, q, k, 2, 8, queries=2) == 5
    assert launch_plans.packed_values(cu, cu, q, k, 8, 8, queries=2) == -1
    few_keys = torch.tensor([0, 1, 6], dtype=torch.int32)
    assert launch_plans.packed_values(uniform, few_keys, q, k, 2, 8, queries=2) == -1


def test_functorch_transforms_take_the_dispatcher(plan_runs):
    """Inside vmap the calls reach the op through the dispatcher (its batching fallback): no
    plan serves them, and each slice gets its own attention."""
    q, k, v = (torch.randn(3, 2, 4, 5, 16) for _ in range(3))
    for _ in range(CALLS):
        out = torch.func.vmap(ipex_flash.scaled_dot_product_attention)(q, k, v)
        for i in range(3):
            check(out[i], sdpa_reference(q[i], k[i], v[i]), torch.float32)
    assert plan_runs == [] and not launch_plans._PLANS


def test_a_plan_that_cannot_be_built_keeps_the_general_path(monkeypatch, plan_runs):
    """A plan whose build fails leaves its signature on the general path with one warning;
    the call that built it, and the later ones, return their results."""
    def failing(*args, **kwargs):
        raise RuntimeError("no plan here")

    monkeypatch.setattr(launch_plans, "new_plan", failing)
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    with pytest.warns(RuntimeWarning, match="no launch plan.*no plan here"):
        out = ipex_flash.scaled_dot_product_attention(q, k, v)
    check(out, sdpa_reference(q, k, v), torch.float32)
    check(ipex_flash.scaled_dot_product_attention(q, k, v), sdpa_reference(q, k, v), torch.float32)
    assert plan_runs == [] and list(launch_plans._PLANS.values()) == [False]


def test_skipped_kernels_are_timed_not_run(plan_runs):
    """The host-cost benchmark's seam (C.skip_kernels): a planned call's kernels are
    submitted, so its submission is timed, but not run: the cache it would append to stays as
    it was. Unset, the same call appends and attends."""
    q = torch.randn(1, 1, 4, 16)
    k_cache, v_cache = (torch.randn(1, 8, 2, 16) for _ in range(2))
    k, v = (torch.randn(1, 1, 2, 16) for _ in range(2))
    lengths = torch.tensor([5], dtype=torch.int32)
    ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)
    before = k_cache.clone()
    C.take_first_submission_ns()
    assert C.skip_kernels(True) is False
    try:
        ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths + 1)
        assert C.take_first_submission_ns() > 0
    finally:
        assert C.skip_kernels(False) is True
    assert plan_runs == [True] and torch.equal(k_cache, before)
    out = ipex_flash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                             cache_seqlens=lengths + 1)
    assert torch.equal(k_cache[:, 6], k[:, 0]) and torch.equal(v_cache[:, 6], v[:, 0])
    check(out, flash_attn_reference(q, k_cache[:, :7], v_cache[:, :7])[0], torch.float32)
