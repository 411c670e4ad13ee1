"""vLLM's engine (LLM.generate) on ipex_flash's attention backend (IPEX_FLASH_VLLM=1) against
vLLM's own CPU_ATTN, in the same run: prompt tokens/s of the prefill and generated tokens/s of
the decode steps of one random Llama, at a few batch sizes. Runs with the main venv's python
and drives the vLLM venv (scripts/setup/setup_vllm_env.sh), one engine per backend:

    python scripts/bench/benchmark_vllm_generate.py                 # 1, 4, 16 prompts, fp32
    python scripts/bench/benchmark_vllm_generate.py --batches 1 8 --prompt-len 64 --layers 2
Prints a table and writes benchmarks/vllm_generate.json (--output to change).

Prefill: generate with max_tokens=1, prompt tokens over its seconds. Decode: the new tokens
after the first over (seconds of generate with max_tokens=1+new_tokens - the prefill's);
best of --repeats each (vllm_generate_driver.py says how). The log of each engine is checked:
ipex_flash's must say its layers ran on IPEX_FLASH, CPU_ATTN's must not.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from machine import machine

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parents[1]
DRIVER = SCRIPTS / "vllm_generate_driver.py"
SERVES = "ipex_flash: vLLM attention backend IPEX_FLASH serves"
BACKENDS = {"ipex_flash": "1", "CPU_ATTN": None}  # the IPEX_FLASH_VLLM each engine runs with
DRIVER_TIMEOUT_S = 900


def spec(args, work: Path) -> dict:
    heads, kv_heads = args.heads
    hidden = heads * args.head_dim
    return {"model": str(work / "llama"), "seed": 0, "batches": args.batches,
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            # Weights wider than the default (0.2, not 0.02) so that greedy choices are apart
            # by more than either backend's rounding, and the tokens can be compared.
            "config": dict(vocab_size=args.vocab, hidden_size=hidden,
                           intermediate_size=4 * hidden, num_hidden_layers=args.layers,
                           num_attention_heads=heads, num_key_value_heads=kv_heads,
                           head_dim=args.head_dim, max_position_embeddings=1024,
                           initializer_range=0.2, tie_word_embeddings=False,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0),
            "llm": {"skip_tokenizer_init": True, "dtype": args.dtype, "block_size": 32,
                    "enforce_eager": True, "seed": 0, "gpu_memory_utilization": 0.3,
                    "max_model_len": args.prompt_len + args.new_tokens + 1,
                    # Each batch's prefill in one step; repeats must not find it cached.
                    "max_num_seqs": max(args.batches),
                    "max_num_batched_tokens": max(2048, max(args.batches) * args.prompt_len),
                    "enable_prefix_caching": False, "disable_log_stats": True}}


def driver(python: Path, args: list[str], switch, log: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IPEX_FLASH_VLLM"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if switch is not None:
        env["IPEX_FLASH_VLLM"] = switch
    with open(log, "w") as out:
        run = subprocess.run([str(python), str(DRIVER), *args], stdout=out,
                             stderr=subprocess.STDOUT, env=env, timeout=DRIVER_TIMEOUT_S,
                             cwd=log.parent)
    if run.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{DRIVER.name} {args[0]} exited with {run.returncode}:\n{tail}")


def measure(args, work: Path) -> dict:
    """{backend: the driver's OUT}, each engine's log checked for the backend it ran."""
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec(args, work)))
    driver(args.python, ["model", str(spec_path)], None, work / "model.log")
    results = {}
    for name, switch in BACKENDS.items():
        out, log = work / f"{name}.json", work / f"{name}.log"
        driver(args.python, ["time", str(spec_path), str(out)], switch, log)
        served = SERVES in log.read_text(errors="replace")
        if served != (switch == "1"):
            raise RuntimeError(f"the {name} engine's log {'lacks' if switch else 'has'} "
                               f"{SERVES!r}: the backend is not the one measured")
        results[name] = json.loads(out.read_text())
    return results


def rows(results: dict) -> list[dict]:
    ours, theirs = results["ipex_flash"]["rows"], results["CPU_ATTN"]["rows"]
    table = []
    for a, b in zip(ours, theirs):
        row = {"batch": a["batch"], "prompt_tokens": a["prompt_tokens"],
               "generated_tokens": a["generated_tokens"]}
        for name, r in (("ipex_flash", a), ("CPU_ATTN", b)):
            decode_tokens = r["generated_tokens"] - r["batch"]  # the first came with the prefill
            row[name] = {"prefill_s": r["prefill_s"], "generate_s": r["generate_s"],
                         "prompt_tokens_per_s": r["prompt_tokens"] / r["prefill_s"],
                         "generated_tokens_per_s":
                             decode_tokens / max(r["generate_s"] - r["prefill_s"], 1e-9)}
        for rate in ("prompt_tokens_per_s", "generated_tokens_per_s"):
            row[f"{rate}_ratio"] = row["ipex_flash"][rate] / row["CPU_ATTN"][rate]
        row["same_tokens"] = sum(x == y for x, y in zip(a["tokens"], b["tokens"])) / a["batch"]
        table.append(row)
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16],
                        help="prompts per generate")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, nargs=2, default=[4, 2], metavar=("HQ", "HKV"))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python",
                        help="the vLLM venv's python")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "vllm_generate.json")
    args = parser.parse_args()
    # The 1-minute load average before and after: other work on these shared cores shows.
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ipex_flash_vllm_bench_") as work:
        results = measure(args, Path(work))
    load.append(os.getloadavg()[0])
    table = rows(results)
    versions = results["ipex_flash"]["versions"]
    print(f"vLLM {versions['vllm']} LLM.generate: a random {args.layers}-layer Llama (GQA "
          f"{args.heads[0]}/{args.heads[1]}, D={args.head_dim}, hidden "
          f"{args.heads[0] * args.head_dim}), {args.dtype}, prompts of {args.prompt_len} tokens, "
          f"{args.new_tokens} decode steps; best of {args.repeats}; on {machine()['cpu']}, "
          f"{machine()['cores']} cores")
    print(f"{'prompts':>7} | {'prompt tok/s ipex_flash':>23} | {'CPU_ATTN':>8} | {'ratio':>5} | "
          f"{'gen tok/s ipex_flash':>20} | {'CPU_ATTN':>8} | {'ratio':>5} | same tokens")
    for r in table:
        ours, theirs = r["ipex_flash"], r["CPU_ATTN"]
        print(f"{r['batch']:>7} | {ours['prompt_tokens_per_s']:23.0f} | "
              f"{theirs['prompt_tokens_per_s']:8.0f} | {r['prompt_tokens_per_s_ratio']:4.2f}x | "
              f"{ours['generated_tokens_per_s']:20.1f} | {theirs['generated_tokens_per_s']:8.1f} | "
              f"{r['generated_tokens_per_s_ratio']:4.2f}x | {r['same_tokens']:.0%}")
    print("engine start (s): " + ", ".join(f"{name} {res['start_s']:.1f}"
                                          for name, res in results.items())
          + f"; load average {load[0]:.1f} before, {load[1]:.1f} after")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine(**versions),
        "args": {k: (str(v.relative_to(REPO)) if isinstance(v, Path) and v.is_relative_to(REPO)
                     else str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "start_s": {name: res["start_s"] for name, res in results.items()},
        "load_average": load,
        "rows": table}, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
