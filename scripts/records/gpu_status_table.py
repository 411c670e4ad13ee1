"""docs/records/gpu_status.md, the page of gpu-check's figures per GPU, from its JSON record.

    python -m ipex_flash gpu-check [--full] --json docs/records/gpu_check.json
    python scripts/records/gpu_status_table.py docs/records/gpu_check.json --page docs/records/gpu_status.md

Several JSON files (runs over different targets) are merged. Prints the page, and with --page
writes it. Reads only the JSON files: no GPU, ocloc or compiled module needed. docs/gpus.md
says how to read the tables and which rules hold them.
"""
import argparse
import json
import re
from collections import defaultdict

COMMON_HEAD_DIMS = (64, 128)
PAGE = "docs/records/gpu_status.md"
COMMAND = ("python scripts/records/gpu_status_table.py docs/records/gpu_check.json "
           f"--page {PAGE}")
# The columns of the main-loop tables: the GPUs with XMX, 16-wide engines first.
MATRIX_ORDER = ("bmg", "pvc", "lnl", "dg2", "arl-h")
# The part each profile's figures are published for (sycl_src/host/variants/gpu_profiles.cpp).
PARTS = {"pvc": "Max 1100", "bmg": "B580", "dg2": "A770", "lnl": "140V", "mtl": "155H",
         "arl-h": "140T"}
BANDWIDTH_SHARE = 0.5  # ipex_flash/tools/gpu_bandwidth.py
DECODE_SLM_BYTES = 32 * 1024
FEATURES_ALL = 7  # softcap, ALiBi and a bool mask (sycl_src/device/common/features.hpp)


def xmx_state(kernels, limits):
    """What the XMX path gives this GPU, from the kernels it built: default or opt-in, how
    many kernels hold DPAS, and the range of their main loops' issued instructions per DPAS
    without score changes (gpu_check.KernelReport.loop_per_dpas; "+": a lower bound)."""
    if not limits["matrix"]:
        return "no XMX: vector kernels"
    dpas = [k for k in kernels if k["matrix"] and k["dpas"] > 0]
    if not dpas:
        return "XMX shape not taken: vector kernels"
    when = "default for 16-bit" if limits.get("matrix_by_default") else "opt-in"
    costs = [(k["loop_per_dpas"], k.get("loop_nested", 0) > 0) for k in dpas
             if k.get("loop_per_dpas") and k["features"] == 0]
    loop = ""
    if costs:
        low, high = min(costs), max(costs)
        loop = (f", main loops {low[0]:.1f}{'+' if low[1] else ''}-{high[0]:.1f}"
                f"{'+' if high[1] else ''} instructions per DPAS")
    return f"{when}, compile-verified ({len(dpas)} kernels with DPAS{loop}), not run"


def summarize(result):
    by_target = defaultdict(list)
    for k in result["kernels"]:
        by_target[k["target"]].append(k)
    rows = []
    for target in result["targets"]:
        kernels, limits = by_target[target], result["limits"][target]
        built = [k for k in kernels if k["built"]]
        spilling = [k for k in built if k["spill"] > 0]
        common_spills = [k for k in spilling if k["head_dim"] in COMMON_HEAD_DIMS]
        private = [k for k in built if k["private"] > 0]
        worst = max(spilling, key=lambda k: k["spill"], default=None)
        rows.append({
            "target": target, "device": limits["ocloc_device"],
            "kernels": f"{len(built)}/{len(kernels)}",
            "grf": "256" if limits["large_grf"] else "128",
            "slm": f"{max((k['slm'] for k in built), default=0) // 1024}"
                   f"/{limits['local_mem_bytes'] // 1024} KiB",
            "spills": f"{len(common_spills)} / {len(spilling)}" + (
                f" (worst {worst['spill']} B, d={worst['head_dim']})" if worst else ""),
            "private": str(len(private)),
            "xmx": xmx_state(kernels, limits),
            "rules": "pass" if not any(k["violations"] for k in kernels) else
                     f"{sum(1 for k in kernels if k['violations'])} fail",
        })
    return rows


def status_table(result):
    lines = [
        "| GPU (ocloc device) | kernels built | registers | max SLM / limit | spills at d=64/128 / "
        "anywhere | with private memory | XMX path | rules |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summarize(result):
        lines.append(f"| {r['target']} ({r['device']}) | {r['kernels']} | {r['grf']} | {r['slm']} "
                     f"| {r['spills']} | {r['private']} | {r['xmx']} | {r['rules']} |")
    return lines


def template_args(kernel):
    """The integer template arguments of a kernel's name, and its base name."""
    base, _, args = kernel.partition("<")
    return base.split("::")[-1], [int(a) for a in re.findall(r"(?<![\w.])\d+(?![\w.])", args)]


def matrix_label(kernel):
    """(order, label) of a forward or backward matrix kernel, from its name: what it is, its
    width and its sub-groups; None for kernels without a main loop of their own."""
    base, n = template_args(kernel)
    wide = ", 8 wide" if len(n) > 6 and n[6] == 8 else ""
    if base == "flash_fwd_matrix_registers_kernel":  # <T, D, BM, BN, F, M, K, N, Dv, SG>
        groups = f", {n[8]} sub-groups per rows" if len(n) > 8 and n[8] > 1 else ""
        return 0, f"forward, tiles in registers{wide}{groups} ({n[2]}-key blocks)"
    if base == "flash_fwd_matrix_kernel":
        return 1, f"forward, SLM-staged{wide}"
    if base == "flash_bwd_dq_matrix_registers_kernel":  # <T, D, BM, BN, F, M, K, N, SG>
        groups = f", {n[7]} sub-groups per rows" if len(n) > 7 and n[7] > 1 else ""
        return 2, f"dQ, tiles in registers{wide}{groups}"
    if base == "flash_bwd_dq_matrix_kernel":
        return 3, f"dQ, SLM-staged{wide}"
    if base == "flash_bwd_dkdv_matrix_registers_kernel":  # <T, D, BM, BN, F, M, K, N, SG>
        groups = f", {n[7]} sub-groups per keys" if len(n) > 7 and n[7] > 1 else ""
        return 4, f"dK/dV, tiles in registers{wide}{groups}"
    if base == "flash_bwd_dkdv_matrix_kernel":
        return 5, f"dK/dV, SLM-staged{wide}"
    return None


def head_dims(k):
    return f"{k['head_dim']}" + (f" / {k['head_dim_v']}" if k["head_dim_v"] else "")


def kib(nbytes):
    return f"{nbytes / 1024:.1f}"


def span(values, unit=""):
    low, high = min(values), max(values)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def main_loop_table(result, features):
    """The forward's and backward's matrix kernels at bfloat16 with these features: per GPU
    the main loop's issued instructions per DPAS and the costliest general loop's (`edge`)."""
    cells, slm = defaultdict(dict), defaultdict(set)
    targets = [t for t in MATRIX_ORDER if t in result["targets"]]
    for k in result["kernels"]:
        label = matrix_label(k["kernel"]) if k["built"] and k["dpas"] else None
        if not label or k["dtype"] != "bfloat16" or k["features"] != features:
            continue
        key = (label, k["head_dim"], k["head_dim_v"], head_dims(k))
        nested = "+" if k["loop_nested"] else ""
        cell = f"{k['loop_per_dpas']:.1f}{nested}"
        if k["loop_per_dpas_edge"]:
            cell += f" / {k['loop_per_dpas_edge']:.1f}"
        cells[key][k["target"]] = cell
        slm[key].add(k["slm"] // 1024)  # whole KiB on every matrix kernel here
    lines = ["| kernel | d | " + " | ".join(targets) + " | SLM per work-group |",
             "| --- | --- | " + " | ".join("---" for _ in targets) + " | --- |"]
    for key in sorted(cells):
        (_, label), _, _, dims = key
        row = [cells[key].get(t, "") for t in targets]
        lines.append(f"| {label} | {dims} | " + " | ".join(row) + f" | {span(sorted(slm[key]), ' KiB')} |")
    return lines


def affordable_per_kib(limits, simd=16):
    issue = limits["compute_units"] * limits["clock_mhz"] * 1e6 * min(1.0, limits["vector_lanes"] / simd)
    return issue / (limits["memory_gb_per_s"] * 1e9 / 1024)


def affords_table(result):
    lines = ["| GPU (part) | vector engines | clock | ALU lanes | memory | affords per KiB, SIMD16 "
             "| half |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in result["targets"]:
        lim = result["limits"][t]
        if not lim.get("clock_mhz"):
            continue
        afford = affordable_per_kib(lim)
        lines.append(f"| {t} ({PARTS.get(t, '?')}) | {lim['compute_units']} | {lim['clock_mhz']} MHz "
                     f"| {lim['vector_lanes']} | {lim['memory_gb_per_s']:g} GB/s | {afford:.0f} "
                     f"| {BANDWIDTH_SHARE * afford:.0f} |")
    return lines


def is_register_decode(k):
    return template_args(k["kernel"])[0] == "flash_decode_xmx_kernel"


def decode_summary_table(result):
    """Per GPU: its decode kernels, how many break the bandwidth rule, and each form's figures."""
    lines = ["| GPU | decode kernels | over half the budget | half the budget per KiB "
             "| register form: per KiB | vector form: per KiB (lower bounds) "
             "| register form: SLM, work-groups per core | vector form: SLM, work-groups per core |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in result["targets"]:
        decode = [k for k in result["kernels"] if k["target"] == t and k["issued_per_kib"]]
        if not decode:
            continue
        half = BANDWIDTH_SHARE * max(k["affordable_per_kib"] for k in decode)
        over = sum(1 for k in decode if k["issued_per_kib"] > BANDWIDTH_SHARE * k["affordable_per_kib"])
        register = [k for k in decode if is_register_decode(k)]
        vector = [k for k in decode if not is_register_decode(k)]

        def per_kib(ks):
            nested = "+" if any(k["block_nested"] for k in ks) else ""
            return span([round(k["issued_per_kib"]) for k in ks]) + nested

        def slm(ks):
            low, high = min(k["slm"] for k in ks), max(k["slm"] for k in ks)
            return f"{kib(low)} KiB" if low == high else f"{kib(low)}-{kib(high)} KiB"

        def groups(ks):
            return span(sorted({k["slm_limit"] // k["slm"] for k in ks if k["slm"]}))

        def form(ks, figure):
            """The figure over a form's kernels, MLA's (a latent cache: Dv compiled apart) apart."""
            if not ks:
                return "-"
            main = [k for k in ks if not k["head_dim_v"]]
            latent = [k for k in ks if k["head_dim_v"]]
            text = figure(main) if main else ""
            return text + (f"; MLA {figure(latent)}" if latent else "")

        def room(ks):
            return f"{slm(ks)}, {groups(ks)}"

        lines.append(f"| {t} | {len(decode)} | {over} | {half:.0f} "
                     f"| {form(register, per_kib) if register else 'no register form'} "
                     f"| {form(vector, per_kib)} | {form(register, room)} | {form(vector, room)} |")
    return lines


def register_decode_table(result):
    """The register form's loop over key blocks, bfloat16, per GPU and shape."""
    lines = ["| GPU | head dim | features | rows | sub-groups | keys a block | KiB a block | issued "
             "| per KiB | per DPAS | edge loop per DPAS | SLM | spill |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in result["kernels"]:
        if not (k["issued_per_kib"] and is_register_decode(k) and k["dtype"] == "bfloat16"):
            continue
        _, n = template_args(k["kernel"])  # <T, D, ROWS, BLOCK_N, F, M, K, N, Dv, SG>
        nested = "+" if k["block_nested"] else ""
        edge = f"{k['loop_per_dpas_edge']:.0f}" if k["loop_per_dpas_edge"] else "-"
        lines.append(f"| {k['target']} | {head_dims(k)} | {k['features']} | {n[1]} | {n[8]} | {n[2]} "
                     f"| {k['kv_kib']:g} | {k['block_issued']}{nested} "
                     f"| {k['issued_per_kib']:.0f}{nested} | {k['loop_per_dpas']:.1f} | {edge} "
                     f"| {k['slm']} B | {k['spill']} |")
    return lines


def page(result):
    grid = "full grid: every head-dim bucket" if result["full"] else "quick grid: head dims 64, 128"
    return "\n".join([
        "# gpu-check's figures per GPU",
        "",
        "Generated from gpu-check's record (`docs/records/gpu_check.json`); do not edit by hand.",
        "Regenerate with:",
        "",
        "```",
        COMMAND,
        "```",
        "",
        "How to read these tables, the rules they are held to and the known spills:",
        "[gpus.md](../gpus.md). Compiled, not run on a GPU.",
        "",
        f"Record: {grid}; ocloc {result['ocloc']}; {len(result['kernels'])} kernels; "
        f"{result['seconds']:.0f} s.",
        "",
        "## Status per GPU",
        "",
        *status_table(result),
        "",
        "## Main loop per DPAS, no score changes",
        "",
        "bfloat16, features 0. Each cell: the main loop's issued instructions per DPAS (`/dpas`,",
        "`loop_per_dpas`), then the costliest general loop's (`edge`, `loop_per_dpas_edge`) where the",
        "kernel splits its blocks; `+`: loops nested in it counted once, a lower bound. The",
        "register forward's main loop leaves out O's rescale, a branch only blocks whose max",
        "rises past the row's take (`loop_rescale_per_dpas`: its own cost).",
        "",
        *main_loop_table(result, 0),
        "",
        "## Main loop per DPAS with softcap, ALiBi and a bool mask",
        "",
        f"bfloat16, features {FEATURES_ALL}; read as above.",
        "",
        *main_loop_table(result, FEATURES_ALL),
        "",
        "## What each GPU affords per KiB of K/V",
        "",
        "Instruction issue over memory bandwidth, from each profile's published figures",
        "(`sycl_src/host/variants/gpu_profiles.cpp`, the record's `limits`).",
        "",
        *affords_table(result),
        "",
        "## Decode kernels against the bandwidth rule",
        "",
        "Issued instructions of the loop over key blocks per KiB of K/V it reads; the rule allows",
        f"half of what the GPU affords, and {DECODE_SLM_BYTES // 1024} KiB of SLM. MLA: head dims 576 / 512",
        "over one latent cache.",
        "",
        *decode_summary_table(result),
        "",
        "## The decode kernel's register form",
        "",
        "bfloat16, its loop over key blocks; features 1024 appends new tokens, 5120 appends them",
        "with rotary, 256 compiles V's head dim apart (MLA).",
        "",
        *register_decode_table(result),
        "",
    ])


def merge(paths):
    """One result from several gpu-check runs (e.g. per target group)."""
    merged = {"targets": [], "limits": {}, "kernels": [], "seconds": 0.0, "full": True}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        merged["targets"] += [t for t in result["targets"] if t not in merged["targets"]]
        merged["limits"].update(result["limits"])
        merged["kernels"] += result["kernels"]
        merged["seconds"] += result["seconds"]
        merged["full"] = merged["full"] and result["full"]
        merged["ocloc"] = result["ocloc"]
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json_files", nargs="+", help="gpu-check --json outputs (merged)")
    parser.add_argument("--page", help=f"the Markdown page to write ({PAGE})")
    args = parser.parse_args()
    text = page(merge(args.json_files))
    if args.page:
        with open(args.page, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
