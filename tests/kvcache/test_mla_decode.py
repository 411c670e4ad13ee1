"""DeepSeek-style MLA decode over one latent cache, as vLLM and FlashMLA pass it:
flash_attn_with_kvcache(q, k_cache=kv, v_cache=kv[..., :512], ...) with q (B, Nq, H, 576) and
kv (pages, page_size, 1, 576): one K/V head, k and v the same memory, v a view of its first
512 columns (the latent; the other 64 are the rope part of the keys). The decode kernel serves it
with V's head dim apart (FEATURE_VALUE_DIM). Paged and contiguous, bfloat16 and FP8 caches with
their descales, one new token and speculative drafts, against float64; repeated calls (the
launch plan); GPU profiles (past the decode kernel's local memory, 64 KiB GPUs, the general
forward); and the append, which cannot write k and v into one memory, refused."""
import math

import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.kvcache.cache_ops import caches_share_rows
from ipex_flash.ops import launch, launch_plans
from ipex_flash.reference import flash_attn_reference

from helpers.cases import PLAN_CALLS
from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE

D, D_V, HEADS, PAGE = 576, 512, 16, 16
SCALE = 1.0 / math.sqrt(192)  # DeepSeek's: the head dim before the latent absorption
LENGTHS = [37, 100]  # partial key blocks and pages


def latent_cache(paged, dtype=torch.bfloat16, capacity=112, descale=None):
    """kv (pages, PAGE, 1, D) and the block table of len(LENGTHS) sequences in a shuffled pool
    with spare pages, or contiguous (B, capacity, 1, D) and None; and the float64 cache it
    holds (FP8: the stored values times the descale)."""
    batch = len(LENGTHS)
    if paged:
        per_seq = capacity // PAGE
        pool = batch * per_seq + 3
        full = torch.randn(pool, PAGE, 1, D)
        table = torch.randperm(pool)[:batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    else:
        full, table = torch.randn(batch, capacity, 1, D), None
    if descale is None:
        kv = full.to(dtype)
        return kv, table, kv.double()
    kv = (full / descale).to(dtype)
    return kv, table, kv.double() * descale


def keys_of(kv64, table, b, length):
    """Sequence b's first `length` cache rows, (length, 1, D)."""
    if table is None:
        return kv64[b, :length]
    return kv64[table[b].long()].flatten(0, 1)[:length]


def check(out, lse, q, kv64, table, lengths, dtype, causal=False):
    """Each sequence's output and LSE against the float64 reference over its keys, k the whole
    latent row and v its first D_V columns."""
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.shape == (*q.shape[:3], D_V) and out.dtype == dtype
    for b, length in enumerate(lengths):
        keys = keys_of(kv64, table, b, length)[None]
        ref_out, ref_lse = flash_attn_reference(q[b:b + 1], keys, keys[..., :D_V],
                                                causal=causal, scale=SCALE)
        torch.testing.assert_close(out[b:b + 1].double(), ref_out, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=LSE_TOLERANCE[0],
                                   atol=LSE_TOLERANCE[1])


def takes_decode_kernel(q, kv):
    views = (launch.view(t.transpose(1, 2)) for t in (q, kv, kv[..., :D_V]))
    return C.flash_decode_supported(*views, launch.queue_handle(q.device))


@pytest.mark.parametrize("new_tokens", [1, 2])  # 2: 32 query rows per K/V head, two slices
@pytest.mark.parametrize("paged", [True, False])
def test_mla_decode_matches_reference(paged, new_tokens):
    kv, table, kv64 = latent_cache(paged)
    q = torch.randn(len(LENGTHS), new_tokens, HEADS, D, dtype=torch.bfloat16)
    seqlens = torch.tensor(LENGTHS, dtype=torch.int32)
    assert takes_decode_kernel(q, kv)
    before = kv.clone()
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, kv, kv[..., :D_V], cache_seqlens=seqlens, block_table=table, softmax_scale=SCALE,
        causal=True, return_softmax_lse=True)
    check(out, lse, q, kv64, table, LENGTHS, torch.bfloat16, causal=True)
    assert torch.equal(kv, before)  # read only


@pytest.mark.parametrize("paged", [True, pytest.param(False, marks=pytest.mark.full)])
def test_mla_decode_fp8_cache(paged):
    """A float8_e4m3fn latent cache with its descale, given as k_descale and v_descale (one
    cache, one factor), bfloat16 queries: the decode kernel dequantises in registers."""
    descale = torch.tensor(0.05)
    kv, table, kv64 = latent_cache(paged, torch.float8_e4m3fn, descale=descale)
    q = torch.randn(len(LENGTHS), 1, HEADS, D, dtype=torch.bfloat16)
    assert takes_decode_kernel(q, kv)
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, kv, kv[..., :D_V], cache_seqlens=torch.tensor(LENGTHS, dtype=torch.int32),
        block_table=table, softmax_scale=SCALE, k_descale=descale, v_descale=descale,
        return_softmax_lse=True)
    check(out, lse, q, kv64, table, LENGTHS, torch.bfloat16)


def test_repeated_calls_run_the_plan(plan_runs):
    """A serving loop's decode steps: the first call checks and builds the plan, the others
    run it, each against the reference."""
    kv, table, kv64 = latent_cache(True)
    for step in range(PLAN_CALLS):
        q = torch.randn(len(LENGTHS), 1, HEADS, D, dtype=torch.bfloat16)
        lengths = [n - step for n in LENGTHS]
        out, lse = ipex_flash.flash_attn_with_kvcache(
            q, kv, kv[..., :D_V], cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
            block_table=table, softmax_scale=SCALE, return_softmax_lse=True)
        check(out, lse, q, kv64, table, lengths, torch.bfloat16)
    assert plan_runs == [True] * (PLAN_CALLS - 1)


def new_tokens(batch):
    return (torch.randn(batch, 1, 1, D, dtype=torch.bfloat16),
            torch.randn(batch, 1, 1, D_V, dtype=torch.bfloat16))


def test_append_into_one_latent_cache_is_refused(plan_runs):
    """k and v appended into caches that share memory would write the shared columns twice:
    refused with an error that says so, the cache left as it was, on the first call of a
    signature (the checks) and on a call a plan of that signature would serve (a plan built
    by a call with caches of their own)."""
    kv, table, _ = latent_cache(True)
    q = torch.randn(len(LENGTHS), 1, HEADS, D, dtype=torch.bfloat16)
    seqlens = torch.tensor(LENGTHS, dtype=torch.int32)
    before = kv.clone()
    k, v = new_tokens(len(LENGTHS))
    with pytest.raises(ValueError, match=r"k_cache and v_cache share memory .* call without k "
                                         r"and v"):
        ipex_flash.flash_attn_with_kvcache(q, kv, kv[..., :D_V], k, v, cache_seqlens=seqlens,
                                           block_table=table, softmax_scale=SCALE)
    assert torch.equal(kv, before)
    # Caches of their own with the same shapes and strides: the call appends, and its plan
    # serves the next call of this signature.
    k_own, v_own = kv.clone(), kv.clone()[..., :D_V]
    for _ in range(2):
        ipex_flash.flash_attn_with_kvcache(q, k_own, v_own, k, v, cache_seqlens=seqlens,
                                           block_table=table, softmax_scale=SCALE)
    assert plan_runs == [True]
    with pytest.raises(ValueError, match=r"k_cache and v_cache share memory"):
        ipex_flash.flash_attn_with_kvcache(q, kv, kv[..., :D_V], k, v, cache_seqlens=seqlens,
                                           block_table=table, softmax_scale=SCALE)
    assert plan_runs == [True, False]  # the plan declined it; the general path refused it
    assert torch.equal(kv, before)


def test_which_caches_share_rows():
    """Caches whose rows share memory are told from caches in one storage whose rows do not:
    MLA's latent cache and a view of its first columns share; vLLM's (2, ...) cache unbound
    into k and v, K and V halves of each row, and transformers' paged K and V (one buffer, V
    a page after K) do not. Fake and meta tensors the same (from storage offsets, as the
    append's checks see them under torch.compile)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def cases():
        kv = torch.zeros(4, 16, 1, D, dtype=torch.bfloat16)
        both = torch.zeros(2, 4, 16, 2, 64, dtype=torch.bfloat16)
        rows = torch.zeros(4, 16, 2, 128)
        pages = torch.zeros(9, 16, 2, 64)
        shifted = pages.as_strided((8, 16, 2, 64), pages.stride(), 5)  # 5 columns on
        return [(pages[:-1], pages[1:], False), (pages[:-1], shifted, True),
                (kv, kv[..., :D_V], True), (kv[..., 64:], kv[..., :D_V], True),
                (*both.unbind(0), False), (rows[..., :64], rows[..., 64:], False),
                (rows[..., 64:], rows[..., :64], False), (kv, kv.clone(), False)]

    for k_cache, v_cache, shared in cases():
        assert caches_share_rows(k_cache, v_cache) == shared
    with FakeTensorMode():
        for k_cache, v_cache, shared in cases():
            assert caches_share_rows(k_cache, v_cache) == shared
    kv = torch.zeros(4, 16, 1, D, device="meta")
    assert caches_share_rows(kv, kv[..., :D_V])
    assert not caches_share_rows(kv, torch.zeros(4, 16, 1, D_V, device="meta"))


@pytest.fixture
def profile(monkeypatch):
    """A GPU profile on the CPU device, with no launch plan from before (a plan is made for
    the device its first call ran on, which the profile changes)."""
    def set_profile(name, mode="auto"):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        launch_plans.clear()
        C.set_device_profile(name)
    yield set_profile
    C.set_device_profile("")
    launch_plans.clear()


@pytest.mark.parametrize("name", ["bmg", "mtl"])
def test_mla_decode_on_gpu_profiles(profile, name):
    """With 128 KiB of local memory (PVC, BMG, Lunar Lake) the decode kernel holds 16 rows of
    576 columns; with 64 KiB (Arc A-series, Meteor Lake, Arrow Lake-H) it does not, and the
    general forward serves the call (C.decode_fits gives the reason); both against the
    reference, run here with the GPU's variants."""
    profile(name)
    fits, reasons = C.decode_fits("bfloat16", D, HEADS, 0, name)
    assert fits == (C.profile_limits(name)["local_mem_bytes"] >= 128 * 1024), reasons
    kv, table, kv64 = latent_cache(True)
    q = torch.randn(len(LENGTHS), 1, HEADS, D, dtype=torch.bfloat16)
    assert takes_decode_kernel(q, kv) == fits
    out, lse = ipex_flash.flash_attn_with_kvcache(
        q, kv, kv[..., :D_V], cache_seqlens=torch.tensor(LENGTHS, dtype=torch.int32),
        block_table=table, softmax_scale=SCALE, return_softmax_lse=True)
    check(out, lse, q, kv64, table, LENGTHS, torch.bfloat16)
