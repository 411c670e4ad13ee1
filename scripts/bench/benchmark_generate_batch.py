"""transformers' continuous batching (generate_batch) on ipex_flash's kernels against
transformers' own sdpa continuous batching: generated tokens per second of one random Llama
(fp32, CPU tensors), both measured in the same run and interleaved (these machines are shared
and noisy), and whether the two generated the same tokens.

    python scripts/bench/benchmark_generate_batch.py              # 16 requests, 32 new tokens
    python scripts/bench/benchmark_generate_batch.py --requests 32 --prompt 128 512 --layers 8
Prints a table and writes benchmarks/generate_batch.json (--output to change).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import ipex_flash  # noqa: F401  (before torch: its OpenMP settings)
import torch
import transformers
from machine import machine

from ipex_flash.integrations import transformers as ipex_transformers

REPO = Path(__file__).resolve().parents[2]


class _NoPsutilNotice(logging.Filter):
    """transformers logs, at error level and on every run, that without psutil it cannot size
    the cache from free memory; the cache here has a fixed size (--blocks)."""

    def filter(self, record):
        return "psutil" not in record.getMessage()


def build_models(args):
    """{name: model}: the same random weights under ipex_flash and under sdpa."""
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.heads[0] * args.head_dim,
        intermediate_size=4 * args.heads[0] * args.head_dim, num_hidden_layers=args.layers,
        num_attention_heads=args.heads[0], num_key_value_heads=args.heads[1],
        head_dim=args.head_dim, max_position_embeddings=args.prompt[1] + args.new_tokens)
    torch.manual_seed(0)
    sdpa = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    ipex = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    ipex.load_state_dict(sdpa.state_dict())
    name = ipex_transformers.enable_continuous_batching(ipex)
    return {f"ipex_flash ({name})": ipex.eval(), "sdpa": sdpa.eval()}


def run(model, prompts, args):
    """(seconds, generated tokens per request) of one generate_batch call."""
    generation = transformers.GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False,
                                               eos_token_id=-1, pad_token_id=0)
    batching = transformers.ContinuousBatchingConfig(num_blocks=args.blocks,
                                                     max_batch_tokens=args.batch_tokens)
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=generation,
                                   continuous_batching_config=batching, progress_bar=False,
                                   warmup=False)
    seconds = time.perf_counter() - start
    failed = [out.error for out in outputs.values() if out.error is not None]
    if len(outputs) != len(prompts) or failed:
        raise RuntimeError(f"generate_batch finished {len(outputs)} of {len(prompts)} requests; "
                           f"errors: {failed}")
    by_prompt = {tuple(out.prompt_ids): out.generated_tokens for out in outputs.values()}
    return seconds, [by_prompt[tuple(p)] for p in prompts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, nargs=2, default=[64, 256], metavar=("MIN", "MAX"),
                        help="prompt lengths, drawn uniformly")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, nargs=2, default=[8, 2], metavar=("HQ", "HKV"))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch-tokens", type=int, default=512,
                        help="tokens per step (ContinuousBatchingConfig.max_batch_tokens)")
    parser.add_argument("--blocks", type=int, default=64, help="paged cache blocks of 256 tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path,
                        default=REPO / "benchmarks" / "generate_batch.json")
    args = parser.parse_args()
    logging.getLogger("ContinuousBatchingLogger").addFilter(_NoPsutilNotice())
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.prompt[0], args.prompt[1] + 1, (args.requests,),
                            generator=generator)
    prompts = [torch.randint(3, args.vocab, (int(n),), generator=generator).tolist()
               for n in lengths]
    models = build_models(args)
    tokens = {name: run(model, prompts, args)[1] for name, model in models.items()}  # warm-up
    times = {name: [] for name in models}
    for _ in range(args.repeats):  # interleaved, so drifts in the machine's load hit all alike
        for name, model in models.items():
            seconds, generated = run(model, prompts, args)
            assert generated == tokens[name], f"{name}: greedy tokens changed between runs"
            times[name].append(seconds)
    generated = args.requests * args.new_tokens
    best = {name: min(t) for name, t in times.items()}
    rate = {name: generated / seconds for name, seconds in best.items()}
    names = list(models)
    speedup = rate[names[0]] / rate["sdpa"]
    same = tokens[names[0]] == tokens["sdpa"]
    print(f"generate_batch: {args.requests} requests, prompts of {args.prompt[0]}-{args.prompt[1]} "
          f"tokens ({int(lengths.sum())} in all), {args.new_tokens} new tokens each; Llama "
          f"{args.layers} layers, GQA {args.heads[0]}/{args.heads[1]}, D={args.head_dim}, fp32, "
          f"{args.batch_tokens} tokens per step, transformers {transformers.__version__}")
    print(f"{'attention':>40} | best of {args.repeats} (s) | new tokens/s")
    for name in names:
        print(f"{name:>40} | {best[name]:15.2f} | {rate[name]:12.1f}")
    print(f"ipex_flash / sdpa = {speedup:.2f}x; same greedy tokens: {'yes' if same else 'NO'}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine(torch=torch.__version__, transformers=transformers.__version__,
                           torch_threads=torch.get_num_threads()),
        "args": {k: (str(v.relative_to(REPO)) if isinstance(v, Path) and v.is_relative_to(REPO)
                     else str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "prompt_tokens": int(lengths.sum()), "generated_tokens": generated,
        "best_seconds": best, "tokens_per_second": rate, "ipex_over_sdpa": speedup,
        "same_tokens": same}, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
