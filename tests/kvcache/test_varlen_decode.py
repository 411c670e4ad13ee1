"""flash_attn_varlen_func's decode steps (every sequence the same few queries) run the split-KV
decode kernel with the packed keys read as a cache (ipex_flash/ops/varlen_decode.py): each
sequence against its own float64 reference, with the options that count key positions (causal,
windows, ALiBi), GQA, every dtype; and the steps it does not serve keep the general kernel."""
import pytest
import torch

import ipex_flash
from ipex_flash.ops import launch, launch_plans, varlen_decode
from ipex_flash.reference import flash_attn_reference

from helpers.cases import DTYPES, PLAN_CALLS
from helpers.reference import assert_matches_reference


@pytest.fixture
def decode_launches(monkeypatch):
    """Counts the launches varlen_decode made."""
    made = []
    real = launch.run_forward
    monkeypatch.setattr(varlen_decode.launch, "run_forward",
                        lambda *a, **kw: made.append(1) or real(*a, **kw))
    return made


def step(dtype, lengths_k, queries, heads=(8, 2), head_dim=64, spare_rows=0):
    batch = len(lengths_k)
    q = torch.randn(batch * queries + spare_rows, heads[0], head_dim, dtype=dtype)
    k, v = (torch.randn(sum(lengths_k) + 3, heads[1], head_dim, dtype=dtype) for _ in range(2))
    cu_q = torch.arange(batch + 1, dtype=torch.int32) * queries
    cu_k = torch.nn.functional.pad(torch.tensor(lengths_k).cumsum(0, dtype=torch.int32), (1, 0))
    return q, k, v, cu_q, cu_k


def check_sequences(out, lse, q, k, v, cu_q, cu_k, dtype, slopes=None, **options):
    for b in range(cu_q.shape[0] - 1):
        rows, keys = (slice(int(cu[b]), int(cu[b + 1])) for cu in (cu_q, cu_k))
        ref = flash_attn_reference(q[None, rows], k[None, keys], v[None, keys],
                                   alibi_slopes=None if slopes is None else slopes[b], **options)
        assert_matches_reference(out[None, rows], lse[None, :, rows], *ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(window_size=(37, 0)),
                                     dict(softcap=4.0, alibi=True)])
def test_decode_step_matches_reference(dtype, queries, options, decode_launches):
    options = dict(options)
    slopes = torch.rand(4, 8) * 0.3 if options.pop("alibi", False) else None
    q, k, v, cu_q, cu_k = step(dtype, [300, 5, 77, 1000], queries, spare_rows=2)
    if queries == 3:  # one sequence (a batch stride the kernels never use)
        q, k, v, cu_q, cu_k = step(dtype, [300], queries, spare_rows=2)
        slopes = None if slopes is None else slopes[:1]
    out, lse, _ = ipex_flash.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, queries, 1000, alibi_slopes=slopes, return_attn_probs=True,
        **options)
    check_sequences(out, lse, q, k, v, cu_q, cu_k, dtype, slopes, **options)
    assert decode_launches == [1]


@pytest.mark.parametrize("case", ["ragged_queries", "fewer_keys_than_queries", "grad"])
def test_other_steps_keep_the_general_kernel(case, decode_launches):
    """Sequences of unequal query counts, a sequence with fewer keys than queries (a row would
    see none), and a call whose backward follows run the general kernel, correctly."""
    q, k, v, cu_q, cu_k = step(torch.float32, [50, 2 if case == "fewer_keys_than_queries" else 9],
                               3)
    if case == "ragged_queries":
        cu_q = torch.tensor([0, 1, 6], dtype=torch.int32)
    if case == "grad":
        q.requires_grad_()
    out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 50, causal=True,
                                                    return_attn_probs=True)
    check_sequences(out.detach(), lse, q.detach(), k, v, cu_q, cu_k, torch.float32, causal=True)
    assert decode_launches == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_steps_run_the_decode_plan(dtype, plan_runs):
    """A decode step's signature repeated with new key lengths each call (totals fixed) runs a
    plan on the decode kernel; a step where a sequence has fewer keys than queries is not
    served by it (the general path runs it, correctly)."""
    totals = 700
    for call in range(PLAN_CALLS + 1):
        first = 1 if call == PLAN_CALLS else int(torch.randint(2, 400, ()))
        lengths = [first, int(torch.randint(2, 250, ())), 2]
        lengths.append(totals - sum(lengths))
        q, k, v, cu_q, cu_k = step(dtype, lengths, 2)
        k, v = k[:totals], v[:totals]
        out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 700, causal=True,
                                                        return_attn_probs=True)
        check_sequences(out, lse, q, k, v, cu_q, cu_k, dtype, causal=True)
    (plan,) = launch_plans._PLANS.values()
    assert plan.uses_decode_kernel and plan.packed_queries == 2
    assert plan_runs == [True] * (PLAN_CALLS - 1) + [False]


def test_one_sequence_decode_plan(plan_runs):
    """A single sequence's decode step (its keys' batch stride is never read) is planned too."""
    for _ in range(PLAN_CALLS):
        q, _, _, cu_q, cu_k = step(torch.float32, [int(torch.randint(1, 300, ()))], 1)
        k, v = (torch.randn(300, 2, 64) for _ in range(2))
        out, lse, _ = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 300,
                                                        return_attn_probs=True)
        check_sequences(out, lse, q, k, v, cu_q, cu_k, torch.float32)
    (plan,) = launch_plans._PLANS.values()
    assert plan.uses_decode_kernel and plan_runs == [True] * (PLAN_CALLS - 1)
