"""The GPU status table of docs/gpus.md, from a gpu-check JSON file.

    python -m ipex_flash gpu-check [--full] --json docs/records/gpu_check.json
    python scripts/records/gpu_status_table.py docs/records/gpu_check.json --readme docs/gpus.md

Several JSON files (runs over different targets) are merged.

Prints the table, and with --readme replaces the one between the gpu-status markers there.
"""
import argparse
import json
import re
from collections import defaultdict

COMMON_HEAD_DIMS = (64, 128)
BEGIN, END = "<!-- gpu-status:begin -->", "<!-- gpu-status:end -->"


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


def markdown(result):
    grid = "full grid: every head-dim bucket" if result["full"] else "quick grid: head dims 64, 128"
    lines = [
        f"gpu-check ({grid}; {result['ocloc']}; {result['seconds']:.0f} s):",
        "",
        "| GPU (ocloc device) | kernels built | registers | max SLM / limit | spills at d=64/128 / "
        "anywhere | with private memory | XMX path | rules |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summarize(result):
        lines.append(f"| {r['target']} ({r['device']}) | {r['kernels']} | {r['grf']} | {r['slm']} "
                     f"| {r['spills']} | {r['private']} | {r['xmx']} | {r['rules']} |")
    return "\n".join(lines)


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
    parser.add_argument("--readme",
                        help="the Markdown file to update between the gpu-status markers "
                             "(docs/gpus.md)")
    args = parser.parse_args()
    table = markdown(merge(args.json_files))
    print(table)
    if args.readme:
        with open(args.readme) as f:
            text = f.read()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{args.readme} has no {BEGIN} ... {END} markers")
        with open(args.readme, "w") as f:
            f.write(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text))


if __name__ == "__main__":
    main()
