"""The vLLM side of benchmark_vllm_generate.py: runs inside the vLLM venv, one process per
attention backend (the environment's IPEX_FLASH_VLLM picks it, as vLLM loads its plugins once
per process).

    python vllm_generate_driver.py model SPEC.json   # saves the random Llama SPEC describes
    python vllm_generate_driver.py time SPEC.json OUT.json

SPEC: {"model" (a directory), "config": {LlamaConfig's keyword arguments}, "llm": {LLM's
keyword arguments}, "batches": [prompts per generate], "prompt_len", "new_tokens", "repeats",
"seed"}. OUT: {"versions", "start_s", "rows": [{"batch", "prompt_tokens", "prefill_s",
"generate_s", "generated_tokens", "tokens"}]}.

Each batch is timed twice per repeat: generate with max_tokens=1 (the prefill, whose one
sampled token is the prefill's own output) and with max_tokens=1+new_tokens (the same prefill,
then new_tokens decode steps); the best of the repeats of each is kept. Every batch size runs
once untimed first: the kernels of a shape compile at its first use.
"""
from __future__ import annotations

import json
import sys
import time


def save_model(spec: dict) -> None:
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    config = transformers.LlamaConfig(**spec["config"])
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(spec["model"], safe_serialization=True)


def prompts(spec: dict, count: int) -> list[dict]:
    import torch

    generator = torch.Generator().manual_seed(spec["seed"] + count)
    ids = torch.randint(3, spec["config"]["vocab_size"], (count, spec["prompt_len"]),
                        generator=generator)
    return [{"prompt_token_ids": row.tolist()} for row in ids]


def timed(llm, batch: list[dict], max_tokens: int) -> tuple[float, list]:
    from vllm import SamplingParams

    # ignore_eos: every request generates max_tokens, so the token counts are exact.
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                            ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, [list(o.outputs[0].token_ids) for o in outputs]


def measure(spec: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["llm"])
    start_s = time.perf_counter() - started
    batches = {count: prompts(spec, count) for count in spec["batches"]}
    whole = 1 + spec["new_tokens"]
    for batch in batches.values():  # compiles each shape's kernels
        timed(llm, batch, whole)
    prefill = {count: [] for count in batches}
    generate = {count: [] for count in batches}
    tokens = {}
    for _ in range(spec["repeats"]):
        for count, batch in batches.items():
            prefill[count].append(timed(llm, batch, 1)[0])
            seconds, tokens[count] = timed(llm, batch, whole)
            generate[count].append(seconds)
    llm.llm_engine.engine_core.shutdown()
    return {"versions": {"vllm": vllm.__version__, "torch": torch.__version__},
            "start_s": start_s,
            "rows": [{"batch": count, "prompt_tokens": count * spec["prompt_len"],
                      "prefill_s": min(prefill[count]), "generate_s": min(generate[count]),
                      "generated_tokens": count * whole, "tokens": tokens[count]}
                     for count in batches]}


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    with open(sys.argv[2]) as f:
        spec = json.load(f)
    if sys.argv[1] == "model":
        save_model(spec)
    else:
        result = measure(spec)
        with open(sys.argv[3], "w") as f:
            json.dump(result, f)
