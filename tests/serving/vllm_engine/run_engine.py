"""Runs vLLM's own engine (`LLM.generate`) on scenarios and writes what it generated; run
inside the vLLM venv by tests/serving/test_vllm_engine.py and the generate benchmark:

    python run_engine.py SPEC.json OUT.json

SPEC: {"scenarios": [{"name", "model" (a directory), "llm": {LLM's keyword arguments},
"prompts": [[token ids], ...], "max_tokens", "prompt_logprobs" and "rounds" (optional: the
prompts generated that many times over, each round's outputs listed after the last's), "embed"
(optional: an encoder model's embeddings instead: OUT's "embeddings")}, ...]}. Each
scenario is an engine of its own, started, run and shut down in turn in this process. Which
attention backend serves them is the environment's business (IPEX_FLASH_VLLM=1 or not).

OUT: {name: {"tokens": [[ids] per prompt], "logprobs": [[the chosen tokens' logprobs]], "top2":
[[each step's two likeliest [token, logprob]]],
"prompt_logprobs": [[each prompt token's logprob given the ones before, None for the first]],
"metrics": {counter: value}, "start_s", "generate_s", "prompt_tokens", "generated_tokens"}}.
"""
from __future__ import annotations

import gc
import json
import sys
import time

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions")


def run(scenario: dict) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    # Stats on: the prefix-cache and preemption counters are read after the run.
    llm = LLM(model=scenario["model"], **{"disable_log_stats": False, **scenario["llm"]})
    ready = time.perf_counter()
    if scenario.get("embed"):  # an encoder (pooling) model: its embeddings, no generation
        outputs = llm.embed([{"prompt_token_ids": p} for p in scenario["prompts"]],
                            use_tqdm=False)
        result = {"embeddings": [list(o.outputs.embedding) for o in outputs],
                  "start_s": ready - started, "generate_s": time.perf_counter() - ready}
        llm.llm_engine.engine_core.shutdown()
        return result
    params = SamplingParams(max_tokens=scenario["max_tokens"], temperature=0.0, logprobs=2,
                            prompt_logprobs=scenario.get("prompt_logprobs"),
                            detokenize=False, ignore_eos=True)
    outputs = []
    for _ in range(scenario.get("rounds", 1)):  # a second round finds the prompts cached
        outputs += llm.generate([{"prompt_token_ids": p} for p in scenario["prompts"]], params,
                                use_tqdm=False)
    done = time.perf_counter()
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "logprobs": [[step[t].logprob for step, t in zip(o.outputs[0].logprobs,
                                                          o.outputs[0].token_ids)]
                     for o in outputs],
        # each step's two likeliest tokens, [[token, logprob], [token, logprob]]
        "top2": [[sorted(([t, lp.logprob] for t, lp in step.items()), key=lambda x: -x[1])[:2]
                  for step in o.outputs[0].logprobs] for o in outputs],
        "prompt_logprobs": [None if o.prompt_logprobs is None else
                            [None if step is None else step[t].logprob
                             for step, t in zip(o.prompt_logprobs, o.prompt_token_ids)]
                            for o in outputs],
        "metrics": {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS},
        "start_s": ready - started, "generate_s": done - ready,
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
    }
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    results = {}
    for scenario in spec["scenarios"]:
        results[scenario["name"]] = run(scenario)
        with open(out_path, "w") as f:  # what finished is kept if a later scenario fails
            json.dump(results, f)


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    main(sys.argv[1], sys.argv[2])
