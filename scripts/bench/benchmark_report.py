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

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent.parent
BENCH = REPO / "benchmarks"

# The file each benchmark writes, and the command that writes it.
RUNS = {
    "forward_4096.json": "benchmark.py --seq-lens 4096 --head-dims 64 128 --dtypes float32 "
                         "bfloat16 --naive-max-len 2048",
    "forward.json": "benchmark.py --dtypes float32 bfloat16 --head-dims 64 128",
    "backward.json": "benchmark.py --passes backward fwd+bwd --seq-lens 1024 2048 4096 "
                     "--head-dims 64 --dtypes float32 bfloat16 --naive-max-len 4096 --budget 5",
    "decode.json": "benchmark.py --decode --repeats 7",
    "serving.json": "benchmark_serving.py",
    "sdpa.json": "benchmark_sdpa.py",
    "runtime.json": "runtime_costs.py",
    "host_cost.json": "benchmark_host_cost.py",
    "generate_batch.json": "benchmark_generate_batch.py",
    "distributed.json": "benchmark_distributed.py",
}


SPIN_SETTINGS = {"default_spin": "libgomp's default spin",
                 "ipex_flash_spin": "GOMP_SPINCOUNT=10000 (what `import ipex_flash` sets)",
                 "passive": "OMP_WAIT_POLICY=PASSIVE"}


def ratio(rows, **match) -> list[float]:
    """ipex_flash / SDPA of the rows whose fields have the given values."""
    return [r["ratio_to_sdpa"] for r in rows if all(r[f] == v for f, v in match.items())]


def span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def machine(data: dict) -> str:
    m = data.get("machine") or {}
    if isinstance(m, str):
        return m
    cpu = m.get("device") or m.get("cpu", "?")
    cores = m.get("compute_units") or m.get("cores")
    parts = [cpu + (f", {cores} cores" if cores else "")]
    if "amx" in m:
        parts.append("AMX" if m["amx"] else "no AMX")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}" + (f" with {m['torch_threads']} threads"
                                              if m.get("torch_threads") else ""))
    return ", ".join(parts)


def table(header, rows) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def section(title: str, name: str, data: dict) -> list[str]:
    return ["", f"## {title}", "",
            f"`python scripts/bench/{RUNS[name]}` (`{name}`), on {machine(data)}.", ""]


def sdpa_section(data: dict) -> list[str]:
    """Masks, a small call's host time, OpenMP contention, a transformers model."""
    results = data["results"]
    out = section("SDPA's contract: masks, small calls, OpenMP, a transformers model",
                  "sdpa.json", data)
    masked = results["masked"]
    out += table(["bool key-padding mask, B=4 H=8 N=2048 D=128", *masked], [
        ["masked against our unmasked forward (throughput: blocks the mask hides are skipped)",
         *(f"{m['masked_vs_unmasked_throughput']:.2f}x" for m in masked.values())],
        ["masked against torch SDPA masked", *(f"{m['masked_vs_torch_masked']:.2f}x"
                                              for m in masked.values())]])
    us = results["overhead"]["microseconds"]
    # benchmark_sdpa.py names the launch timed alone kernels_only; older files launch_only.
    kernels = us.get("kernels_only", us.get("launch_only"))
    out += ["", f"A small call (1 query row, 16 keys): torch SDPA {us['torch_sdpa']:.0f} µs, "
            f"`ipex_flash.scaled_dot_product_attention` {us['ours_sdpa']:.0f} µs (the launch "
            f"{kernels:.0f} µs of it), the same through torch's dispatcher "
            f"{us['ours_through_dispatcher']:.0f} µs.", ""]
    contention = results["contention"]
    out += table(["attention right after a matmul, OpenMP setting", "slowdown",
                  "50 small torch ops (ms)"],
                 [[SPIN_SETTINGS.get(name, name), f"{c['slowdown']:.2f}x",
                   f"{1e3 * c['small_ops']:.2f}"] for name, c in contention.items()])
    speed = results["model"]["speed_vs_sdpa"]
    out += ["", "A tiny Hugging Face Llama (float32), the ipex_attention backend against sdpa: "
            + ", ".join(f"{case.replace('_', ' ')} {ratio:.2f}x" for case, ratio in speed.items())
            + "."]
    return out


def host_cost_section(data: dict) -> list[str]:
    """Each entry point's whole call against torch SDPA's, and its host time (up to the first
    kernel's submission), at a tiny call and decode sizes."""
    results = data["results"]
    out = section("Host cost of each entry point, decode step (float32)", "host_cost.json", data)
    sizes = list(results)
    names = list(results[sizes[0]]["entry_points"])

    def cell(row):
        host = f", host {row['host_us']:.0f} µs" if "host_us" in row else f" ({row['us']:.0f} µs)"
        if "host_warm_us" in row:
            host += f" ({row['host_warm_us']:.0f} warm"
            host += f", {row['host_alone_us']:.0f} alone)" if "host_alone_us" in row else ")"
        if "xpu_us" in row:
            waits = row["xpu_waits"]
            host += f"; XPU path {row['xpu_us']:.0f} µs, {waits:.0f} wait{'' if waits == 1 else 's'}"
        return f"{row['vs_torch_sdpa']:.2f}x{host}"
    out += table(["entry point / time against torch SDPA's whole call", *(
        f"B={r['batch']} N={r['keys']} H={r['heads_q']}/{r['heads_kv']} D={r['head_dim']}"
        for r in results.values())],
        [[name, *(cell(results[size]["entry_points"][name]) for size in sizes)]
         for name in names])
    out += ["", "Host: the median time from the Python call to its first kernel's submission, "
            "from the host module's clock of submissions (the script's docstring says how), "
            "after a call of the same size, whose kernels ran on the same cores; warm: after the "
            "entry point's tiny call instead, which brings the host path's code back into the "
            "caches that the kernels' K/V traffic evicted (a GPU's kernels do not run on the "
            "host's cores); alone: calls back to back with their kernels submitted but not run, "
            "the host path with the caches as a GPU's kernels leave them. XPU path: the KV-cache "
            "calls' whole call through the queue-handle seam (the path an XPU takes), kernels "
            "submitted but not run, and the reads of the cache's values per call it waits for "
            "(on an XPU each waits for all work queued before it). The JSON also has the "
            "kernels launched alone from prepared arguments."]
    return out


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
    out += distributed_section(d["distributed.json"])
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


def generate_batch_section(data: dict) -> list[str]:
    """transformers' continuous batching on the backend against its sdpa, one run."""
    a = data["args"]
    out = section("transformers continuous batching (generate_batch)", "generate_batch.json",
                  data)
    out += table(["attention", "best of " + str(a["repeats"]) + " (s)", "new tokens/s"],
                 [[name, f"{data['best_seconds'][name]:.2f}",
                   f"{data['tokens_per_second'][name]:.1f}"] for name in data["best_seconds"]])
    out += ["", f"{a['requests']} requests of {a['prompt'][0]}-{a['prompt'][1]} prompt tokens, "
            f"{a['new_tokens']} new tokens each, a random {a['layers']}-layer Llama (GQA "
            f"{a['heads'][0]}/{a['heads'][1]}, D = {a['head_dim']}, float32): ipex_flash "
            f"{data['ipex_over_sdpa']:.2f}x sdpa's tokens/s, "
            + ("the same tokens." if data["same_tokens"] else "DIFFERENT tokens.")]
    return out


def distributed_section(data: dict) -> list[str]:
    """Context parallelism: per-rank memory against one device, causal balance, overlap."""
    a = data["args"]
    out = section("Context parallelism (ipex_flash.distributed), zigzag causal ring",
                  "distributed.json", data)
    longest = max(a["seq_lens"])
    rows = [r for r in data["memory"] if r["seqlen"] == longest]
    one = max(r["train_peak_bytes"] for r in rows if r["world"] == 1)
    out += table(["ranks", "forward peak MiB (most of a rank)",
                  "forward+backward peak MiB", "vs one device"],
                 [[w, f"{max(r['forward_peak_bytes'] for r in rows if r['world'] == w) / 2**20:.1f}",
                   f"{max(r['train_peak_bytes'] for r in rows if r['world'] == w) / 2**20:.1f}",
                   f"{max(r['train_peak_bytes'] for r in rows if r['world'] == w) / one:.2f}x"]
                  for w in sorted({r["world"] for r in rows})])
    balance = []
    for world in sorted({r["world"] for r in data["balance"]}):
        for kind in ("zigzag", "contiguous"):
            ranks = [r for r in data["balance"] if r["world"] == world and r["kind"] == kind]
            if not ranks:
                continue
            pairs = [r["pairs"] for r in ranks]
            mean = sum(pairs) / len(pairs)
            balance.append([world, kind, f"{100 * max(abs(p - mean) for p in pairs) / mean:.1f}%"])
    out += [""] + table(["ranks", "sharding", "most a rank's attended pairs differ from the mean"],
                        balance)
    steps = data["overlap"]
    out += ["", f"N = {longest}, B = {a['batch']}, H = {a['heads']}, D = {a['head_dim']}, "
            f"{a['dtype']}, memory above each rank's own inputs. Overlap at 2 ranks: a ring step "
            f"takes {min(s['step'] for s in steps) / min(s['kernel'] for s in steps):.2f}x its "
            f"kernel alone ({1e3 * min(s['kernel'] for s in steps):.0f} ms; the K/V exchange "
            f"alone {1e3 * min(s['exchange'] for s in steps):.1f} ms)."]
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
