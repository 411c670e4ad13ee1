"""python -m ipex_flash plan: which kernel a call gets, and why it does not get a faster one.

For a call's dtype, head dims and options on a target (a GPU profile, sycl_src/host/variants/
gpu_profiles.cpp, or this machine's device), it prints the kernel form the variant policy picks
(vector units, or the matrix engine with its tiles staged through local memory or kept in
registers; the decode kernel's matrix or vector scores), its program (device header, kernel
names, build options), and the reason for each faster form it passed over, as the policy
records them (C.plan's "reasons": sycl_src/host/variants/skip_reasons.hpp). On this machine's
device the call's run-time fallbacks count too (a matrix program the device's compiler cannot
build, an engine that fails the tile-layout check), with the reasons their warnings give.
"""
from __future__ import annotations

import json
import os
import sys

import torch

from ipex_flash._runtime import C
from ipex_flash.ops import launch

DTYPES = ("float32", "float16", "bfloat16")
MATRIX_MODES = ("auto", "0", "1", "8", "16", "emulate", "emulate8")
MASK_DTYPES = ("bool", "float32", "float16", "bfloat16")
# The KV cache's element type: q's, or FP8 (FEATURE_KV_E4M3, _E5M2: common/features.hpp)
KV_DTYPES = {"same": 0, "float8_e4m3fn": 64, "float8_e5m2": 128}
FP8_CACHE = 64 | 128


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=None, choices=[*C.profile_names(), "cpu", "xpu"],
                        help="a GPU profile, or cpu / xpu for this machine's device (default: "
                             "xpu where torch has one, else cpu)")
    parser.add_argument("--direction", choices=("forward", "backward", "decode"),
                        default="forward",
                        help="forward: a call of many query rows (prefill, training); "
                             "backward: its gradients; decode: a KV-cache step of "
                             "--new-tokens per sequence")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    parser.add_argument("--head-dim", type=int, default=128, help="q's and k's")
    parser.add_argument("--head-dim-v", type=int, default=0, help="v's, where it differs")
    parser.add_argument("--causal", action="store_true",
                        help="(as windows, a run-time option: no other program)")
    parser.add_argument("--softcap", action="store_true", help="a softcap (Gemma 2)")
    parser.add_argument("--alibi", action="store_true", help="ALiBi slopes")
    parser.add_argument("--mask", nargs="?", const="bool", choices=MASK_DTYPES,
                        help="a user's attn_mask (bool unless a float dtype is named)")
    parser.add_argument("--gqa", type=int, default=1, metavar="GROUP",
                        help="query heads per K/V head")
    parser.add_argument("--kv-heads", type=int, default=8, help="K/V heads (decode)")
    parser.add_argument("--new-tokens", type=int, default=1, help="query tokens per sequence "
                        "of a decode step")
    parser.add_argument("--kv-dtype", choices=tuple(KV_DTYPES), default="same",
                        help="the KV cache's dtype (forward and decode): q's, or FP8 with a "
                             "16-bit q")
    parser.add_argument("--matrix", choices=MATRIX_MODES, default=None,
                        help="IPEX_FLASH_MATRIX for this call (default: the environment's, "
                             "else auto)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def call_features(args) -> int:
    """The FEATURE_* bits of the call, as C++ derives them from a call's options."""
    options = C.AttentionOptions()
    options.softcap = 1.0 if args.softcap else 0.0
    if args.alibi:
        options.alibi_slopes = C.TensorView(0, "float32", [1], [1])
    if args.mask:
        options.attn_mask = C.TensorView(0, args.mask, [1, 1, 1, 1], [0, 0, 0, 0])
    kv_bits = KV_DTYPES[args.kv_dtype]
    if kv_bits and (args.dtype == "float32" or args.direction == "backward"):
        raise ValueError(f"--kv-dtype {args.kv_dtype}: FP8 caches take float16 or bfloat16 "
                         f"queries, forward or decode (no backward), not {args.dtype} "
                         f"{args.direction}")
    return C.features_of(options, C.TensorView(0, args.dtype, [1, 1, 1, 1], [1, 1, 1, 1])) | \
        kv_bits


def make_plan(args) -> dict:
    """The plan of the call args describe: C.plan's dict (variant, header, kernels, options,
    reasons), with "kernel" naming the kernel form and "target" what it was planned for."""
    mode = args.matrix or os.environ.get("IPEX_FLASH_MATRIX") or "auto"
    target = args.target or launch.default_device().type
    head_dim_v = args.head_dim_v or args.head_dim
    widest = max(args.head_dim, head_dim_v)
    features = call_features(args)
    family, rows, reasons = args.direction, 1, []
    on_device = target in ("cpu", "xpu")
    if family == "decode":
        rows = args.gqa * args.new_tokens
        served, reasons = C.decode_serves_rows(rows, args.new_tokens, args.kv_heads)
        if served:  # (and the decode kernel's local memory at this head dim)
            served, reasons = C.decode_fits(
                args.dtype, widest, rows, features, "" if on_device else target,
                launch.queue_handle(torch.device(target)) if on_device else 0)
        if served and features & FP8_CACHE and not on_device and \
                not C.profile_limits(target)["fp8_decode"]:
            served, reasons = False, [f"FP8 cache on {target}: its decode kernel's conversions "
                                      "spilled the 128 registers (docs/gpus.md): the general "
                                      "forward kernel serves it"]
        if not served:
            family = "forward"
        elif head_dim_v != args.head_dim:
            features |= C.FEATURE_VALUE_DIM
    # The forward compiles v's head dim apart where it differs, and so does the decode kernel's
    # register form (MLA); the others run at the larger.
    head_dim = args.head_dim if family == "forward" else widest
    dims = dict(head_dim=head_dim, features=features, rows=rows,
                head_dim_v=head_dim_v if family in ("forward", "decode") else 0)
    if on_device:
        if args.matrix:
            os.environ["IPEX_FLASH_MATRIX"] = args.matrix  # (read by C++ on each call)
        queue = launch.queue_handle(torch.device(target))
        plan = C.device_plan(family, args.dtype, **dims, queue=queue)
        where = f"{target} ({C.device_info(queue)['name']})"
    else:
        plan = C.plan(family, target, args.dtype, mode=mode, **dims)
        where = f"the {target} profile"
    plan["reasons"] = reasons + plan["reasons"]
    plan["kernel"] = describe(family, plan["variant"])
    plan["target"] = where
    plan["matrix_mode"] = mode
    return plan


def describe(family: str, v) -> str:
    """The kernel form of a variant, in words."""
    if family == "decode":
        if v.matrix_registers:  # decode/xmx_kernel.hpp
            groups = f", {v.value_split} sub-groups" if v.value_split > 1 else ""
            return (f"split-KV decode kernel, register form ({_tiles(v)}: Q.K^T and P.V on the "
                    f"matrix engine{groups}), {v.block_n} keys per block")
        scores = "vector scores" if v.matrix_m == 0 else f"matrix scores ({_tiles(v)})"
        return f"split-KV decode kernel, {scores}, {v.block_n} keys per block"
    blocks = f"{v.block_m} query rows x {v.block_n} keys per block"
    kernel = "general forward kernel" if family == "forward" else "backward kernels"
    if v.matrix_m == 0:
        slabs = f", K and V {v.kv_cols} columns at a time" if v.kv_cols else ""
        return f"{kernel} on the vector units, {blocks}{slabs}"
    if family == "forward":
        form = "tiles in registers" if v.matrix_registers else \
            "tiles staged through local memory"
        if v.value_split > 1:
            form += f", O split across {v.value_split} sub-groups"
    else:
        kept = {True: "in registers", False: "staged through local memory"}
        form = f"dQ and dK/dV tiles {kept[v.matrix_registers]}" \
            if v.matrix_registers == v.dkdv_registers else \
            f"dQ tiles {kept[v.matrix_registers]}, dK/dV tiles {kept[v.dkdv_registers]}"
    return f"{kernel} on the matrix engine ({_tiles(v)}), {form}, {blocks}"


def _tiles(v) -> str:
    emulated = ", emulated" if v.matrix_emulated else ""
    return f"{v.matrix_m}x{v.matrix_n}x{v.matrix_k} tiles{emulated}"


def main(args) -> int:
    try:
        plan = make_plan(args)
    except ValueError as e:  # a call the options cannot describe (FP8 with float32 q)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        v = plan["variant"]
        variant = {name: getattr(v, name) for name in dir(v) if not name.startswith("_")}
        print(json.dumps(dict(plan, variant=variant), indent=1, default=str))
        return 0
    options = [name for name in ("causal", "softcap", "alibi") if getattr(args, name)]
    options += [f"{args.mask} mask"] if args.mask else []
    options += [f"{args.kv_dtype} cache"] if args.kv_dtype != "same" else []
    head_dims = f"head dim {args.head_dim}" + (
        f", v's {args.head_dim_v}" if args.head_dim_v not in (0, args.head_dim) else "")
    call = ", ".join([args.direction, args.dtype, head_dims] + options)
    if args.direction == "decode":
        call += f"; {args.gqa * args.new_tokens} query rows per K/V head, {args.kv_heads} K/V heads"
    print(f"call: {call}")
    print(f"on: {plan['target']} (IPEX_FLASH_MATRIX={plan['matrix_mode']})")
    print(f"kernel: {plan['kernel']}")
    print(f"program: {plan['header']}")
    for kernel in plan["kernels"]:
        print(f"  {kernel}")
    print(f"build options: {' '.join(plan['options']) or '(none)'}")
    print(f"local memory: {plan['slm_bytes']} bytes per work-group")
    print("faster forms skipped:" + ("" if plan["reasons"] else " none"))
    for reason in plan["reasons"]:
        print(f"  - {reason}")
    return 0
