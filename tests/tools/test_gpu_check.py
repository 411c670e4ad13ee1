"""gpu-check: every kernel each Intel GPU profile would run is compiled to that GPU's native
code by Intel's offline compiler (ocloc, installed by scripts/setup/setup_env.sh through
scripts/setup/install_ocloc.sh) and must pass the rules of ipex_flash/tools/gpu_rules.py. This is the CI
gate for the GPU path; the parsing and the rules themselves are tested on made-up input."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from ipex_flash.tools import gpu_grid, gpu_native
from ipex_flash.tools.gpu_check import KernelReport
from ipex_flash.tools.gpu_rules import kernel_violations

ZE_INFO = """\
version:         '1.73'
kernels:
  - name:            _ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIfLi64ELi64ELi64ELi0EEEvNS_9FwdParamsE
    execution_env:
      grf_count:       128
      simd_size:       32
      slm_size:        65536
      spill_size:      640
      private_size:    2048
  - name:            Intel_Symbol_Table_Void_Program
    execution_env:
      simd_size:       16
kernels_misc_info:
  - name:            _ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIfLi64ELi64ELi64ELi0EEEvNS_9FwdParamsE
    args_info:
"""


def test_ze_info_is_parsed_per_kernel():
    kernels = gpu_native.parse_ze_info(ZE_INFO)
    fwd = kernels["_ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIfLi64ELi64ELi64ELi0EEEvNS_9FwdParamsE"]
    assert fwd == {"grf_count": "128", "simd_size": "32", "slm_size": "65536",
                   "spill_size": "640", "private_size": "2048"}
    assert set(kernels) == {*kernels} and len(kernels) == 2


MAIN_LOOP_ASM = """\
L0:
(W)     mov (1|M0)               r1.0<1>:d     0:w
L32:
(W)     mov (1|M0)               r7.5<1>:ud    16:w
        dpas.8x8 (16|M0)         r32:f         null:f            r23:bf            r11.0:bf         {$2}
        sync.nop                             null                             {$2.src}
L80:
        mul (16|M0)              r40.0<1>:f    r40.0<1;1,0>:f    r9.0<0;1,0>:f
(W&~f0.0) jmpi                               L80
        send.ugm (1|M0)          r11      r7  null:0  0x0            0x02400203           {$6} // wr:1+0, rd:4; load_block2d.ugm.d16.a64
        send.ugm (1|M0)          null     r8  null:0  0x0            0x02400203           {$7} // wr:1+0, rd:0; load_block2d.ugm.d16.a64.ca.ca
        dpas.8x8 (16|M0)         r48:f         r48:f            r25:bf            r12.0:bf         {$3}
(W&f0.1) jmpi                               L32
(W)     send.ugm (1|M0)          null     r2  null:0  0x0            0x0200F506
"""


def test_main_loop_cost_is_read_from_disassembly(tmp_path):
    """A kernel's one loop over blocks is its main loop; its issued instructions leave sync.*
    out, and the loops nested in it, its 2-D block loads and its prefetches are counted."""
    asm = tmp_path / "kernel.asm"
    asm.write_text(MAIN_LOOP_ASM)
    counts = gpu_native._asm_counts(asm)
    assert counts["dpas"] == 2 and counts["instructions"] == 11
    assert counts["loop_dpas"] == 2 and counts["loop_instructions"] == 9
    assert counts["loop_issued"] == 8 and counts["loop_nested"] == 1
    assert counts["loop_block_loads"] == 1 and counts["loop_prefetches"] == 1


DPAS_LINE = ("        dpas.8x8 (16|M0)         r32:f         r32:f            r23:bf"
             "            r11.0:bf         {$2}\n")
AND_LINE = "        and (16|M0)              r50.0<1>:d    r50.0<1;1,0>:d    1:w\n"


def loop(label, body):
    return f"L{label}:\n{body}(W&f0.0) jmpi                               L{label}\n"


def split_pass(label, general_extra):
    """A loop over query heads around run_blocks' three loops over blocks (general, lean,
    general; score/block_mask.hpp), each with two DPAS: the general ones with
    `general_extra` more instructions (the mask's and dropout's code) than the lean one."""
    general = loop(f"{label}1", DPAS_LINE * 2 + AND_LINE * (1 + general_extra))
    lean = loop(f"{label}2", DPAS_LINE * 2 + AND_LINE)
    return loop(f"{label}0", general + lean + general.replace(f"L{label}1", f"L{label}3"))


def test_lean_loop_is_the_main_loop(tmp_path):
    """run_blocks' lean loop is the main loop and its general loops the edge loop, inside a
    loop over query heads, over two passes (dK/dV past d = 64): the lean loop with the most
    DPAS, and the costliest general loop."""
    asm = tmp_path / "kernel.asm"
    asm.write_text(split_pass(1, 5) + split_pass(2, 9))
    counts = gpu_native._asm_counts(asm)
    assert (counts["loop_dpas"], counts["loop_issued"]) == (2, 4)  # 2 DPAS, and, jmpi
    assert (counts["edge_dpas"], counts["edge_issued"]) == (2, 13)  # the second pass's
    assert counts["loop_nested"] == 0
    # Without the split: the loop over blocks (one a pass) with the most DPAS, and no edge.
    asm.write_text(loop(1, DPAS_LINE * 2 + AND_LINE * 3) + loop(2, DPAS_LINE * 4))
    counts = gpu_native._asm_counts(asm)
    assert (counts["loop_dpas"], counts["loop_issued"], counts["edge_dpas"]) == (4, 5, 0)


def rescale_branch(label, muls, factor="r117", extra=""):
    """A forward branch over O's rescale: `muls` multiplies of accumulators by `factor` (the
    register forward's, forward/registers_kernel.hpp), IGC's move among them, and `extra`."""
    body = "".join(f"        mul (16|M0)              r{40 + i}.0<1>:f    {factor}.0<1;1,0>:f"
                   f"   r{40 + i}.0<1;1,0>:f\n" for i in range(muls))
    move = "        mov (16|M0)              r39.0<1>:f    acc0.0<1;1,0>:f\n"
    return (f"(W&f1.1) jmpi                                L{label}\n{body}{move}{extra}"
            f"L{label}:\n")


def test_rescale_branch_is_left_out_of_the_main_loop(tmp_path):
    """A block whose max does not rise skips O's rescale: the main loop's figure leaves the
    branch's multiplies out and loop_rescale counts them; a branch over anything else (a send,
    a multiply by another register, too few to be a rescale) stays in."""
    asm = tmp_path / "kernel.asm"
    asm.write_text(loop(1, DPAS_LINE * 2 + AND_LINE + rescale_branch(9, 8) + DPAS_LINE))
    counts = gpu_native._asm_counts(asm)
    assert (counts["loop_dpas"], counts["loop_issued"], counts["loop_rescale"]) == (3, 6, 9)
    send = "        send.ugm (1|M0)          r11      r7  null:0  0x0  0x02400203  {$6}\n"
    other = "        mul (16|M0)              r60.0<1>:f    r61.0<1;1,0>:f    r62.0<1;1,0>:f\n"
    for branch in (rescale_branch(9, 8, extra=send), rescale_branch(9, 8, extra=other),
                   rescale_branch(9, 7)):
        asm.write_text(loop(1, DPAS_LINE * 2 + AND_LINE + branch + DPAS_LINE))
        counts = gpu_native._asm_counts(asm)
        assert counts["loop_rescale"] == 0
        assert counts["loop_issued"] == 6 + branch.count("\n") - 2  # its label, its jmpi


@pytest.mark.parametrize("registered,mangled", [
    ("ipex_flash::flash_fwd_kernel<float, 64, 64, 64, 0>",
     "_ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIfLi64ELi64ELi64ELi0EEEvNS_9FwdParamsE"),
    ("ipex_flash::flash_fwd_kernel<ipex_flash::bfloat16_bits, 128, 64, 64, 3>",
     "_ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelINS_13bfloat16_bitsELi128ELi64ELi64ELi3EEEvNS_9FwdParamsE"),
    ("ipex_flash::flash_fwd_kernel<sycl::half, 64, 64, 64, 0>",
     "_ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIN4sycl3_V16detail9half_impl4halfELi64ELi64ELi64ELi0EEEvNS_9FwdParamsE"),
    ("ipex_flash::flash_bwd_pack_keys_kernel<ipex_flash::bfloat16_bits, 64, 64, 64, true>",
     "_ZN24__sycl_kernel_ipex_flash26flash_bwd_pack_keys_kernelINS_13bfloat16_bitsELi64ELi64ELi64ELb1EEEvNS_9BwdParamsE"),
])
def test_kernel_names_match_their_mangled_form(registered, mangled):
    assert gpu_grid.registered_key(registered) == gpu_grid.mangled_key(mangled)
    other = (registered.replace(", 64, 0>", ", 64, 1>").replace(", 3>", ", 2>")
             .replace("true>", "false>"))
    assert gpu_grid.registered_key(other) != gpu_grid.mangled_key(mangled)


def report(**figures):
    base = dict(target="bmg", family="forward", dtype="bfloat16", head_dim=64, features=0,
                rows=1, mode="auto", variant="v", kernel="ipex_flash::flash_fwd_kernel<...>",
                matrix=False, large_grf=False, slm_estimate=65536, slm_limit=131072, built=True, simd=16,
                grf=128, slm=65536)
    base.update(figures)
    return KernelReport(**base)


def test_score_changes_held_to_the_plain_forward():
    """The register forward with score changes against its plain kernel (same GPU, dtype and
    head dims), whole loops (O's rescale branch, 1.0 per DPAS here, counted in both): each
    change alone at most 1.3x its lean loop per DPAS and all three 1.5x, at d = 64 softcap
    alone 1.45x and all three 1.8x, at d = 64, 128 and 192; its spill beside ALiBi or a mask
    past d = 64 known only with none in the lean loop and few in its edge loop."""
    from ipex_flash.tools.gpu_rules import check_rules
    forward = dict(matrix=True, dpas=128, head_dim=128, large_grf=True, grf=256,
                   loop_rescale_per_dpas=1.0,
                   kernel="ipex_flash::flash_fwd_matrix_registers_kernel<...>")
    narrow = {**forward, "head_dim": 64}
    plain, plain_64 = report(loop_per_dpas=8.0, **forward), report(loop_per_dpas=8.0, **narrow)
    alone = [report(loop_per_dpas=10.7, features=f, **forward) for f in (1, 2, 4)]
    over = report(loop_per_dpas=10.8, features=2, **forward)
    every = report(loop_per_dpas=12.5, features=7, **forward)
    softcap_64 = report(loop_per_dpas=12.0, features=1, **narrow)
    softcap_64_over = report(loop_per_dpas=12.1, features=1, **narrow)
    alibi_64_over = report(loop_per_dpas=10.8, features=2, **narrow)
    every_64 = report(loop_per_dpas=15.2, features=7, **narrow)
    every_64_over = report(loop_per_dpas=15.3, features=7, **narrow)
    check_rules([plain, plain_64, *alone, over, every, softcap_64, softcap_64_over,
                 alibi_64_over, every_64, every_64_over])
    assert [r.violations for r in (plain, *alone, every, softcap_64, every_64)] == [[]] * 7
    assert over.violations == ["main loop issues 11.8 instructions per DPAS (rescale "
                               "included), 1.31x the plain kernel's 9.0 (at most 1.3x)"]
    assert softcap_64_over.violations == ["main loop issues 13.1 instructions per DPAS "
                                          "(rescale included), 1.46x the plain kernel's 9.0 "
                                          "(at most 1.45x)"]
    assert alibi_64_over.violations == ["main loop issues 11.8 instructions per DPAS "
                                        "(rescale included), 1.31x the plain kernel's 9.0 "
                                        "(at most 1.3x)"]
    assert every_64_over.violations == ["main loop issues 16.3 instructions per DPAS "
                                        "(rescale included), 1.81x the plain kernel's 9.0 "
                                        "(at most 1.8x)"]
    # Whole loops: 12.5 against 8.0 without the branch would be 1.56x; with it, 1.5x (above).
    # Held at d = 64, 128 and 192 only: elsewhere (the full grid's d = 32, 96, ...) reported.
    plain_32 = report(loop_per_dpas=16.4, **{**forward, "head_dim": 32})
    every_32 = report(loop_per_dpas=31.1, features=7, **{**forward, "head_dim": 32})
    plain_192 = report(loop_per_dpas=5.5, **{**forward, "head_dim": 192})
    every_192_over = report(loop_per_dpas=8.8, features=7, **{**forward, "head_dim": 192})
    check_rules([plain_32, every_32, plain_192, every_192_over])
    assert every_32.violations == []
    assert every_192_over.violations == ["main loop issues 9.8 instructions per DPAS "
                                         "(rescale included), 1.51x the plain kernel's 6.5 "
                                         "(at most 1.5x)"]
    fp8 = report(loop_per_dpas=12.5, features=64, **forward)
    fp8_over = report(loop_per_dpas=12.6, features=128, **forward)
    check_rules([plain, fp8, fp8_over])
    assert fp8.violations == []
    assert fp8_over.violations == ["main loop issues 13.6 instructions per DPAS over an FP8 "
                                   "cache, 1.51x the 16-bit kernel's 9.0 (at most 1.5x)"]
    spilled = dict(forward, features=7, spill=2112, edge_spills=13)
    assert kernel_violations(report(loop_per_dpas=11.0, **spilled)) == []
    assert kernel_violations(report(loop_per_dpas=8.0, **{**spilled, "features": 2})) == []
    assert kernel_violations(report(loop_per_dpas=11.0, loop_spills=2, **spilled)) == [
        "spills 2112 bytes"]
    assert kernel_violations(report(loop_per_dpas=11.0, **{**spilled, "edge_spills": 17})) == [
        "spills 2112 bytes"]
    assert kernel_violations(report(loop_per_dpas=11.0, **{**spilled, "spill": 2240})) == [
        "spills 2240 bytes"]
    assert kernel_violations(report(loop_per_dpas=9.0, **{**spilled, "features": 1})) == [
        "spills 2112 bytes"]  # softcap alone fits


def test_rules_flag_each_defect():
    assert kernel_violations(report()) == []
    assert kernel_violations(report(built=False, error="IGC crashed")) == ["not built: IGC crashed"]
    assert "spills 640 bytes" in kernel_violations(report(spill=640))
    assert "private memory 2048 bytes" in kernel_violations(report(private=2048))
    assert kernel_violations(report(spill=640, private=64, head_dim=80)) == []  # reported only
    assert any("> 131072" in v for v in kernel_violations(report(slm=139264, slm_estimate=139264)))
    assert any("estimate" in v for v in kernel_violations(report(slm=70000)))
    assert kernel_violations(report(matrix=True)) == ["XMX variant without DPAS"]
    assert kernel_violations(report(matrix=True, dpas=64, loop_per_dpas=14.9)) == []
    assert kernel_violations(report(matrix=True, dpas=64)) == ["main loop not measured"]
    probe = dict(matrix=True, kernel="ipex_flash::matrix_layout_probe_kernel<...>")
    assert kernel_violations(report(dpas=4, private=1024, **probe)) == []
    assert kernel_violations(report(**probe)) == ["XMX variant without DPAS"]
    registers = dict(matrix=True, dpas=128, head_dim=128, loop_rescale_per_dpas=1.0,
                     kernel="ipex_flash::flash_fwd_matrix_registers_kernel<...>")
    assert kernel_violations(report(loop_per_dpas=8.1, **registers)) == [
        "main loop issues 8.1 instructions per DPAS (at most 8.0)"]
    assert kernel_violations(report(loop_per_dpas=30.5, **{**registers, "features": 7})) == []
    assert kernel_violations(report(loop_per_dpas=7.9, **registers)) == []
    narrow = {**registers, "head_dim": 64}
    assert kernel_violations(report(loop_per_dpas=9.9, **narrow)) == []
    assert kernel_violations(report(loop_per_dpas=10.1, **narrow)) == [
        "main loop issues 10.1 instructions per DPAS (at most 10.0)"]
    eight_wide = {**registers, "head_dim": 64, "simd": 8, "grf": 128}  # DG2, Arrow Lake-H
    unfound = {**eight_wide, "loop_rescale_per_dpas": 0.0}
    assert kernel_violations(report(loop_per_dpas=20.9, **unfound)) == [
        "O's rescale not found in a branch of the main loop"]
    assert kernel_violations(report(loop_per_dpas=20.9, **eight_wide)) == []
    assert kernel_violations(report(loop_per_dpas=21.1, **eight_wide)) == [
        "main loop issues 21.1 instructions per DPAS (at most 21.0)"]
    for kernel in ("flash_bwd_dq_matrix_registers_kernel", "flash_bwd_dkdv_matrix_registers_kernel"):
        backward = {**narrow, "family": "backward", "kernel": f"ipex_flash::{kernel}<...>"}
        assert kernel_violations(report(loop_per_dpas=13.5, **backward)) == [
            "main loop issues 13.5 instructions per DPAS (at most 11.0)"]
        assert kernel_violations(report(loop_per_dpas=10.9, **backward)) == []
        assert kernel_violations(report(loop_per_dpas=75.7, **{**backward, "features": 7})) == []
    # dQ at d = 128 has a limit of its own; dK/dV there the backward's.
    dq_128 = {**registers, "family": "backward",
              "kernel": "ipex_flash::flash_bwd_dq_matrix_registers_kernel<...>"}
    assert kernel_violations(report(loop_per_dpas=8.4, **dq_128)) == []
    assert kernel_violations(report(loop_per_dpas=8.6, **dq_128)) == [
        "main loop issues 8.6 instructions per DPAS (at most 8.5)"]
    dkdv_128 = {**dq_128, "kernel": "ipex_flash::flash_bwd_dkdv_matrix_registers_kernel<...>"}
    assert kernel_violations(report(loop_per_dpas=10.9, **dkdv_128)) == []
    dq_eight_wide = {**eight_wide, "family": "backward",
                     "kernel": "ipex_flash::flash_bwd_dq_matrix_registers_kernel<...>"}
    assert kernel_violations(report(loop_per_dpas=21.5, **dq_eight_wide)) == []
    assert kernel_violations(report(loop_per_dpas=22.5, **dq_eight_wide)) == [
        "main loop issues 22.5 instructions per DPAS (at most 22.0)"]
    dkdv_eight_wide = {**dq_eight_wide,
                       "kernel": "ipex_flash::flash_bwd_dkdv_matrix_registers_kernel<...>"}
    assert kernel_violations(report(loop_per_dpas=26.8, **dkdv_eight_wide)) == []
    assert kernel_violations(report(loop_per_dpas=27.5, **dkdv_eight_wide)) == [
        "main loop issues 27.5 instructions per DPAS (at most 27.0)"]
    # With score changes its blocks split (lean loop): limits of their own, for one change and
    # for several; a float mask (of any dtype) past d = 64 keeps one loop, not held to one.
    for features, head_dim in ((1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (32, 64), (1, 128),
                               (2, 128), (4, 128)):
        changed = {**dkdv_eight_wide, "features": features, "head_dim": head_dim}
        assert kernel_violations(report(loop_per_dpas=39.5, **changed)) == []
        assert kernel_violations(report(loop_per_dpas=40.5, **changed)) == [
            "main loop issues 40.5 instructions per DPAS (at most 40.0)"]
    for features, head_dim in ((6, 64), (7, 64), (7, 128), (3, 128)):
        changes = {**dkdv_eight_wide, "features": features, "head_dim": head_dim}
        assert kernel_violations(report(loop_per_dpas=59.5, **changes)) == []
        assert kernel_violations(report(loop_per_dpas=60.5, **changes)) == [
            "main loop issues 60.5 instructions per DPAS (at most 60.0)"]
    for features, head_dim in ((8, 128), (9, 128), (10, 128), (16, 128), (32 | 2, 128),
                               (64, 64)):
        one_loop = {**dkdv_eight_wide, "features": features, "head_dim": head_dim}
        assert kernel_violations(report(loop_per_dpas=77.0, **one_loop)) == []
    assert kernel_violations(report(matrix=True, kernel="ipex_flash::flash_fwd_pack_kv_kernel<>")) == []
    assert kernel_violations(report(large_grf=True)) == [
        "large register file asked for, 128 registers given"]
    assert kernel_violations(report(large_grf=True, grf=256)) == []
    # The known spills (gpu_rules.py) are reported only where they are known, and only for them.
    # The first: the 16-bit one-row decode with softcap or ALiBi on the 128-register GPUs, up
    # to 896 bytes.
    decode = dict(family="decode", kernel="ipex_flash::flash_decode_kernel<...>", rows=1,
                  features=7, spill=640)
    assert kernel_violations(report(target="dg2", **decode)) == []
    assert kernel_violations(report(target="mtl", **{**decode, "features": 2})) == []
    assert kernel_violations(report(target="bmg", **decode)) == ["spills 640 bytes"]
    assert kernel_violations(report(target="dg2", **{**decode, "features": 0})) == [
        "spills 640 bytes"]
    assert kernel_violations(report(target="dg2", **{**decode, "rows": 8})) == [
        "spills 640 bytes"]
    assert kernel_violations(report(target="arl-h", **{**decode, "dtype": "float32"})) == [
        "spills 640 bytes"]
    assert kernel_violations(report(target="dg2", **{**decode, "spill": 832})) == []
    assert kernel_violations(report(target="dg2", **{**decode, "spill": 960})) == [
        "spills 960 bytes"]
    # The second: the fp32 d=128 forward with every score change, on MTL and ARL-H only.
    forward = dict(family="forward", kernel="ipex_flash::flash_fwd_kernel<...>", dtype="float32",
                   head_dim=128, features=7, spill=160)
    assert kernel_violations(report(target="mtl", **forward)) == []
    assert kernel_violations(report(target="dg2", **forward)) == ["spills 160 bytes"]
    assert kernel_violations(report(target="mtl", **{**forward, "features": 5})) == [
        "spills 160 bytes"]
    # The third: the 8-wide register dK/dV with a score change, up to d = 128: 160 bytes, or
    # 1024 with none of it in the lean loop or the costliest edge loop.
    dkdv_mask = dict(family="backward", head_dim=64, features=8, spill=64,
                     kernel="ipex_flash::flash_bwd_dkdv_matrix_registers_kernel<...>")
    assert kernel_violations(report(target="dg2", **dkdv_mask)) == []
    assert kernel_violations(report(target="arl-h", **{**dkdv_mask, "features": 32})) == []
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "head_dim": 128,
                                                     "features": 1, "spill": 160,
                                                     "loop_spills": 2})) == []
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "spill": 960})) == []
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "spill": 192,
                                                     "loop_spills": 1})) == ["spills 192 bytes"]
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "spill": 192,
                                                     "edge_spills": 17})) == ["spills 192 bytes"]
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "spill": 1088})) == [
        "spills 1088 bytes"]
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "features": 0})) == [
        "spills 64 bytes"]
    assert kernel_violations(report(target="bmg", **dkdv_mask)) == ["spills 64 bytes"]
    assert kernel_violations(report(target="dg2", **{**dkdv_mask, "kernel": "ipex_flash::"
                                                     "flash_bwd_dq_matrix_registers_kernel<...>"})) == [
        "spills 64 bytes"]
    # A head dim the host refuses for the GPU's local memory, with an error naming both, is
    # reported as refused; any other failure to build is not.
    refusal = ("ipex_flash: no backward kernel for head dim 512 on dg2 (Arc A-series): its 64 KiB"
               " of local memory per work-group (65536 bytes) fits head dims up to 480")
    assert kernel_violations(report(built=False, error=refusal, head_dim=512)) == []
    assert kernel_violations(report(built=False, error="ocloc: no kernel for head dim 512")) == [
        "not built: ocloc: no kernel for head dim 512"]
    # Any other spill fails: the register dQ kernel's at d=128, and the register dK/dV
    # kernel's at d=128 with softcap, among them.
    dq = dict(family="backward", kernel="ipex_flash::flash_bwd_dq_matrix_registers_kernel<...>",
              head_dim=128, spill=704)
    assert kernel_violations(report(target="bmg", **dq)) == ["spills 704 bytes"]
    assert kernel_violations(report(target="pvc", **{**dq, "spill": 576})) == ["spills 576 bytes"]
    dkdv = dict(family="backward", kernel="ipex_flash::flash_bwd_dkdv_matrix_registers_kernel<...>",
                head_dim=128, features=7, spill=512)
    assert kernel_violations(report(target="pvc", **dkdv)) == ["spills 512 bytes"]
    assert kernel_violations(report(target="lnl", **{**dkdv, "features": 1, "spill": 128})) == [
        "spills 128 bytes"]


ALL_GPUS = ["pvc", "bmg", "dg2", "lnl", "mtl", "arl-h"]


def run_gpu_check(arguments: list, result_path: str | None = None) -> list:
    """Runs gpu-check with `arguments`, asserts that it passed, and returns its kernels."""
    ocloc = gpu_native.find_ocloc()
    assert ocloc, "ocloc is missing: scripts/setup/setup_env.sh installs it (scripts/setup/install_ocloc.sh)"
    with tempfile.TemporaryDirectory() as work:
        result_path = result_path or os.path.join(work, "gpu_check.json")
        result = subprocess.run(
            [sys.executable, "-m", "ipex_flash", "gpu-check", *arguments, "--json", result_path],
            capture_output=True, text=True, cwd=work, timeout=3600)
        # The kernels that break a rule first: the table's tail alone may not show them.
        broken = [line for line in result.stdout.splitlines() if "FAIL" in line]
        assert result.returncode == 0, ("\n".join(broken[:40]) + "\n...\n" +
                                        result.stdout[-3000:] + result.stderr[-3000:])
        return json.load(open(result_path))["kernels"]


@pytest.mark.parametrize("targets", [
    pytest.param(["bmg"], id="bmg"),
    pytest.param([t for t in ALL_GPUS if t != "bmg"], id="pvc-dg2-lnl-mtl-arl-h",
                 marks=pytest.mark.full)])
def test_every_gpu_passes_gpu_check(targets):
    """The gate: every variant of the quick grid (head dims 64 and 128, every dtype, family,
    feature set and matrix mode) for each GPU builds, fits, does not spill, has no private
    memory, and its XMX kernels contain DPAS. The default tier checks BMG (XMX 16 lanes wide,
    256 registers, the register kernels); the full tier the other five, among them DG2 and
    Arrow Lake-H (8-wide XMX, 128 registers), whose kernels' data flow the default tier runs
    emulated (emulate8)."""
    # IPEX_FLASH_GPU_CHECK_JSON keeps the figures (scripts/records/gpu_status_table.py reads them).
    kernels = run_gpu_check(["--targets", ",".join(targets)],
                            os.environ.get("IPEX_FLASH_GPU_CHECK_JSON"))
    for target in targets:
        mine = [k for k in kernels if k["target"] == target]
        assert {k["family"] for k in mine} == {"forward", "backward", "decode", "dropout_mask",
                                              "cache_check", "kv_append"}
        assert all(k["built"] and not k["violations"] for k in mine)
        xmx = [k for k in mine if k["matrix"] and k["dpas"] > 0]
        assert bool(xmx) == (target != "mtl"), target  # DG2, ARL-H: the 8-wide kernels


def test_pvc_xmx_kernels_pass_gpu_check():
    """PVC's XMX forward and backward (bfloat16, head dims 64 and 128, every feature set) hold
    the rules in the default tier, the main-loop cost per DPAS among them: PVC builds BMG's
    programs, so after BMG's check this costs only PVC's ocloc runs. The full tier checks the
    rest of PVC's grid."""
    kernels = run_gpu_check(["--targets", "pvc", "--families", "forward,backward",
                             "--dtypes", "bfloat16"])
    assert {(k["target"], k["family"], k["dtype"]) for k in kernels} == {
        ("pvc", "forward", "bfloat16"), ("pvc", "backward", "bfloat16")}
    assert all(k["built"] and not k["violations"] for k in kernels)
    measured = [k for k in kernels if k["loop_per_dpas"] > 0]
    assert {64, 128} <= {k["head_dim"] for k in measured}
    assert any("dq_matrix_registers" in k["kernel"] for k in measured)
    assert any("dkdv_matrix_registers" in k["kernel"] for k in measured)
    assert any("fwd_matrix_registers" in k["kernel"] for k in measured)


def test_grid_filters_keep_only_the_named_families_and_dtypes():
    """gpu-check --families/--dtypes: the plan keeps exactly the calls asked for."""
    everything = gpu_grid.plan_target("bmg", False)
    kept = gpu_grid.plan_target("bmg", False, ["decode"], ["float32"])
    assert kept and {(p.family, p.dtype) for p in kept} == {("decode", "float32")}
    assert [p.kernels for p in kept] == [p.kernels for p in everything
                                         if p.family == "decode" and p.dtype == "float32"]


def test_a_filter_that_keeps_nothing_is_an_error(capsys):
    """float16 is in the --full grid only: asking the quick grid for it checks nothing, which
    must not pass as a check."""
    from ipex_flash.tools import gpu_check
    assert gpu_check.run(["bmg"], dtypes=["float16"]) == 2
    assert "no calls" in capsys.readouterr().err
