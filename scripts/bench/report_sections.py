"""The report's sections of the benchmarks that are not benchmark.py's passes: SDPA's contract
(benchmark_sdpa.py), host cost (benchmark_host_cost.py), transformers' continuous batching
(benchmark_generate_batch.py), context parallelism (benchmark_distributed.py's training
steps, benchmark_ring_probes.py's zigzag ring) and vLLM's engine (benchmark_vllm_generate.py)."""
from __future__ import annotations

from report_tables import section, table

SPIN_SETTINGS = {"default_spin": "libgomp's default spin",
                 "ipex_flash_spin": "GOMP_SPINCOUNT=10000 (what `import ipex_flash` sets)",
                 "passive": "OMP_WAIT_POLICY=PASSIVE"}


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


def distributed_steps_section(data: dict) -> list[str]:
    """Context parallelism's training steps against one process: time, traffic, memory."""
    a = data["args"]
    out = section("Context parallelism (ipex_flash.distributed): training steps against one "
                  "process", "distributed.json", data)
    out += table(["dtype", "method", "ranks", "tokens/rank", "step ms", "vs one process",
                  "MiB sent per rank", "peak MiB per rank", "vs one process"],
                 [[r["dtype"], r["method"], r["world"], r["local_tokens"],
                   f"{1e3 * r['step_seconds']:.0f}", f"{r['step_vs_one']:.2f}x",
                   f"{r['sent_bytes'] / 2**20:.2f}", f"{r['peak_bytes'] / 2**20:.1f}",
                   f"{r['peak_vs_one']:.2f}x"] for r in data["summary"]])
    load = data.get("load_average")
    out += ["", f"Causal, N = {a['seq_len']} tokens (llama3 and flash_attn_varlen_func: a "
            f"packed batch of {', '.join(map(str, data['packed_lengths']))}), H = "
            f"{a['heads'][0]}/{a['heads'][1]}, D = {a['head_dim']}, heads_k_stride = "
            f"{a['heads_k_stride']}; USP is Ulysses 2 x zigzag ring 2; ring_window is the ring "
            f"with a causal window of {a['seq_len'] // 8} tokens (each rank exchanges only "
            "with the ranks that window joins), flash_attn_func_window one process with it. "
            "Forward + backward of the "
            f"attention alone, median of {a['repeats']} warm steps, the slowest rank's; vs one "
            "process: against flash_attn_func (ring, zigzag, USP), flash_attn_varlen_func "
            "(llama3) or flash_attn_func_window (ring_window) on the whole batch in one "
            "process. MiB sent: the payload a rank sends "
            "in a step (wrapped torch.distributed calls). Peak: the rank's resident-set "
            "high-water mark during a step above what it held before (its inputs). Every rank "
            "is a process on this one machine over gloo and loopback, with one compute unit "
            "of the SYCL CPU device and one torch thread: one process uses one core, 2 ranks "
            "both cores, 4 ranks share the 2 cores (half a core each), so step times across "
            "rank counts show the layer's overhead, not scaling."
            + (f" 1-minute load average {load[0]:.1f} before the run, {load[1]:.1f} after "
               f"(its own ranks included)." if load else "")]
    return out


def distributed_section(data: dict) -> list[str]:
    """Context parallelism: per-rank memory against one device, causal balance, overlap."""
    a = data["args"]
    out = section("Context parallelism (ipex_flash.distributed), zigzag causal ring",
                  "distributed_ring.json", data)
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


def vllm_generate_section(data: dict) -> list[str]:
    """vLLM's LLM.generate on ipex_flash's backend against CPU_ATTN, per batch size."""
    a = data["args"]
    out = section("vLLM's engine (LLM.generate), ipex_flash's backend against CPU_ATTN",
                  "vllm_generate.json", data)
    out += table(["prompts", "prompt tokens/s: ipex_flash", "CPU_ATTN", "ipex/CPU_ATTN",
                  "generated tokens/s: ipex_flash", "CPU_ATTN", "ipex/CPU_ATTN",
                  "same tokens"],
                 [[r["batch"], f"{r['ipex_flash']['prompt_tokens_per_s']:.0f}",
                   f"{r['CPU_ATTN']['prompt_tokens_per_s']:.0f}",
                   f"{r['prompt_tokens_per_s_ratio']:.2f}x",
                   f"{r['ipex_flash']['generated_tokens_per_s']:.1f}",
                   f"{r['CPU_ATTN']['generated_tokens_per_s']:.1f}",
                   f"{r['generated_tokens_per_s_ratio']:.2f}x", f"{r['same_tokens']:.0%}"]
                  for r in data["rows"]])
    out += ["", f"vLLM {data['machine'].get('vllm', '?')}, one engine per backend "
            f"(IPEX_FLASH_VLLM=1 or unset), a random {a['layers']}-layer Llama (GQA "
            f"{a['heads'][0]}/{a['heads'][1]}, D = {a['head_dim']}, {a['dtype']}), prompts of "
            f"{a['prompt_len']} tokens, blocks of 32, eager mode, no prefix caching. Prompt "
            f"tokens/s: generate with max_tokens=1; generated tokens/s: the "
            f"{a['new_tokens']} decode steps after it (generate with max_tokens="
            f"{1 + a['new_tokens']}, less the prefill's time); best of {a['repeats']} each, "
            "after an untimed generate of each batch (kernels compile at first use). The whole "
            "engine step is timed: attention (its cache write included) is one part of it, "
            "beside the linear layers, vLLM's scheduling and sampling."
            + (" 1-minute load average {:.1f} before the run, {:.1f} after ({} cores)."
               .format(*data["load_average"], data["machine"]["cores"])
               if "load_average" in data else "")]
    return out
