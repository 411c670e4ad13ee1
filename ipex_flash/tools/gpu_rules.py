"""The rules gpu-check enforces on every kernel a GPU would build (docs/gpus.md).

- it builds for the target (the host planned it, and ocloc compiled it);
- its local memory fits the target's, and the host's estimate for the variant covers it (the
  estimate is what chose the tiles);
- at the common head dims (gpu_grid.COMMON_HEAD_DIMS) it neither spills nor uses private
  (scratch) memory; at other head dims these are reported, not enforced;
- an XMX kernel contains DPAS instructions, and its main loop's cost per DPAS is measured
  (gpu_check.KernelReport.loop_per_dpas: the register kernels' lean loop of the fully visible
  blocks, in the kernel as shipped, O's rescale branch left out: a block whose max does not
  rise past the threshold skips it); the forward with its tiles in registers issues at most
  MAX_FORWARD_PER_DPAS instructions per DPAS there at d = 64 and MAX_FORWARD_PER_DPAS_128 at
  d = 128 (without score changes, in both 16-bit dtypes): it reached 8.7-9.1 and 5.6-7.0 on
  BMG, PVC and Lunar Lake (docs/gpus.md), where Intel's own sycl-tla forward issues 10.3-11.3;
  the backward's register kernels (dQ, dK/dV) at most MAX_BACKWARD_PER_DPAS, on the same terms
  (they reached 5.5-10.0: dQ 7.2-8.5, dK/dV 5.5-9.9, at d = 128 in two passes over the query
  rows), dQ at d = 128 at most MAX_DQ_PER_DPAS_128 (7.2-7.7); the 8-wide forward of DG2 and
  Arrow Lake-H (SIMD8) at most MAX_FORWARD_8_WIDE_PER_DPAS (it reached 18.8 and 19.8 at d = 64,
  17.4 and 18.0 at 128 per DPAS it runs, 23.5-24.8 and 20.6-21.3 with its rescale branch
  counted, where their SLM-staged forward issued 88-95 in a build with every block fully
  visible; the rescale branch must be found in every register forward's main loop at these
  head dims, else the figure would be read whole), their register dQ at most MAX_DQ_8_WIDE_PER_DPAS (20.4 and
  21.4 per DPAS it runs at d = 64, 17.4 and 17.8 at 128, where the SLM-staged dQ issued 90-137
  so), and their register dK/dV at most MAX_DKDV_8_WIDE_PER_DPAS (23.3 and 24.4 at d = 64 in
  bfloat16, 26.4 and 26.3 in float16, 20.3 and 20.3 at 128, where the SLM-staged dK/dV issued
  75-180 so); with score changes whose
  blocks it splits into a lean loop (every change but a float mask past d = 64:
  score/block_mask.hpp, split_blocks), one at most MAX_DKDV_8_WIDE_SCORE_CHANGE_PER_DPAS
  (30.0-38.7 at d = 64, 21.7-24.9 at 128, where one loop over every block issued 45-86),
  several at most MAX_DKDV_8_WIDE_SCORE_CHANGES_PER_DPAS (34.3-52.3 and 26.8-38.2, where one
  loop issued more and softcap beside the others was SLM-staged at 260-325);
- a kernel that asks for the large register file (PVC, BMG, Lunar Lake) gets 256 registers.

Four spills are known and reported as such rather than failed (docs/gpus.md). The first: the
16-bit decode kernel for one query row per K/V head with softcap or ALiBi on GPUs without a
large register file (Arc A-series, Meteor Lake, Arrow Lake-H) spills 448-832 bytes per thread
with softcap, ALiBi and a mask together: a step's 16 keys each hold a row of partial scores
per lane until the lane sums, its K rows come as sub-group block reads, and the score changes'
state (the row's slope, the mask's rows) takes it past 128 registers at SIMD16. About 13-20
scratch accesses per key block, none in the step loop over the keys. At d = 128 on DG2 and
Arrow Lake-H 832 bytes (640 before every kernel's parameters carried the global positions of
a block of a larger attention, which the decode kernel never reads; dropping their read from
its sequence setup left 832). (Before the block reads,
the same kernels did not spill and the 8-row ones spilled 832-1024 bytes; with the page
looked up per key they also issued 8-15x the instructions.) The second: the float32
forward at head dim 128 with every score change at once (softcap, ALiBi and a user mask) on
Meteor Lake and Arrow Lake-H spills 64-160 bytes at SIMD8. A register tile of 8 keys instead
of 16 spilled more (224-320 bytes), and so did 32-bit mask offsets; no model we know combines
all three. The third: the 8-wide register dK/dV kernel (DG2, Arrow
Lake-H) with score changes spills up to 1024 bytes at head dims up to 128, with no spill or fill
in its lean loop or its costliest edge loop (loop_spills 0 and edge_spills at most
MAX_EDGE_SPILLS, enforced past 160 bytes): values written before a pass over the query rows
and read in the prologue of its loop over a K/V head's query heads, a few accesses per query
head and pass (8 in the d = 64 kernel with a bool mask), none in the loops over the query
blocks (read from the native code: docs/gpus.md). Its blocks split into lean and edge loops
(split_blocks) it spills 160-960 bytes at d = 64 with a mask, 288-960 at 128 with softcap or a
bool mask; in one loop over every block it spilled up to 160.
The fourth: the register forward with ALiBi or a mask at head dims past 64 on the
256-register GPUs (BMG, PVC, Lunar Lake) spills up to 2176 bytes (384-1088 with one change,
1344-2112 with softcap, ALiBi and a mask together), with no spill or fill in its lean loop
(loop_spills 0, enforced) and at most MAX_EDGE_SPILLS in its costliest edge loop (3-13 there,
of some 4600 instructions a block): its prologue holds the rest, values read once per
work-group. Q^T read per block in 4-register SLM loads (forward/registers_kernel.hpp) made
the lean loops 1.3-1.9 instructions per DPAS cheaper and these spills larger.
Any other spill fails.

The forward with score changes is held to the plain kernel's cost (same GPU, dtype and head
dims), on the 256-register GPUs at head dims 64, 128 and 192 (SCORE_CHANGE_HEAD_DIMS; the full
grid's others are reported: at d = 32 a score is two instructions per DPAS, and all three
changes reach 1.87-1.91x there, 1.54x at d = 96 on BMG): each change alone (softcap, ALiBi, a
bool mask) at most MAX_SCORE_CHANGE_RATIO times its lean loop's instructions per DPAS, softcap,
ALiBi and a mask together at most MAX_EVERY_CHANGE_RATIO times (docs/gpus.md: 1.00-1.25 alone,
1.35-1.49 together on BMG, PVC and Lunar Lake). The ratios compare whole lean loops, O's
rescale branch counted in both (_whole_loop): the branch costs the plain and the changed
kernels alike, and leaving it out of both raised every ratio (all three at d = 128 on BMG 1.48
-> 1.57) while no change cost more. At d = 64 softcap alone at most
MAX_SOFTCAP_RATIO_64 and all three at most MAX_EVERY_CHANGE_RATIO_64 (1.40 and 1.74 there): a
score is one instruction per DPAS at d = 64, the plain loop folds the scale into its exponent,
and softcap needs the scale's multiply, an exp2, an add and a reciprocal per score beside it (4
per DPAS over 9.7: 1.41 at best), the mask's bits two more. The forward over an FP8 cache
(e4m3, e5m2) at most MAX_FP8_RATIO times the 16-bit one: its pack converts the cache to the
query's dtype (forward/pack_kv.hpp), so its main loop is the 16-bit one's (0.99-1.01x).

A call the host refuses with an error naming the head dim and the GPU's limit (no kernel's
smallest tiles fit its local memory) is reported as refused: that error is what the call
gets.
"""
from __future__ import annotations

import re

from ipex_flash.tools.gpu_grid import COMMON_HEAD_DIMS

# Kernels of a program that do no matrix products, and ask for no register file, themselves.
_HELPERS = ("flash_fwd_pack_kv_kernel", "flash_decode_merge_kernel",
            "flash_bwd_preprocess_kernel", "flash_bwd_pack_keys_kernel",
            "flash_bwd_pack_rows_kernel", "flash_mask_bits_kernel", "dropout_mask_kernel",
            "kv_append_kernel", "cache_check_kernel")


MAX_FORWARD_PER_DPAS = 10.0        # at d = 64; at d = 128 MAX_FORWARD_PER_DPAS_128
MAX_FORWARD_PER_DPAS_128 = 8.0
MAX_BACKWARD_PER_DPAS = 11.0
MAX_DQ_PER_DPAS_128 = 8.5
MAX_FORWARD_8_WIDE_PER_DPAS = 21.0
MAX_DQ_8_WIDE_PER_DPAS = 22.0
MAX_DKDV_8_WIDE_PER_DPAS = 27.0
MAX_DKDV_8_WIDE_SCORE_CHANGE_PER_DPAS = 40.0
MAX_DKDV_8_WIDE_SCORE_CHANGES_PER_DPAS = 60.0
_PER_DPAS_LIMITS = (("flash_fwd_matrix_registers_kernel", MAX_FORWARD_PER_DPAS),
                    ("flash_bwd_dq_matrix_registers_kernel", MAX_BACKWARD_PER_DPAS),
                    ("flash_bwd_dkdv_matrix_registers_kernel", MAX_BACKWARD_PER_DPAS))

# Those of the 8-wide engines (SIMD8: DG2, Arrow Lake-H) where their kernels have one.
_PER_DPAS_LIMITS_8_WIDE = {"flash_fwd_matrix_registers_kernel": MAX_FORWARD_8_WIDE_PER_DPAS,
                           "flash_bwd_dq_matrix_registers_kernel": MAX_DQ_8_WIDE_PER_DPAS,
                           "flash_bwd_dkdv_matrix_registers_kernel": MAX_DKDV_8_WIDE_PER_DPAS}

_EVERY_SCORE_CHANGE = 1 | 2 | 4  # softcap, ALiBi, bool mask (common/features.hpp FEATURE_*)
_FLOAT_MASKS = 8 | 16 | 32  # float32, float16, bfloat16 masks, read in place
_EVERY_SCORE_CHANGE_BITS = _EVERY_SCORE_CHANGE | _FLOAT_MASKS
MAX_SCORE_CHANGE_RATIO = 1.3
MAX_EVERY_CHANGE_RATIO = 1.5
MAX_SOFTCAP_RATIO_64 = 1.45
MAX_EVERY_CHANGE_RATIO_64 = 1.8
_FP8_CACHE = 64 | 128  # e4m3, e5m2 (common/kv_quant.hpp)
MAX_FP8_RATIO = 1.5
# The head dims whose score changes are held to the plain kernel's cost (reported elsewhere).
SCORE_CHANGE_HEAD_DIMS = (64, 128, 192)
_FORWARD_REGISTERS = "flash_fwd_matrix_registers_kernel"
_DQ_REGISTERS = "flash_bwd_dq_matrix_registers_kernel"
_DKDV_REGISTERS = "flash_bwd_dkdv_matrix_registers_kernel"
MAX_EDGE_SPILLS = 16  # spill and fill accesses in a known spill's edge loop


def known_spill(r) -> bool:
    """The four spills described above."""
    decode = (r.family == "decode" and r.dtype != "float32" and r.rows == 1
              and r.features & (1 | 2) != 0  # softcap or ALiBi
              and r.target in ("dg2", "mtl", "arl-h") and "flash_decode_kernel" in r.kernel
              and r.spill <= 896)
    forward = (r.family == "forward" and r.dtype == "float32" and r.head_dim == 128
               and r.features & _EVERY_SCORE_CHANGE == _EVERY_SCORE_CHANGE
               and r.target in ("mtl", "arl-h") and "flash_fwd_kernel" in r.kernel and r.spill <= 256)
    dkdv_8_wide = (r.family == "backward" and r.target in ("dg2", "arl-h")
                   and _DKDV_REGISTERS in r.kernel and r.features != 0 and r.head_dim <= 128
                   and (r.spill <= 160 or (r.spill <= 1024 and r.loop_spills == 0
                                           and r.edge_spills <= MAX_EDGE_SPILLS)))
    forward_registers = (r.family == "forward" and _FORWARD_REGISTERS in r.kernel
                         and r.large_grf and r.head_dim > 64 and r.features & (2 | 4)
                         and r.spill <= 2176 and r.loop_spills == 0
                         and r.edge_spills <= MAX_EDGE_SPILLS)
    return decode or forward or dkdv_8_wide or forward_registers


def refused(r) -> bool:
    """The host's refusal of a head dim past what the GPU's local memory holds (the error of
    kernel_variant.cpp's choose_variant), described above."""
    return not r.built and re.search(r"no \w+ kernel for head dim \d+ on ", r.error) is not None


def _dkdv_split_limit(r):
    """The limit per DPAS of the 8-wide register dK/dV of report r where score changes split its
    blocks into a lean loop (score/block_mask.hpp, split_blocks: every change but a float mask
    past d = 64), else None."""
    changes = r.features & _EVERY_SCORE_CHANGE_BITS
    if changes == 0 or r.features & ~_EVERY_SCORE_CHANGE_BITS or (
            changes & _FLOAT_MASKS and r.head_dim > 64):
        return None
    single = changes & (changes - 1) == 0
    return (MAX_DKDV_8_WIDE_SCORE_CHANGE_PER_DPAS if single
            else MAX_DKDV_8_WIDE_SCORE_CHANGES_PER_DPAS)


def kernel_violations(r) -> list:
    if not r.built:
        return [] if refused(r) else [f"not built: {r.error}"]
    found = []
    if r.slm > r.slm_limit:
        found.append(f"local memory {r.slm} > {r.slm_limit}")
    if r.slm > r.slm_estimate:
        found.append(f"local memory {r.slm} above the host's estimate {r.slm_estimate}")
    if r.head_dim in COMMON_HEAD_DIMS and r.spill > 0 and not known_spill(r):
        found.append(f"spills {r.spill} bytes")
    # The layout probe (probes/matrix_layout_probe_kernel.hpp) runs once per process: its
    # private arrays cost nothing that matters, and its four products are not in a loop.
    probe = "matrix_layout_probe_kernel" in r.kernel
    if r.head_dim in COMMON_HEAD_DIMS and r.private > 0 and not probe:
        found.append(f"private memory {r.private} bytes")
    main_kernel = not any(name in r.kernel for name in _HELPERS)
    if r.matrix and main_kernel and r.dpas == 0:
        found.append("XMX variant without DPAS")
    if r.matrix and main_kernel and r.dpas > 0 and r.loop_per_dpas == 0 and not probe:
        found.append("main loop not measured")
    for name, limit in _PER_DPAS_LIMITS:
        if r.simd == 8:
            limit = _PER_DPAS_LIMITS_8_WIDE.get(name, limit)
        elif name == _FORWARD_REGISTERS and r.head_dim == 128:
            limit = MAX_FORWARD_PER_DPAS_128
        elif name == _DQ_REGISTERS and r.head_dim == 128:
            limit = MAX_DQ_PER_DPAS_128
        split_limit = _dkdv_split_limit(r) if r.simd == 8 and name == _DKDV_REGISTERS else None
        if split_limit is not None:
            limit = split_limit
        if (name in r.kernel and (r.features == 0 or split_limit is not None)
                and r.head_dim in COMMON_HEAD_DIMS and r.loop_per_dpas > limit):
            found.append(f"main loop issues {r.loop_per_dpas} instructions per DPAS "
                         f"(at most {limit})")
    # The register forward's figure leaves its rescale branch out (gpu_native._rescale_branches):
    # a kernel where none was found would be read whole, or its rescale run every block.
    if (_FORWARD_REGISTERS in r.kernel and r.head_dim in COMMON_HEAD_DIMS and r.loop_per_dpas
            and not r.loop_rescale_per_dpas):
        found.append("O's rescale not found in a branch of the main loop")
    if r.large_grf and main_kernel and r.grf != 256:
        found.append(f"large register file asked for, {r.grf} registers given")
    return found


def _whole_loop(r) -> float:
    """The lean loop's instructions per DPAS with O's rescale branch counted in (a block whose
    max rises): the ratios below compare whole loops, as when their limits were set. A branch
    both kernels skip alike would otherwise raise every ratio while no change's cost moved."""
    return round(r.loop_per_dpas + r.loop_rescale_per_dpas, 2)


def score_change_violations(r, plain) -> list:
    """The register forward with score changes, or over an FP8 cache, against its plain kernel
    (`plain`: the report of the same target, dtype and head dims with features 0, or None)."""
    changes = r.features & _EVERY_SCORE_CHANGE
    if (plain is None or not r.built or _FORWARD_REGISTERS not in r.kernel or not r.large_grf
            or not plain.loop_per_dpas):
        return []
    ratio = _whole_loop(r) / _whole_loop(plain)
    if r.features & _FP8_CACHE and not r.features & ~_FP8_CACHE:
        return [] if ratio <= MAX_FP8_RATIO else [
            f"main loop issues {_whole_loop(r)} instructions per DPAS over an FP8 cache, "
            f"{ratio:.2f}x the 16-bit kernel's {_whole_loop(plain)} (at most {MAX_FP8_RATIO}x)"]
    if (changes == 0 or r.features & ~_EVERY_SCORE_CHANGE
            or r.head_dim not in SCORE_CHANGE_HEAD_DIMS):
        return []
    narrow = r.head_dim <= 64
    limit = ((MAX_EVERY_CHANGE_RATIO_64 if narrow else MAX_EVERY_CHANGE_RATIO)
             if changes == _EVERY_SCORE_CHANGE
             else MAX_SOFTCAP_RATIO_64 if changes == 1 and narrow
             else MAX_SCORE_CHANGE_RATIO if changes in (1, 2, 4) else None)
    if limit is None or ratio <= limit:
        return []
    return [f"main loop issues {_whole_loop(r)} instructions per DPAS (rescale included), "
            f"{ratio:.2f}x the plain kernel's {_whole_loop(plain)} (at most {limit}x)"]


def check_rules(reports: list) -> None:
    plain = {(r.target, r.dtype, r.head_dim, r.head_dim_v): r for r in reports
             if r.features == 0 and _FORWARD_REGISTERS in r.kernel and r.built}
    for r in reports:
        r.violations = kernel_violations(r) + score_change_violations(
            r, plain.get((r.target, r.dtype, r.head_dim, r.head_dim_v)))
