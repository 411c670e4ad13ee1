"""The decode kernel's scores on the matrix engine (flash_decode.hpp, MATRIX_M > 0): its tile
shapes forced through IPEX_FLASH_MATRIX and emulated (IPEX_FLASH_MATRIX=emulate), over
contiguous, head-major and paged caches, against the float64 reference. Emulated, the cases the
decode's register form serves (16-bit, head dims of whole 16-column tiles) take it instead
(test_matrix_decode_registers.py); the case at head dim 72 (padded to 96) keeps the matrix
scores, and the tile-height modes run them all on AMX."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C

from helpers.caches import cache_in_layout, to_paged
from helpers.matrix import (  # noqa: F401 (matrix_mode: a fixture)
    ONE_RUN_MODE, TILE_MODES, matrix_mode, needs_engine)
from helpers.reference import check_against_reference


def decode_cache(layout, batch, capacity, heads_kv, head_dim, page_size, dtype):
    """A cache for flash_attn_with_kvcache: (k, v, extra kwargs, (k, v) as contiguous
    (B, N, H, D) for the reference)."""
    k, v = cache_in_layout("head_major" if layout == "head_major" else "contiguous", batch,
                           capacity, heads_kv, head_dim, dtype)
    if layout != "paged":
        return k, v, {}, (k, v)
    k_pages, v_pages, table = to_paged(k, v, page_size)
    return k_pages, v_pages, {"block_table": table}, (k, v)


# Decode with the scores on the matrix engine (flash_decode.hpp, MATRIX_M > 0): K tiles read in
# place (contiguous or head-major caches, pages: powers of two >= 16, so whole 16-row tiles) or
# staged through SLM (a partial last block, head dim 80 padded to 96); several K/V heads
# per Q^T tile (GQA 4: four heads' rows fill its 16 columns), a partial head group (6 heads
# at head dim 256), 3 new tokens x GQA 4 = 12 rows; the score options.
DECODE_CASES = {
    "contiguous_partial_group": dict(layout="contiguous", heads=(24, 6), head_dim=256),
    "head_major": dict(layout="head_major", heads=(32, 8), head_dim=128),
    "padded_dim": dict(layout="contiguous", heads=(8, 2), head_dim=80),
    "pages_of_16": dict(layout="paged", heads=(8, 2), head_dim=64, page_size=16),
    "three_tokens_causal": dict(layout="contiguous", heads=(8, 2), head_dim=64, new_tokens=3,
                                options=dict(causal=True)),
    "softcap_alibi_window": dict(layout="contiguous", heads=(8, 2), head_dim=128,
                                 options=dict(causal=True, softcap=5.0, window_size=(100, 0),
                                              alibi=True)),
    "d72_sixteen_rows_alibi": dict(layout="paged", heads=(32, 2), head_dim=72, page_size=32,
                                   options=dict(softcap=5.0, alibi=True)),
}


def run_decode_case(case, dtype=torch.bfloat16):
    lengths = [37, 300]
    heads_q, heads_kv = case["heads"]
    k, v, paging, (k_ref, v_ref) = decode_cache(case["layout"], len(lengths), 336, heads_kv,
                                                case["head_dim"], case.get("page_size", 16), dtype)
    options = dict(case.get("options", {}))
    slopes = torch.rand(len(lengths), heads_q) * 0.2 if options.pop("alibi", False) else None
    q = torch.randn(len(lengths), case.get("new_tokens", 1), heads_q, case["head_dim"],
                    dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = ipex_flash.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                                  return_softmax_lse=True, alibi_slopes=slopes,
                                                  **paging, **options)
    for b, length in enumerate(lengths):  # ALiBi slopes are per sequence
        check_against_reference(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k_ref[b:b + 1],
                                v_ref[b:b + 1], [length], dtype, **options,
                                alibi_slopes=None if slopes is None else slopes[b:b + 1])
    return out, lse


# bfloat16 in every mode; float16 emulated (AMX takes only bfloat16 here).
# (emulate8 is not among them: the decode kernel's scores take only N = 16, its sub-group, and
# test_emulated_variants_and_build_options checks that emulate8 leaves them on the vector units.)
DECODE_RUNS = [pytest.param(mode, torch.bfloat16, marks=needs_engine, id=mode)
               for mode in TILE_MODES + ["0"]]
DECODE_RUNS += [pytest.param("emulate", dtype, id=f"emulate-{str(dtype)[6:]}")
                for dtype in (torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("mode,dtype", DECODE_RUNS)
@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_matches_reference(matrix_mode, mode, dtype, case):
    matrix_mode(mode)
    torch.manual_seed(0)
    run_decode_case(DECODE_CASES[case], dtype)


@pytest.mark.parametrize("mode", ONE_RUN_MODE)
def test_decode_takes_matrix_path(matrix_mode, mode):
    """Forced on and off on the same inputs: both match the reference, and their log-sum-exps
    differ in the last bits (another summation order), so the forced mode was not ignored."""
    matrix_mode(mode)
    assert C.warmup_decode("bfloat16", 128, 4, 0).matrix_emulated == (mode == "emulate")
    results = []
    for run_mode in (mode, "0"):
        matrix_mode(run_mode)
        torch.manual_seed(0)
        results.append(run_decode_case(DECODE_CASES["head_major"]))
    assert not torch.equal(results[0][1], results[1][1])


def test_emulated_matrix_scores_still_run():
    """The emulated runs above reach the matrix-score form through the head-dim-72 case (not
    whole tiles, which the register form needs): were the register form to take it, they would
    test only that form."""
    plan = C.plan("decode", "", "bfloat16", 72, 3, 16, "emulate")
    assert plan["variant"].matrix_m > 0 and not plan["variant"].matrix_registers, plan["reasons"]
