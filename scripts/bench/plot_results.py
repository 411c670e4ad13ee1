"""Plots GFLOP/s against sequence length for ipex_flash, torch SDPA and naive attention, from
the JSON files scripts/bench/benchmark.py writes (forward and backward), into one PNG.

    python scripts/bench/plot_results.py  # benchmarks/forward.json, backward.json -> throughput.png
Needs matplotlib (pip install ".[bench]").
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
IMPLEMENTATIONS = {"ipex_flash": "tab:blue", "sdpa": "tab:orange", "naive": "tab:gray"}


def panels(rows):
    """(kind, dtype, head_dim, causal) -> rows sorted by sequence length."""
    grouped = {}
    for row in rows:
        key = (row["kind"], row["dtype"], row["head_dim"], row["causal"])
        grouped.setdefault(key, []).append(row)
    return {key: sorted(group, key=lambda r: r["seq_len"]) for key, group in grouped.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path,
                        default=[REPO / "benchmarks" / "forward.json",
                                 REPO / "benchmarks" / "backward.json"])
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "throughput.png")
    args = parser.parse_args()
    rows, machine = [], {}
    for path in args.inputs:
        data = json.loads(path.read_text())
        rows += [r for r in data["rows"] if r["kind"] in ("forward", "backward")]
        machine = data["machine"]
    groups = {k: v for k, v in panels(rows).items() if not k[3]}  # non-causal panels
    keys = sorted(groups, key=lambda k: (k[0] != "forward", k[1], k[2]))
    columns = min(3, len(keys))
    lines = (len(keys) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.8 * lines), squeeze=False)
    for axis, key in zip(axes.flat, keys):
        group = groups[key]
        for name, colour in IMPLEMENTATIONS.items():
            points = [(r["seq_len"], r.get(name + "_gflops")) for r in group]
            points = [(n, g) for n, g in points if g]
            if points:
                axis.plot(*zip(*points), marker="o", label=name, color=colour)
        kind, dtype, head_dim, _ = key
        axis.set_title(f"{kind}, {dtype}, D={head_dim}")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("sequence length N (B=1, H=8)")
        axis.set_ylabel("GFLOP/s")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in axes.flat[len(keys):]:
        axis.set_visible(False)
    figure.suptitle(f"{machine.get('device', '?')}, {machine.get('compute_units', '?')} compute "
                    f"units, torch {machine.get('torch', '?')} ({machine.get('torch_threads', '?')} "
                    "threads); SYCL CPU device")
    figure.tight_layout()
    figure.savefig(args.output, dpi=90)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
