"""The serving call's decode step (flash_attn_varlen_func over a paged cache, one query token
per sequence) where the device does not share host memory (an XPU), through the queue-handle
seam on the CPU device: the host reads no value and never waits for the device; a value out of
range (seqused_k past max_seqlen_k, a block_table entry outside the pool, cu_seqlens_q other
than 0, 1, ..., B) gives NaN output and LSE, and the next call on the device raises the
ValueError naming the argument. Steps of several tokens per sequence still wait for one read
(test_serving_step_plans.py)."""
import pytest
import torch

import ipex_flash

from helpers.cache_checks import check_cache_attention
from helpers.cases import DTYPES

BATCH, HEADS_Q, HEADS_KV, HEAD_DIM, PAGE, WIDTH = 4, 8, 2, 64, 32, 6
POOL = BATCH * WIDTH + 3
MAX_KEYS = PAGE * WIDTH - 24  # max_seqlen_k: below the table's reach, so that it is a bound


def page_pool(dtype):
    k_pages, v_pages = (torch.randn(POOL, PAGE, HEADS_KV, HEAD_DIM, dtype=dtype)
                        for _ in range(2))
    return (k_pages, v_pages), new_table()


def new_table():
    return torch.randperm(POOL)[:BATCH * WIDTH].to(torch.int32).view(BATCH, WIDTH)


def serve(pages, table, seqused, dtype, cu_q=None):
    """One step: q (B, Hq, D), out (B, Hq, D), lse (Hq, B)."""
    q = torch.randn(BATCH, HEADS_Q, HEAD_DIM, dtype=dtype)
    cu_q = torch.arange(BATCH + 1, dtype=torch.int32) if cu_q is None else cu_q
    out, lse, _ = ipex_flash.flash_attn_varlen_func(
        q, *pages, cu_q, None, 1, MAX_KEYS, causal=True, block_table=table, seqused_k=seqused,
        return_attn_probs=True)
    return q, out, lse


def check_step(q, out, lse, pages, table, seqused, dtype):
    # (as a flash_attn_with_kvcache step: q (B, 1, Hq, D), lse (B, Hq, 1))
    check_cache_attention(out.unsqueeze(1), lse.t().unsqueeze(-1), q.unsqueeze(1), pages, table,
                          torch.zeros(BATCH, dtype=torch.int32), seqused, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_token_steps_read_nothing_on_the_host(dtype, device_seam):
    """New tables, lengths (a sequence with no key among them, and one at max_seqlen_k) and
    queries each step: the reference's answer, and no read of the values on the host."""
    enter, plan_runs = device_seam
    pages, table = page_pool(dtype)
    for call in range(4):
        if call == 1:
            enter()
        seqused = torch.randint(1, MAX_KEYS + 1, (BATCH,), dtype=torch.int32)
        seqused[call % BATCH] = 0
        seqused[(call + 1) % BATCH] = MAX_KEYS
        table = new_table()
        q, out, lse = serve(pages, table, seqused, dtype)
        check_step(q, out, lse, pages, table, seqused, dtype)
    assert plan_runs == [True] * 3


BAD_VALUES = {
    "seqused_k": lambda seqused, table, cu_q: (seqused.index_fill(0, torch.tensor([1]),
                                                                  MAX_KEYS + 1), table, cu_q),
    "negative seqused_k": lambda seqused, table, cu_q: (
        seqused.index_fill(0, torch.tensor([2]), -3), table, cu_q),
    "block_table": lambda seqused, table, cu_q: (
        seqused, table.index_fill(1, torch.tensor([0]), POOL + 100), cu_q),
    "cu_seqlens_q": lambda seqused, table, cu_q: (
        seqused, table, cu_q.index_fill(0, torch.tensor([1]), 0)),  # 0, 0, 2, 3, 4
}


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_out_of_range_values_give_nan_then_raise(bad, device_seam):
    """A step with a value out of range returns NaN output and LSE; the next step raises the
    ValueError naming the argument and the call; the step after that runs again."""
    enter, plan_runs = device_seam
    dtype = torch.bfloat16
    pages, table = page_pool(dtype)
    seqused = torch.tensor([30, 50, 70, MAX_KEYS], dtype=torch.int32)
    cu_q = torch.arange(BATCH + 1, dtype=torch.int32)
    serve(pages, table, seqused, dtype)
    enter()
    bad_seqused, bad_table, bad_cu_q = BAD_VALUES[bad](seqused, table, cu_q)
    _, out, lse = serve(pages, bad_table, bad_seqused, dtype, bad_cu_q)
    assert out.isnan().all() and lse.isnan().all()
    argument = bad.split()[-1]
    with pytest.raises(ValueError, match=f"flash_attn_varlen_func.*{argument}"):
        serve(pages, table, seqused, dtype)
    q, out, lse = serve(pages, table, seqused, dtype)
    check_step(q, out, lse, pages, table, seqused, dtype)
    assert plan_runs == [True, True]  # (the raising step raised before its run)


def test_table_entries_past_the_pages_read_are_not_checked(device_seam):
    """Entries past each sequence's pages (transformers' -1, vLLM's stale pages) are never read:
    the device's check passes them, the step's answer is the reference's and the next step
    raises nothing."""
    enter, plan_runs = device_seam
    pages, table = page_pool(torch.float32)
    seqused = torch.tensor([PAGE, 2 * PAGE + 1, 1, MAX_KEYS], dtype=torch.int32)
    table[0, 1:] = -1
    table[1, 3:] = POOL + 100
    table[2, 1:] = -7
    for call in range(3):
        if call == 1:
            enter()
        q, out, lse = serve(pages, table, seqused, torch.float32)
        check_step(q, out, lse, pages, table, seqused, torch.float32)
    assert plan_runs == [True] * 2


@pytest.mark.parametrize("xpu_path", [False, True])
def test_steps_with_a_new_max_seqlen_k_repeat_the_plan(xpu_path, device_seam):
    """Decode steps as vLLM makes them: every sequence one key longer each step and
    max_seqlen_k its longest sequence's keys, a new value every step. Every step after the
    first runs the plan (max_seqlen_k is not part of its signature), on the XPU path without a
    read on the host, and answers as the reference. The step's own bound still holds: a
    sequence past it is refused (on the XPU path: NaN, then the next call raises)."""
    enter, plan_runs = device_seam
    pages, table = page_pool(torch.float32)
    cu_q = torch.arange(BATCH + 1, dtype=torch.int32)
    seqused = torch.tensor([1, 40, 90, MAX_KEYS - 8], dtype=torch.int32)

    def step(bound):
        q = torch.randn(BATCH, HEADS_Q, HEAD_DIM)
        out, lse, _ = ipex_flash.flash_attn_varlen_func(
            q, *pages, cu_q, None, 1, bound, causal=True, block_table=table,
            seqused_k=seqused, return_attn_probs=True)
        return q, out, lse

    for call in range(5):
        if xpu_path and call == 1:
            enter()
        q, out, lse = step(int(seqused.max()))
        check_step(q, out, lse, pages, table, seqused, torch.float32)
        seqused += 1
    assert plan_runs == [True] * 4
    bound = int(seqused.max()) - 1  # the longest sequence one key past this step's bound
    if not xpu_path:
        with pytest.raises(ValueError, match="flash_attn_varlen_func.*max_seqlen_k"):
            step(bound)
        return
    _, out, lse = step(bound)
    assert out.isnan().all() and lse.isnan().all()
    with pytest.raises(ValueError, match="flash_attn_varlen_func.*seqused_k"):
        step(int(seqused.max()))
