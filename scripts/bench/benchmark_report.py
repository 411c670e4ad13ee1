"""The one benchmark report: writes benchmarks/RESULTS.md from the JSON files the benchmark
scripts leave in benchmarks/, naming the machine each was measured on.

    python scripts/bench/benchmark_report.py        # RESULTS.md from the JSON files as they are
    python scripts/bench/benchmark_report.py --run  # run every benchmark below first, then the
                                                    # plot (about an hour on 2 cores; matplotlib)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from report_sections import distributed_section, distributed_steps_section, \
    generate_batch_section, host_cost_section, sdpa_section, vllm_generate_section
from report_tables import RUNS, ratio, section, span, table

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent.parent
BENCH = REPO / "benchmarks"


def summary(d: dict) -> list[str]:
    """README's performance table: the headline ratio of each pass."""
    fwd4k, bwd, dec = (d[n]["rows"] for n in ("forward_4096.json", "backward.json", "decode.json"))
    copy_fp32 = [r["ratio_to_copy"] for r in dec if r["dtype"] == "float32"
                 and r["layout"] == "BNHD" and r["cache_len"] >= 4096]
    return table(["", "ipex_flash / torch SDPA"], [
        ["forward, float32, N = 4096, D = 64/128", span(ratio(fwd4k, dtype="float32"))],
        ["forward, bfloat16, N = 4096 (matrix kernel on AMX; torch's uses AMX too)",
         span(ratio(fwd4k, dtype="bfloat16"))],
        ["backward, float32, N = 1024-4096", span(ratio(bwd, kind="backward", dtype="float32"))],
        ["decoding, GQA 32/8, D = 128, from 16k keys",
         span([r["ratio_to_sdpa"] for r in dec if r["cache_len"] >= 16384])
         + f"; float32 K/V read at {span(copy_fp32)} the copy bandwidth from 4k keys"],
    ])


def write_readme_summary(lines: list[str]) -> None:
    readme = REPO / "README.md"
    text = readme.read_text()
    begin, end = "<!-- benchmark-summary:begin -->\n", "<!-- benchmark-summary:end -->"
    head, rest = text.split(begin, 1)
    readme.write_text(head + begin + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1])


def report(d: dict) -> list[str]:
    fwd4k, fwd, bwd, dec = (d[n]["rows"] for n in ("forward_4096.json", "forward.json",
                                                   "backward.json", "decode.json"))
    serving, runtime = d["serving.json"], d["runtime.json"]
    to_copy = lambda dtype, layout: [r["ratio_to_copy"] for r in dec  # noqa: E731
                                     if (r["dtype"], r["layout"]) == (dtype, layout)
                                     and r["cache_len"] >= 4096]
    out = ["# Benchmark results", "",
           "Written by `python scripts/bench/benchmark_report.py` from the JSON files beside it; "
           "`--run` first runs each benchmark with the command given under its section. All "
           "figures are from the SYCL CPU device (no GPU has run these kernels); every ratio is "
           "against torch SDPA (or a tensor copy) measured in the same run, because these "
           "machines are shared and absolute figures move by about 15 % between runs.", "",
           "FLOPs: forward 4·B·H·N²·D, halved when causal; backward 2.5x that, forward+backward "
           "3.5x. Decode bandwidth: bytes of K and V read per second; copy bandwidth: (bytes "
           "read + bytes written) per second of a 512 MB tensor copy.", "",
           "## Summary (README's performance table)", ""]
    out += summary(d)
    out += section("Forward, B = 1, H = 8, N = 4096", "forward_4096.json", d["forward_4096.json"])
    out += table(["dtype", "D", "causal", "ipex_flash GFLOP/s", "SDPA GFLOP/s", "ipex/SDPA"],
                 [[r["dtype"], r["head_dim"], "yes" if r["causal"] else "no",
                   f"{r['ipex_flash_gflops']:.1f}", f"{r['sdpa_gflops']:.1f}",
                   f"{r['ratio_to_sdpa']:.2f}"] for r in fwd4k])
    out += ["", "bfloat16 runs on the matrix-engine kernel (AMX tiles, `flash_fwd_matrix.hpp`); "
            "torch's bfloat16 SDPA uses the same tiles through oneDNN."]
    out += section("Forward over the sequence length, B = 1, H = 8", "forward.json",
                   d["forward.json"])
    groups = sorted({(r["dtype"], r["head_dim"], r["causal"]) for r in fwd})
    out += table(["dtype", "D", "causal", "N", "ipex/SDPA"],
                 [[t, dim, "yes" if c else "no",
                   f"{min(r['seq_len'] for r in fwd)}-{max(r['seq_len'] for r in fwd)}",
                   span(ratio(fwd, dtype=t, head_dim=dim, causal=c))] for t, dim, c in groups])
    out += ["", "![throughput](throughput.png)", "",
            "`python scripts/bench/plot_results.py` draws `throughput.png` (non-causal panels) "
            "from `forward.json` and `backward.json`; `--run` redraws it."]
    out += section("Backward and forward+backward, B = 1, H = 8, D = 64", "backward.json",
                   d["backward.json"])
    out += table(["pass", "dtype", "N", "causal", "ipex_flash GFLOP/s", "SDPA GFLOP/s",
                  "ipex/SDPA"],
                 [[r["kind"], r["dtype"], r["seq_len"], "yes" if r["causal"] else "no",
                   f"{r['ipex_flash_gflops']:.1f}", f"{r['sdpa_gflops']:.1f}",
                   f"{r['ratio_to_sdpa']:.2f}"] for r in bwd])
    out += ["", "The backward does 7 matrix products where the FLOP count credits 5 (dQ "
            "recomputes S and dP in its own pass, which keeps every gradient free of atomics), "
            "so its arithmetic runs at about 1.4x the GFLOP/s shown."]
    out += section("Decode, 1 query token, GQA 32/8, D = 128", "decode.json", d["decode.json"])
    out += table(["dtype", "layout", "batch", "cache", "ipex_flash GB/s", "SDPA GB/s",
                  "ipex/copy", "ipex/SDPA"],
                 [[r["dtype"], r["layout"], r["batch"], r["cache_len"],
                   f"{r['ipex_flash_gbps']:.1f}", f"{r['sdpa_gbps']:.1f}",
                   f"{r['ratio_to_copy']:.2f}", f"{r['ratio_to_sdpa']:.2f}"]
                  for r in dec if r["cache_len"] == 16384])
    out += ["", "BNHD is flash-attn's cache layout (B, N, Hkv, D); BHND head-major memory seen "
            "through a transpose. Rows at 16k keys; the JSON has 1k to 32k. ipex/copy from 4k "
            "keys: " + ", ".join(f"{t} {lay} {span(to_copy(t, lay))}"
                                 for t in ("float32", "bfloat16") for lay in ("BNHD", "BHND"))
            + "."]
    a = serving["args"]
    out += section("The serving call", "serving.json", serving)
    out += [f"{a['decodes']} decodes of {a['decode_tokens']} token over {a['context']} keys and "
            f"one {a['prefill']}-token chunk over {a['prefill_context']} keys in one paged "
            f"flash_attn_varlen_func call (GQA {a['heads'][0]}/{a['heads'][1]}, D = "
            f"{a['head_dim']}, {a['dtype']}, pages of {a['page_size']}), against the same work "
            f"as two calls: {serving['mixed_over_separate']:.3f}x the time (best of "
            f"{a['repeats']} interleaved calls: {1e3 * serving['best_seconds']['mixed']:.1f} ms "
            f"against {1e3 * serving['separate_seconds']:.1f} ms)."]
    out += sdpa_section(d["sdpa.json"])
    out += host_cost_section(d["host_cost.json"])
    out += generate_batch_section(d["generate_batch.json"])
    out += distributed_steps_section(d["distributed.json"])
    out += distributed_section(d["distributed_ring.json"])
    out += vllm_generate_section(d["vllm_generate.json"])
    out += section("Runtime costs, each in a fresh process", "runtime.json", runtime)
    out += table(["what", "measured"], [
        ["peak memory above inputs and outputs, forward float32 B=1 H=8 N=32768 D=64",
         f"{runtime['peak_memory']['extra_mb']:.1f} MB"],
        ["first call of a new variant, empty kernel cache",
         f"{runtime['cold']['first_call_s']:.2f} s"],
        ["same variant in a new process after `python -m ipex_flash warmup`",
         f"{runtime['warm_after_warmup']['first_call_s']:.2f} s"],
        ["same variant, 2nd process after a plain first call",
         f"{runtime['second_process']['first_call_s']:.2f} s"],
        ["same variant, 3rd and later processes",
         f"{runtime['third_process']['first_call_s']:.2f} s"],
        ["torch's own `import torch._dynamo` on a process's first custom-op call",
         f"{runtime['cold']['torch_dispatch_import_s']:.2f} s"],
    ])
    out += ["", "The second process after a plain first call rebuilds the binary from the cached "
            "IR once (the process that compiled from source stores it under another key); "
            "`python -m ipex_flash warmup` does that second build itself. docs/design.md (JIT "
            "build and caches) has the details."]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run every benchmark first")
    args = parser.parse_args()
    if args.run:
        for name, command in RUNS.items():
            script, *options = command.split()
            if script == "benchmark.py":
                options += ["--output", str(BENCH / name)]
            subprocess.run([sys.executable, str(SCRIPTS / script), *options], check=True)
        subprocess.run([sys.executable, str(SCRIPTS / "plot_results.py")], check=True)
    data = {name: json.loads((BENCH / name).read_text()) for name in RUNS}
    (BENCH / "RESULTS.md").write_text("\n".join(report(data)) + "\n")
    write_readme_summary(summary(data))
    print(f"wrote {BENCH / 'RESULTS.md'} and README.md's performance table")


if __name__ == "__main__":
    main()
