"""The forward's register kernel with V's head dim compiled apart from Q's and K's (Dv != D,
MLA prefill: S = Q K^T at D = 192, P.V and the O accumulators at Dv = 128, not at the padded
192): the variants the host plans for the GPUs and the emulation, then the kernel itself under
the 16-wide emulation of the matrix tiles (IPEX_FLASH_MATRIX=emulate), against the float64
reference with masks, score changes, varlen and paged K/V."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference, flash_attn_reference, sdpa_reference

from helpers.caches import make_cache, to_paged
from helpers.cases import tiered
from helpers.reference import LSE_TOLERANCE, OUTPUT_TOLERANCE, assert_matches_reference

# (D, Dv) -> (D, Dv) compiled: padded to multiples of 16 (of 32 above 128).
SPLIT = {(192, 128): (192, 128), (64, 32): (64, 32), (40, 72): (48, 80), (256, 128): (256, 128)}
# Not split: Dv above 128 (O^T would not fit beside the scores: the SLM-staged kernel at the
# larger head dim), or both padding to the same head dim.
NOT_SPLIT = {(96, 160): 160, (40, 48): 48}
HALF = [torch.float16, torch.bfloat16]


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "emulate")


def qkv(batch, heads_q, heads_kv, len_q, len_k, d, d_v, dtype):
    return (torch.randn(batch, heads_q, len_q, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d_v, dtype=dtype))


@pytest.mark.parametrize("target,mode", [("", "emulate"), ("bmg", "auto"), ("pvc", "auto"),
                                         ("lnl", "auto"), ("dg2", "auto"), ("arl-h", "auto"),
                                         ("", "emulate8")])
def test_split_plans(target, mode):
    """The register kernel takes HEAD_DIM_V and then VALUE_SPLIT as its last template
    arguments (two sub-groups per query rows only on the 8-wide engines, past Dv = 64), its K/V
    pack HEAD_DIM_V and then the pack's tile order (8 x 16 tiles on the 8-wide engines, else
    row-major: 0, 0); the SLM estimate is Q^T's alone, at D, once per sub-group sharing rows."""
    eight_wide = target in ("dg2", "arl-h") or mode == "emulate8"
    order = "8, 16" if eight_wide else "0, 0"
    for (d, d_v), (hd, hd_v) in SPLIT.items():
        plan = C.plan("forward", target, "bfloat16", d, 0, 1, mode, d_v)
        variant = plan["variant"]
        assert plan["header"] == "programs/flash_fwd_matrix_registers.hpp", (d, d_v, plan)
        assert (variant.head_dim, variant.head_dim_v) == (hd, hd_v)
        split = 2 if eight_wide and hd_v > 64 else 1
        assert variant.value_split == split
        assert plan["kernels"][0].endswith(f", {hd_v}, {split}>")
        assert f"<{hd}, " not in plan["kernels"][0]
        assert plan["kernels"][1].endswith(f", {hd_v}, {order}>") and f", {hd}, " in plan["kernels"][1]
        assert plan["slm_bytes"] == split * 2 * hd * variant.block_m
    for (d, d_v), widest in NOT_SPLIT.items():
        variant = C.plan("forward", target, "bfloat16", d, 0, 1, mode, d_v)["variant"]
        assert (variant.head_dim, variant.head_dim_v) == (widest, 0)
    # Equal head dims: head_dim_v stays 0, the kernels' argument is the head dim.
    plan = C.plan("forward", target, "bfloat16", 128, 0, 1, mode)
    assert plan["variant"].head_dim_v == 0
    assert plan["kernels"][0].endswith(f", 128, {2 if eight_wide else 1}>")


@pytest.mark.parametrize("d,d_v", tiered([*SPLIT, *NOT_SPLIT], [(192, 128), (64, 32)],
                                         multi=True))
@pytest.mark.parametrize("dtype", tiered(HALF, [torch.bfloat16]))
def test_forward_matches_reference(emulate, dtype, d, d_v):
    """GQA, lengths off the 64-row blocks, both causal and not: outputs and LSE."""
    q, k, v = qkv(2, 4, 2, 77, 130, d, d_v, dtype)
    for causal in (False, True):
        out, lse = ipex_flash.attention(q, k, v, causal=causal, return_lse=True)
        assert out.shape == (2, 4, 77, d_v)
        assert_matches_reference(out, lse, *attention_reference(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("dtype", tiered(HALF, [torch.float16]))
def test_masks_and_score_changes(emulate, dtype):
    """Sliding window, softcap and ALiBi (the kernel's score-change instantiation, whose
    products read tile by tile at these head dims) through flash_attn_func; bool and float
    attention masks through the SDPA drop-in."""
    d, d_v = 192, 128
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv(2, 4, 2, 70, 150, d, d_v, dtype))
    slopes = torch.rand(4) * 0.3
    for options in (dict(causal=True, window_size=(40, 0)), dict(softcap=5.0),
                    dict(alibi_slopes=slopes, causal=True)):
        out, lse, _ = ipex_flash.flash_attn_func(q, k, v, return_attn_probs=True, **options)
        ref_out, ref_lse = flash_attn_reference(q, k, v, **options)
        torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=LSE_TOLERANCE[0],
                                   atol=LSE_TOLERANCE[1])
    q, k, v = qkv(1, 4, 4, 50, 90, d, d_v, dtype)
    for mask in (torch.rand(50, 90) > 0.3, torch.randn(50, 90).to(dtype)):
        out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ref = sdpa_reference(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("paged", [False, True])
def test_varlen_and_paged(emulate, paged):
    """flash_attn_varlen_func over packed sequences, and over a paged cache (block_table)."""
    d, d_v, dtype = 192, 128, torch.bfloat16
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    lengths = [(5, 9), (70, 130), (33, 33)]
    k_cache, _ = make_cache(len(lengths), 130, 2, d, dtype)
    _, v_cache = make_cache(len(lengths), 130, 2, d_v, dtype)
    q = torch.randn(sum(n for n, _ in lengths), 4, d, dtype=dtype)
    cu_q = torch.tensor([0] + [n for n, _ in lengths]).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + [n for _, n in lengths]).cumsum(0).to(torch.int32)
    if paged:
        k_pages, v_pages, table = to_paged(k_cache, v_cache, 16)
        out = ipex_flash.flash_attn_varlen_func(
            q, k_pages, v_pages, cu_q, None, 70, 130, causal=True, block_table=table,
            seqused_k=torch.tensor([n for _, n in lengths], dtype=torch.int32))
    else:
        k = torch.cat([k_cache[b, :n] for b, (_, n) in enumerate(lengths)])
        v = torch.cat([v_cache[b, :n] for b, (_, n) in enumerate(lengths)])
        out = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 130, causal=True)
    assert out.shape == (q.shape[0], 4, d_v)
    for b, (_, n_k) in enumerate(lengths):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = flash_attn_reference(q[rows][None], k_cache[b:b + 1, :n_k],
                                      v_cache[b:b + 1, :n_k], True)
        torch.testing.assert_close(out[rows].double(), ref[0], rtol=rtol, atol=atol)
