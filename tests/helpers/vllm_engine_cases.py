"""The scenarios vLLM's own engine runs in tests/serving/test_vllm_engine.py, and the rules its
outputs are compared by. Each scenario is one engine (vllm_engine/run_engine.py) run with
ipex_flash's backend ("ours", IPEX_FLASH_VLLM=1) and, where listed, with vLLM's own CPU_ATTN in
the same venv ("reference")."""
import random

# vLLM's own CPU attention serves every model here (decoder layers, windows, softcap, sinks,
# ALiBi, encoder-only layers), so it is the reference of each; transformers' generate() is not
# needed.
DECODERS = ("llama", "qwen3", "mistral", "gemma2", "gpt_oss", "bloom")
ENCODERS = ("bert",)  # served by vLLM's pooling runner: embeddings
MODELS = DECODERS + ENCODERS
ENGINE = dict(skip_tokenizer_init=True, block_size=32, enforce_eager=True, max_model_len=256,
              seed=0, gpu_memory_utilization=0.3)
# One engine through everything a serving step can be: prompts longer than a step's token
# budget (chunked prefill), prefills beside decodes (mixed steps), a cache too small for all
# of them at once (preemption and recomputation) and a second round of the same prompts
# (prefix caching, and prompts 3 and 5 share a prefix with prompt 2).
SERVING = dict(ENGINE, max_num_batched_tokens=64, max_num_seqs=8, enable_prefix_caching=True,
               num_gpu_blocks_override=14)


def token_ids(rng: random.Random, n: int) -> list:
    return [rng.randrange(3, 512) for _ in range(n)]  # (0-2: pad, bos, eos)


def serving_prompts(seed: int) -> list:
    rng = random.Random(seed)
    base = token_ids(rng, 146)
    return [base[:5], token_ids(rng, 40), base, base[:96] + token_ids(rng, 4),
            token_ids(rng, 120), base[:64] + token_ids(rng, 1)]


def plain_prompts(seed: int) -> list:
    # lengths off the 32-key pages and the 64-key blocks; longer than the sliding windows (24)
    rng = random.Random(seed)
    return [token_ids(rng, n) for n in (9, 40, 77, 150)]


def scenarios(models_dir) -> dict:
    """{name: (spec, runs)}: runs is ("ours", "reference") or ("ours",) or ("reference",)."""
    both = ("ours", "reference")
    out = {}

    def add(name, family, runs, llm, prompts, **extra):
        out[name] = (dict(name=name, model=str(models_dir / family), llm=llm,
                          prompts=prompts, max_tokens=16, **extra), runs)

    add("llama", "llama", both, dict(SERVING, dtype="float32"), serving_prompts(1),
        rounds=2)
    for seed, family in enumerate(DECODERS[1:], start=2):
        add(family, family, both, dict(ENGINE, dtype="float32"), plain_prompts(seed))
    # (its tokenizer is loaded by the pooling runner: tiny_models saves one)
    add("bert", "bert", both, dict(ENGINE, dtype="float32", runner="pooling",
                                   skip_tokenizer_init=False), plain_prompts(9), embed=True)
    lp = plain_prompts(10)  # the same prompts for the precision scenarios, logprobs of each
    add("llama_float32_logprobs", "llama", ("reference",), dict(ENGINE, dtype="float32"), lp,
        prompt_logprobs=0)
    add("llama_bfloat16", "llama", both, dict(ENGINE, dtype="bfloat16"), lp, prompt_logprobs=0)
    add("llama_fp8", "llama", ("ours",),
        dict(ENGINE, dtype="float32", kv_cache_dtype="fp8"), lp, prompt_logprobs=0)
    add("llama_fp8_e5m2", "llama", ("ours",),
        dict(ENGINE, dtype="float32", kv_cache_dtype="fp8_e5m2"), lp, prompt_logprobs=0)
    return out


def teacher_forced(run: dict) -> list:
    """Each prompt token's logprob given the tokens before it (the first has none)."""
    return [lp for prompt in run["prompt_logprobs"] for lp in prompt if lp is not None]


def first_divergence(a: list, b: list):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def agreed_logprobs(ours: dict, ref: dict) -> list:
    """(ours, reference) logprob pairs of the generated tokens both runs chose, up to each
    prompt's first different token (after it the contexts differ)."""
    pairs = []
    for ta, tb, la, lb in zip(ours["tokens"], ref["tokens"], ours["logprobs"],
                              ref["logprobs"]):
        end = first_divergence(ta, tb)
        pairs += list(zip(la, lb))[:end]
    return pairs
