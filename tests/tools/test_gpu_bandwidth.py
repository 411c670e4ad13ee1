"""gpu-check's decode figures against memory bandwidth (ipex_flash/tools/gpu_bandwidth.py): what
each GPU profile affords per KiB of K/V, from its published clock, vector engines and memory
bandwidth (the expected figures worked out by hand here), the K/V a key block reads, the
decode kernel's loop over blocks read from made-up disassembly, and the rule's verdict."""
import pytest

from ipex_flash._runtime import C
from ipex_flash.tools import gpu_bandwidth, gpu_native
from ipex_flash.tools.gpu_check import KernelReport


@pytest.mark.parametrize("target,simd,expected", [
    # 160 engines x 2670 MHz / (456 GB/s / 1024) = 427.2e9 / 445.3125e6
    ("bmg", 16, 959.3),
    # 448 x 1550 MHz / (1228.8 GB/s / 1024) = 694.4e9 / 1.2e9
    ("pvc", 16, 578.7),
    # 512 x 2100 MHz / (560 GB/s / 1024): SIMD16 on 8-lane ALUs issues every other clock
    ("dg2", 16, 983.0),
    ("dg2", 8, 1966.1),
    # 64 x 1950 MHz / (136.5 GB/s / 1024)
    ("lnl", 16, 936.2),
    # 128 x 2250 MHz / 2 / (119.5 GB/s / 1024)
    ("mtl", 16, 1234.0),
    # 128 x 2350 MHz / 2 / (134.4 GB/s / 1024)
    ("arl-h", 16, 1145.9),
])
def test_each_gpu_affords_its_clock_over_its_bandwidth(target, simd, expected):
    limits = C.profile_limits(target)
    assert gpu_bandwidth.affordable_per_kib(limits, simd) == pytest.approx(expected, abs=0.1)


def test_the_cpu_device_has_no_budget():
    """No published figures, no budget (and no verdict), rather than a made-up one."""
    assert gpu_bandwidth.affordable_per_kib(C.device_limits(), 16) == 0.0


def decode_report(**fields):
    base = dict(target="bmg", family="decode", dtype="bfloat16", head_dim=128, features=0,
                rows=8, mode="auto", variant="", matrix=False, large_grf=True,
                slm_estimate=0, slm_limit=131072, built=True, simd=16,
                kernel="ipex_flash::flash_decode_kernel<ipex_flash::bfloat16_bits, 128, 8, 64, 0,"
                       " 0, 0, 16>")
    return KernelReport(**{**base, **fields})


@pytest.mark.parametrize("fields,kib", [
    ({}, 64 * 256 * 2 / 1024),  # 64 keys, K and V of 128 columns, 2 bytes
    ({"features": 64}, 64 * 256 / 1024),  # an FP8 cache: a byte each
    ({"dtype": "float32", "head_dim": 64,
      "kernel": "ipex_flash::flash_decode_kernel<float, 64, 8, 32, 0, 0, 0, 16>"},
     32 * 128 * 4 / 1024),
    ({"head_dim": 192, "head_dim_v": 128}, 64 * 320 * 2 / 1024),
    # MLA's one latent cache: 576 columns read once, V its first 512
    ({"head_dim": 576, "head_dim_v": 512, "features": C.FEATURE_VALUE_DIM}, 64 * 576 * 2 / 1024),
])
def test_a_key_block_reads_its_keys_columns_in_the_caches_dtype(fields, kib):
    assert gpu_bandwidth.kv_kib_per_block(decode_report(**fields)) == kib


def loop(label, body):
    return f"L{label}:\n{body}(W&f0.0) jmpi                               L{label}\n"


ADD = "        add (16|M0)              r50.0<1>:d    r50.0<1;1,0>:d    1:w\n"
DPAS = ("        dpas.8x8 (16|M0)         r32:f         r32:f            r23:bf"
        "            r11.0:bf         {$2}\n")
SYNC = "        sync.nop                             null                             {$2.src}\n"


def test_the_block_loop_is_the_outermost_loop_with_loops_inside_issuing_the_most(tmp_path):
    """No DPAS needed: of the outermost loops with loops inside them (the loop over the
    work-group's heads) the one issuing the most (sync.* left out), not a heavier loop with
    none inside (the append's), with the loops nested in it counted; DPAS first."""
    asm = tmp_path / "kernel.asm"
    heads = loop(3, ADD * 12) + loop(4, ADD * 3)
    asm.write_text(loop(1, ADD * 40) + loop(2, ADD * 10 + SYNC * 40 + heads) +
                   loop(5, ADD * 2 + loop(6, ADD)) + loop(7, ADD * 5))
    counts = gpu_native._asm_counts(asm)
    assert (counts["block_issued"], counts["block_nested"]) == (10 + 13 + 4 + 1, 2)
    asm.write_text(loop(1, ADD * 40) + loop(2, ADD * 10 + heads) + loop(5, ADD + DPAS))
    assert gpu_native._asm_counts(asm)["block_issued"] == 3  # add, dpas, jmpi
    asm.write_text(ADD * 8)
    assert gpu_native._asm_counts(asm)["block_issued"] == 0


def test_a_split_walk_over_blocks_is_read_at_its_lean_loop(tmp_path):
    """The register form walks its blocks as run_blocks does (general, lean, general loops,
    each with DPAS): its block loop is the lean one, which runs all but a split's edge blocks,
    not the costlier general loops."""
    asm = tmp_path / "kernel.asm"
    general = loop(1, DPAS * 2 + ADD * 30)
    lean = loop(2, DPAS * 2 + ADD * 4)
    asm.write_text(general + lean + general.replace("L1", "L3"))
    counts = gpu_native._asm_counts(asm)
    assert (counts["block_issued"], counts["block_nested"]) == (2 + 4 + 1, 0)
    assert counts["edge_issued"] == 2 + 30 + 1


def test_the_register_forms_key_block_is_its_fourth_argument():
    kernel = ("ipex_flash::flash_decode_xmx_kernel<ipex_flash::bfloat16_bits, 128, 16, 32, 0, "
              "8, 16, 16>")
    assert gpu_bandwidth.decode_block_keys(kernel) == 32
    assert gpu_bandwidth.kv_kib_per_block(decode_report(kernel=kernel)) == 32 * 256 * 2 / 1024


def test_split_work_groups_count_every_sub_groups_loop():
    """The register form's work-group of SUBGROUPS sub-groups (its last argument) runs the block
    loop once in each: MLA's 16-row decode, 8 sub-groups over 256 keys of one latent cache
    (576 columns, V its first 512, read once)."""
    kernel = ("ipex_flash::flash_decode_xmx_kernel<ipex_flash::bfloat16_bits, 576, 16, 256, "
              "256, 8, 16, 16, 512, 8>")
    assert gpu_bandwidth.decode_subgroups(kernel) == 8
    r = decode_report(kernel=kernel, head_dim=576, head_dim_v=512, block_issued=4000)
    gpu_bandwidth.measure(r, C.profile_limits("pvc"))
    assert r.kv_kib == 256 * 576 * 2 / 1024
    assert r.issued_per_kib == round(8 * 4000 / r.kv_kib, 1)
    one = "ipex_flash::flash_decode_xmx_kernel<ipex_flash::bfloat16_bits, 128, 8, 64, 0, 8, 16, 16>"
    assert gpu_bandwidth.decode_subgroups(one) == 1
    assert gpu_bandwidth.decode_subgroups(
        "ipex_flash::flash_decode_kernel<float, 128, 1, 16, 0, 0, 0, 16>") == 1


def test_the_rule_weighs_a_blocks_instructions_against_half_the_budget():
    limits = C.profile_limits("bmg")  # affords 959.3 per KiB at SIMD16: half is 479.7
    within = decode_report(block_issued=int(32 * 470))  # 32 KiB a block
    over = decode_report(block_issued=int(32 * 490), block_nested=3)
    for r in (within, over):
        gpu_bandwidth.measure(r, limits)
    assert (within.kv_kib, within.issued_per_kib) == (32.0, 470.0)
    assert within.affordable_per_kib == pytest.approx(959.3, abs=0.1)
    assert not gpu_bandwidth.over_budget(within) and gpu_bandwidth.over_budget(over)
    other = decode_report(kernel="ipex_flash::flash_decode_merge_kernel<float, 128>",
                          block_issued=5000)
    gpu_bandwidth.measure(other, limits)
    assert other.issued_per_kib == 0 and not gpu_bandwidth.over_budget(other)


def test_a_cores_local_memory_holds_so_many_decode_work_groups():
    assert gpu_bandwidth.groups_per_core(decode_report(slm=45376)) == 2  # of 128 KiB
    assert gpu_bandwidth.groups_per_core(decode_report(slm=32768)) == 4
    assert gpu_bandwidth.groups_per_core(decode_report(slm=40000, slm_limit=65536)) == 1
