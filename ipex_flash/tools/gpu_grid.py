"""The calls gpu-check plans for each GPU, and the kernel programs they select.

The grid reaches every kernel: forward (vector, and matrix with its K/V pack where the GPU
takes XMX tiles), backward (preprocess, dK/dV, dQ; matrix dK/dV and dQ with their packing),
decode (split and merge) and the dropout mask, over float32/float16/bfloat16, head-dim buckets
and the compile-time score features, and the decode and forward kernels over FP8 caches.
Variants are chosen by the host module from the target's device-limits record, the same code
that chooses for a real device (C.plan). The KV-cache append has no kernel of its own (it is a
tensor copy in ipex_flash/kvcache/cache_ops.py), so it has nothing to compile.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from ipex_flash._runtime import C

DTYPES = ["float32", "float16", "bfloat16"]
COMMON_HEAD_DIMS = [64, 128]  # the rules on spills and scratch memory apply to these
# one per bucket, and past 256 sizes off the tiles' powers of two up to v's limit (C.MAX_HEAD_DIM)
ALL_HEAD_DIMS = [16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 448, 512]
# bits: 1 softcap, 2 ALiBi, 4 bool attn_mask, 8 float32 attn_mask (common/features.hpp
# FEATURE_*); the quick grid's 7 puts every score change in one kernel, the most registers any
# variant needs.
FEATURE_SETS = {"quick": [0, 7], "full": [0, 1, 2, 3, 4, 7, 8]}
# Each score change alone, in the quick grid the 16-bit forward only: its register kernel is
# held to the plain one's cost per change (gpu_rules.MAX_SCORE_CHANGE_RATIO).
FORWARD_SCORE_CHANGES = {"quick": [1, 2, 4], "full": []}
DECODE_ROWS = {"quick": [1, 8], "full": [1, 2, 4, 8, 16]}  # query rows per K/V head
# V's head dim apart from Q's and K's (MLA prefill: D = 192, Dv = 128), in both grids: the
# forward's register kernel compiles it apart, and its O^T accumulators must fit beside Q^T's
# reads at D; the vector kernel (float32) compiles it apart too. (D, Dv) pairs.
VALUE_HEAD_DIMS = {"quick": [(192, 128)],
                   "full": [(192, 128), (256, 128), (96, 160), (512, 256), (576, 512)]}
# MLA decode (DeepSeek V2/V3, Kimi K2) over its one latent cache: q and k 576 (a 512-column
# latent and 64 rope columns), v the latent (FEATURE_VALUE_DIM); one K/V head, whose query
# heads are the decode kernel's rows (16 per rank with 128 heads over 8 GPUs). (D, Dv, rows);
# the quick grid bfloat16 only, the full one every dtype and FP8 caches.
MLA_DECODE = {"quick": [(576, 512, 16)], "full": [(576, 512, 1), (576, 512, 16)]}
# FP8 KV caches (64 e4m3, 128 e5m2; common/kv_quant.hpp) with 16-bit queries: the decode kernel and
# the forward (matrix, with a pack that converts the cache, where the GPU takes XMX tiles).
FP8_FEATURE_SETS = {"quick": [64], "full": [64, 128, 64 | 7]}
# The decode kernel appending flash_attn_with_kvcache's new tokens itself (FEATURE_APPEND),
# and rotating them and the queries (FEATURE_ROTARY_F32: float32 tables, _INPUT: q's dtype).
APPEND, ROTARY_F32, ROTARY_INPUT = 1024, 2048, 4096


@dataclass
class Selection:
    """A call planned for a target, and what the host chose for it."""
    target: str
    family: str         # forward, backward, decode, dropout_mask, cache_check, kv_append
    dtype: str
    head_dim: int
    features: int       # FEATURE_* bits, see FEATURE_SETS
    rows: int           # decode: query rows per K/V head
    mode: str           # IPEX_FLASH_MATRIX mode the variant was chosen under
    variant: str
    matrix: bool        # a joint_matrix (XMX) variant
    large_grf: bool     # asks for the 256-register file (common/kernel_props.hpp)
    slm_estimate: int   # the host's local-memory estimate for the variant
    slm_limit: int
    head_dim_v: int = 0  # V's head dim where it differs from head_dim (0: the same)


@dataclass
class Program(Selection):
    """Kernels built together for one target, and the call that selected them."""
    header: str = ""
    kernels: list = field(default_factory=list)
    options: list = field(default_factory=list)
    module: str = ""
    error: str = ""  # the host refused to plan this call (e.g. local memory)

    def selection(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(Selection)}


def _calls(full: bool):
    size = "full" if full else "quick"
    head_dims = ALL_HEAD_DIMS if full else COMMON_HEAD_DIMS
    # The quick grid (CI) leaves float16 to the full one: its kernels are bfloat16's with
    # another conversion (and another XMX type), and halve the check's time.
    for dtype in DTYPES if full else ["float32", "bfloat16"]:
        # "auto" is what runs by default; "1" is the opt-in XMX path (16-bit only).
        modes = ["auto"] if dtype == "float32" else ["auto", "1"]
        for head_dim in head_dims:
            for features in FEATURE_SETS[size]:
                for mode in modes:
                    yield "forward", dtype, head_dim, features, 1, mode, 0
                    for rows in DECODE_ROWS[size]:
                        yield "decode", dtype, head_dim, features, rows, mode, 0
                        if features == 0:
                            rotary = ROTARY_F32 if dtype == "float32" else ROTARY_INPUT
                            for appending in (APPEND, APPEND | rotary):
                                yield "decode", dtype, head_dim, appending, rows, mode, 0
                    yield "backward", dtype, head_dim, features, 1, mode, 0
        for head_dim in head_dims if dtype != "float32" else []:
            for features in FORWARD_SCORE_CHANGES[size]:
                yield "forward", dtype, head_dim, features, 1, "auto", 0
            for features in FP8_FEATURE_SETS[size]:
                yield "forward", dtype, head_dim, features, 1, "auto", 0
                for rows in DECODE_ROWS[size]:  # (skipped where the general kernel serves)
                    yield "fp8_decode", dtype, head_dim, features, rows, "auto", 0
                    if features == 64:  # 16-bit tokens quantised into the cache, rotated
                        for appending in (APPEND, APPEND | ROTARY_INPUT):
                            yield ("fp8_decode", dtype, head_dim, features | appending, rows,
                                   "auto", 0)
        for head_dim, head_dim_v in VALUE_HEAD_DIMS[size]:
            for features in FEATURE_SETS[size]:
                yield "forward", dtype, head_dim, features, 1, "auto", head_dim_v
                # The backward runs at the larger head dim; past ALL_HEAD_DIMS (MLA's 576), its own.
                if max(head_dim, head_dim_v) > ALL_HEAD_DIMS[-1]:
                    yield "backward", dtype, max(head_dim, head_dim_v), features, 1, "auto", 0
        for head_dim, head_dim_v, rows in MLA_DECODE[size] if full or dtype == "bfloat16" else []:
            yield "decode", dtype, head_dim, C.FEATURE_VALUE_DIM, rows, "auto", head_dim_v
            if full and dtype != "float32":
                yield ("fp8_decode", dtype, head_dim, 64 | C.FEATURE_VALUE_DIM, rows, "auto",
                       head_dim_v)
    yield "dropout_mask", "float32", 64, 0, 1, "auto", 0
    yield "cache_check", "float32", 64, 0, 1, "auto", 0
    for dtype in ("float32", "bfloat16", "float8_e4m3fn"):  # copies bits: 32, 16, 8
        yield "kv_append", dtype, 64, 0, 1, "auto", 0
    for dtype in ("float32", "bfloat16"):
        yield "kv_append", dtype, 64, 0, 1, "rotary", 0
    for dtype in ("float8_e4m3fn", "float8_e5m2"):  # bfloat16 tokens quantised into the cache
        yield "kv_append", dtype, 64, 0, 1, "quantise", 0


FAMILIES = ["forward", "backward", "decode", "dropout_mask", "cache_check", "kv_append"]


def plan_target(target: str, full: bool, families=None, dtypes=None) -> list:
    """The distinct programs `target` would build for the grid; `families` and `dtypes`, when
    given, keep only the calls of those kernel families and those query dtypes."""
    limits = C.profile_limits(target)
    programs, seen = [], set()
    for family, dtype, head_dim, features, rows, mode, head_dim_v in _calls(full):
        if family == "fp8_decode":  # C.flash_decode_supported (DeviceLimits::fp8_decode)
            if not limits["fp8_decode"]:
                continue
            family = "decode"
        if (families and family not in families) or (dtypes and dtype not in dtypes):
            continue
        # Past what the decode kernel's local memory holds (C.decode_fits: head dims past 480
        # on 64 KiB GPUs) the general forward kernel serves decodes; the grid has it.
        if family == "decode" and not C.decode_fits(dtype, max(head_dim, head_dim_v), rows,
                                                    features, target)[0]:
            continue
        base = dict(target=target, family=family, dtype=dtype, head_dim=head_dim,
                    features=features, rows=rows, mode=mode,
                    slm_limit=limits["local_mem_bytes"], head_dim_v=head_dim_v)
        try:
            plan = C.plan(family, target, dtype, head_dim, features, rows, mode, head_dim_v)
        except Exception as e:  # a call this GPU cannot serve: a finding, not a crash
            programs.append(Program(variant="", matrix=False, large_grf=False, header="",
                                    kernels=[], options=[],
                                    slm_estimate=0, error=str(e), **base))
            continue
        key = (plan["header"], tuple(plan["kernels"]), tuple(plan["options"]))
        if key in seen:
            continue
        seen.add(key)
        variant = plan["variant"]
        programs.append(Program(variant=repr(variant).replace("KernelVariant", family),
                                matrix=variant.matrix_m > 0, large_grf=variant.large_grf,
                                header=plan["header"],
                                kernels=list(plan["kernels"]), options=list(plan["options"]),
                                slm_estimate=plan["slm_bytes"], **base))
        if variant.matrix_registers:  # the layout check those kernels run first
            probe = C.layout_probe_program(variant)
            key = (probe["header"], tuple(probe["kernels"]), tuple(probe["options"]))
            if key not in seen:
                seen.add(key)
                programs.append(Program(variant=programs[-1].variant, matrix=True,
                                        large_grf=False, slm_estimate=0, **probe, **base))
    return programs


def ocloc_device(target: str) -> str:
    return C.profile_limits(target)["ocloc_device"]


# Kernel names: the host registers "ipex_flash::flash_fwd_kernel<float, 64, 64, 64, 0, 64>";
# the binary lists the mangled "_ZN24__sycl_kernel_ipex_flash16flash_fwd_kernelIfLi64E...".
# Both reduce to (name, element type, integer arguments; a bool argument counts as 0 or 1;
# type arguments past the first are left out).
def _type_class(text: str) -> str:
    if "bfloat16" in text:
        return "bfloat16"
    if "half" in text:
        return "float16"
    return "float32"


def registered_key(name: str) -> tuple:
    base, _, args = name.partition("<")
    parts = [a.strip() for a in args.rstrip(">").split(",")] if args else []
    dtype = _type_class(parts[0]) if parts else ""
    flags = {"false": 0, "true": 1}
    return base.split("::")[-1], dtype, tuple(flags[a] if a in flags else int(a)
                                              for a in parts[1:]
                                              if a in flags or a.lstrip("-").isdigit())


_MANGLED = re.compile(r"__sycl_kernel_ipex_flash(\d+)")


def mangled_key(mangled: str) -> tuple:
    match = _MANGLED.search(mangled)
    if match is None:
        return (mangled, "", ())
    length, start = int(match.group(1)), match.end()
    base, rest = mangled[start:start + length], mangled[start + length:]
    if not rest.startswith("I"):  # not a template
        return base, "", ()
    end = rest.find("EEEv")  # the template's closing E, then the parameter list
    args = rest[1:end + 1] if end >= 0 else rest[1:]
    return base, _type_class(args), tuple(int(x) for x in re.findall(r"L[ib](\d+)E", args))
