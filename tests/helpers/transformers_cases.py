"""The continuous-batching tests' tiny random models (tests/serving/test_transformers_*.py):
one case per model family with the features the kernels take (sliding window, softcap, sinks)
and the configs that remove each, the same weights under every attention implementation, the
prompts, and transformers' generate() and generate_batch() as the tests call them."""
import functools
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import transformers
from transformers import ContinuousBatchingConfig, GenerationConfig

from ipex_flash.integrations import transformers as backend
from ipex_flash.integrations import transformers_paged as paged

VOCAB = 128
SLIDING_WINDOW = 5
PROMPT_LENGTHS = (12, 9, 7)  # all longer than the window
NEW_TOKENS = 8
# Weights larger than transformers' default (0.02), so attention is far from uniform and the
# softcap, sinks and windows change the tokens.
INIT_STD = 0.2
SMALL_MODEL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   initializer_range=INIT_STD)
NO_WINDOW = dict(sliding_window=64)  # longer than any sequence here
# Fewer tokens per step than the prompts hold: prefills are split into chunks that attend to
# keys already in the paged cache, and later steps mix prefill chunks with decodes.
MAX_BATCH_TOKENS = 16


def _weak_sinks(model):
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-30.0)


@dataclass(frozen=True, eq=False)  # hashed by identity: the cache key of its models
class Case:
    name: str
    make_config: Callable[..., "transformers.PretrainedConfig"]  # keyword overrides -> config
    runs_sdpa: bool  # False: the model refuses sdpa (softcap, sinks)
    # feature -> (config overrides, edit of the built model) that remove it
    ablations: dict = field(default_factory=dict)


CASES = [
    Case("llama", lambda **kw: transformers.LlamaConfig(**{**SMALL_MODEL, **kw}), True),
    Case("qwen3", lambda **kw: transformers.Qwen3Config(**{**SMALL_MODEL, "head_dim": 16, **kw}),
         True),
    Case("mistral", lambda **kw: transformers.MistralConfig(
        **{**SMALL_MODEL, "sliding_window": SLIDING_WINDOW, **kw}), True,
        {"sliding window": (NO_WINDOW, None)}),
    # Untied embeddings: tied ones, scaled up by Gemma, make a tiny model repeat its last token.
    Case("gemma2", lambda **kw: transformers.Gemma2Config(**{
        **SMALL_MODEL, "head_dim": 16, "query_pre_attn_scalar": 16, "tie_word_embeddings": False,
        "sliding_window": SLIDING_WINDOW, "attn_logit_softcapping": 2.0, **kw}), False,
        {"softcap": (dict(attn_logit_softcapping=None), None),
         "sliding window": (NO_WINDOW, None)}),
    Case("gpt_oss", lambda **kw: transformers.GptOssConfig(**{
        **SMALL_MODEL, "head_dim": 16, "sliding_window": SLIDING_WINDOW, "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rope_parameters": dict(rope_type="default", rope_theta=10000.0), **kw}), False,
        {"sinks": ({}, _weak_sinks), "sliding window": (NO_WINDOW, None)}),
]
SDPA_CASES = [case for case in CASES if case.runs_sdpa]


def case_ids(case):
    return case.name


def build(case: Case, attn_implementation: str, overrides: Optional[dict] = None, edit=None):
    """The case's model with the case's weights (the same for every implementation)."""
    backend.register()
    torch.manual_seed(zlib.crc32(case.name.encode()))
    model = transformers.AutoModelForCausalLM.from_config(
        case.make_config(**(overrides or {})), attn_implementation=attn_implementation)
    if case.name == "gpt_oss":
        # Sinks start as small as the other weights; make them large enough to matter.
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    if edit is not None:
        edit(model)
    return model.eval()


@functools.lru_cache(maxsize=None)
def ipex_model(case: Case):
    model = build(case, backend.BACKEND)
    assert backend.enable_continuous_batching(model) == paged.continuous_batching_name()
    return model


def prompts(lengths=PROMPT_LENGTHS):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def generation_config(new_tokens=NEW_TOKENS):
    return GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                            pad_token_id=0)


def cb_config(**options):
    return ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=MAX_BATCH_TOKENS, **options)


def generate_alone(model, prompt_list, new_tokens=NEW_TOKENS):
    """Each prompt's greedy tokens from generate() on its own (no padding, no batching)."""
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompt_list]


def generate_batch(model, prompt_list, **options):
    """generate_batch's tokens in prompt order; every request must have finished cleanly."""
    outputs = model.generate_batch(prompt_list, generation_config=generation_config(),
                                   continuous_batching_config=cb_config(**options),
                                   progress_bar=False, warmup=False)
    by_prompt = {tuple(out.prompt_ids): out for out in outputs.values()}
    assert len(by_prompt) == len(prompt_list), "requests went missing (see the captured log)"
    for out in by_prompt.values():
        assert out.error is None, out.error
    return [by_prompt[tuple(p)].generated_tokens for p in prompt_list]


@functools.lru_cache(maxsize=None)
def eager_tokens(case: Case, feature: Optional[str] = None):
    overrides, edit = case.ablations[feature] if feature else ({}, None)
    return generate_alone(build(case, "eager", overrides, edit), prompts())
