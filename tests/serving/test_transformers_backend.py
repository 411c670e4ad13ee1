"""The transformers attention backend (ipex_flash.integrations.transformers) against transformers'
own eager attention, on tiny random models: same weights, same inputs, fp32 logits within 1e-5,
identical greedy generations, and matching gradients."""
import functools
import subprocess
import sys
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    reason="the backend's tests need transformers: pip install ipex_flash[transformers]",
)

import ipex_flash  # noqa: E402
from ipex_flash.integrations import transformers as backend  # noqa: E402

TOLERANCE = dict(rtol=1e-5, atol=1e-5)
VOCAB = 128
SEQ_LEN = 12
SLIDING_WINDOW = 5  # shorter than SEQ_LEN, so windows cut real keys off
NEW_TOKENS = 8
# Weights larger than transformers' default (0.02), so attention is far from uniform and the
# softcap, sinks and masks change the logits well beyond the tolerance.
INIT_STD = 0.2
SMALL_MODEL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   initializer_range=INIT_STD)


@dataclass(frozen=True)
class ModelCase:
    name: str
    make_config: Callable[[], "transformers.PretrainedConfig"]
    auto_class: str
    causal: bool = True
    # Why packed sequences (several sequences in one row, told apart by position_ids that restart
    # at 0) are not tested, or None when they are.
    no_packing_reason: Optional[str] = None


CASES = [
    # GQA: 4 query heads share 2 key/value heads.
    ModelCase("llama", lambda: transformers.LlamaConfig(**SMALL_MODEL), "AutoModelForCausalLM"),
    ModelCase("mistral", lambda: transformers.MistralConfig(
        **SMALL_MODEL, sliding_window=SLIDING_WINDOW), "AutoModelForCausalLM"),
    # Alternating sliding and full layers, logits soft-capped at a size the scores reach.
    ModelCase("gemma2", lambda: transformers.Gemma2Config(
        **SMALL_MODEL, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
        attn_logit_softcapping=2.0), "AutoModelForCausalLM"),
    # Attention sinks, alternating windows, a small mixture of experts. Plain RoPE: GPT-OSS's
    # YaRN defaults assume a 4096-token base context and warn on a 64-token model.
    ModelCase("gpt_oss", lambda: transformers.GptOssConfig(
        **SMALL_MODEL, head_dim=16, sliding_window=SLIDING_WINDOW, num_local_experts=4,
        num_experts_per_tok=2, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        "AutoModelForCausalLM",
        no_packing_reason="GPT-OSS builds its masks without position_ids, so transformers "
                          "never sees the packing"),
    # Bidirectional encoder; dropout off so a training step is deterministic.
    ModelCase("bert", lambda: transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, initializer_range=INIT_STD,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), "AutoModelForMaskedLM",
        causal=False,
        no_packing_reason="BERT builds its mask without position_ids, so it has no packed format"),
]
CAUSAL_CASES = [case for case in CASES if case.causal]
# (the models that have no packed format are not cases of the packed test: no_packing_reason)
PACKING_CASES = [case for case in CASES if not case.no_packing_reason]


def case_ids(case):
    return case.name


def build_pair(case: ModelCase):
    """(eager model, ipex model) with identical weights, in eval mode."""
    backend.register()
    auto_class = getattr(transformers, case.auto_class)
    torch.manual_seed(zlib.crc32(case.name.encode()))
    eager = auto_class.from_config(case.make_config(), attn_implementation="eager")
    if case.name == "gpt_oss":
        # Sinks start as small as the other weights; make them large enough to matter.
        with torch.no_grad():
            for layer in eager.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    ipex = auto_class.from_config(case.make_config(), attn_implementation=backend.BACKEND)
    ipex.load_state_dict(eager.state_dict())
    assert ipex.config._attn_implementation == backend.BACKEND
    return eager.eval(), ipex.eval()


cached_pair = functools.lru_cache(maxsize=None)(build_pair)


def random_ids(batch, length):
    return torch.randint(3, VOCAB, (batch, length))


def left_padded_batch():
    """Two rows; the second starts with 4 padding positions."""
    input_ids = random_ids(2, SEQ_LEN)
    attention_mask = torch.ones(2, SEQ_LEN, dtype=torch.long)
    attention_mask[1, :4] = 0
    input_ids[1, :4] = 0
    return input_ids, attention_mask


def logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


# Forward passes.


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_logits_single_sequence(case):
    eager, ipex = cached_pair(case)
    input_ids = random_ids(1, SEQ_LEN)
    got, want = logits(ipex, input_ids=input_ids), logits(eager, input_ids=input_ids)
    torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_logits_left_padded_batch(case):
    eager, ipex = cached_pair(case)
    input_ids, attention_mask = left_padded_batch()
    got = logits(ipex, input_ids=input_ids, attention_mask=attention_mask)
    want = logits(eager, input_ids=input_ids, attention_mask=attention_mask)
    # A causal model's padding rows see no key at all: eager spreads them uniformly over the
    # masked keys, the kernels return 0. Neither reaches a real token, so only real rows count.
    rows = attention_mask.bool() if case.causal else torch.ones(2, SEQ_LEN, dtype=torch.bool)
    torch.testing.assert_close(got[rows], want[rows], **TOLERANCE)


@pytest.mark.parametrize("case", PACKING_CASES, ids=case_ids)
def test_logits_packed_sequences(case):
    eager, ipex = cached_pair(case)
    input_ids = random_ids(1, SEQ_LEN)
    # Sequences of 6, 4 and 2 tokens in one row, the first longer than the window.
    position_ids = torch.cat([torch.arange(6), torch.arange(4), torch.arange(2)])[None]
    # transformers looks for packing only without a KV cache, hence use_cache=False.
    packed = dict(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    got = logits(ipex, **packed)
    torch.testing.assert_close(got, logits(eager, **packed), **TOLERANCE)
    # The sequences must not see each other: the last one alone gives the same logits.
    alone = logits(ipex, input_ids=input_ids[:, 10:], position_ids=position_ids[:, 10:])
    torch.testing.assert_close(got[:, 10:], alone, **TOLERANCE)


# Generation.


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("case", CAUSAL_CASES, ids=case_ids)
def test_greedy_generation_matches_eager(case, cache):
    eager, ipex = cached_pair(case)
    input_ids, attention_mask = left_padded_batch()
    options = dict(attention_mask=attention_mask, max_new_tokens=NEW_TOKENS,
                   min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    got = ipex.generate(input_ids, **options)
    want = eager.generate(input_ids, **options)
    assert got.shape == (2, SEQ_LEN + NEW_TOKENS)
    assert torch.equal(got, want), f"ipex:\n{got}\neager:\n{want}"


# Training.


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_training_step_gradients(case):
    eager, ipex = build_pair(case)  # fresh models: gradients and train mode stay out of the cache
    input_ids, attention_mask = left_padded_batch()
    labels = random_ids(*input_ids.shape).masked_fill(attention_mask == 0, -100)
    for model in (eager, ipex):
        model.train()
        output = model(input_ids=input_ids, attention_mask=attention_mask)
        torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), labels.flatten()).backward()
    eager_grads = {name: param.grad for name, param in eager.named_parameters()}
    # The absolute tolerance is relative to the model's largest gradient: some gradients are 0
    # in exact arithmetic (a key bias shifts a whole softmax row) and are fp32 noise in both.
    atol = 1e-5 * max(grad.abs().max().item() for grad in eager_grads.values() if grad is not None)
    for name, param in ipex.named_parameters():
        want = eager_grads[name]
        assert (param.grad is None) == (want is None), name
        if want is not None:
            torch.testing.assert_close(param.grad, want, rtol=1e-5, atol=atol,
                                       msg=lambda message: f"{name}: {message}")


# Registration and dispatch.


def test_register_is_idempotent_and_returns_the_name():
    assert backend.register() == backend.BACKEND
    assert backend.register() == backend.BACKEND
    assert transformers.AttentionInterface()[backend.BACKEND] is backend.attention_forward
    sdpa_mask = transformers.masking_utils.sdpa_mask
    assert transformers.AttentionMaskInterface()[backend.BACKEND] is sdpa_mask


def test_name_avoids_substrings_transformers_reserves():
    # "flash" is loaded as a flash-attn package; "sdpa" is refused by models without SDPA support.
    assert "flash" not in backend.BACKEND and "sdpa" not in backend.BACKEND


def test_forward_runs_on_ipex_flash(monkeypatch):
    """Every attention layer calls ipex_flash: the comparisons above are not eager vs eager."""
    eager, ipex = cached_pair(CASES[0])
    calls = []
    real = ipex_flash.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ipex_flash, "scaled_dot_product_attention", counting)
    logits(ipex, input_ids=random_ids(1, SEQ_LEN))
    assert calls == [True] * eager.config.num_hidden_layers


def test_set_attn_implementation_switches_backend():
    eager, _ = build_pair(CASES[0])
    input_ids = random_ids(1, SEQ_LEN)
    want = logits(eager, input_ids=input_ids)
    eager.set_attn_implementation(backend.BACKEND)
    assert eager.config._attn_implementation == backend.BACKEND
    torch.testing.assert_close(logits(eager, input_ids=input_ids), want, **TOLERANCE)


def test_importing_ipex_flash_does_not_import_transformers():
    code = "import sys, ipex_flash; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_continuous_batching_module_does_not_import_the_public_one():
    """transformers_paged builds on transformers_attention, not on the public module, which
    imports it on use: the two do not import each other."""
    code = ("import sys, ipex_flash.integrations.transformers_paged; "
            "assert 'ipex_flash.integrations.transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    monkeypatch.delitem(sys.modules, "ipex_flash.integrations.transformers")
    with pytest.raises(ImportError, match=r"pip install ipex_flash\[transformers\]"):
        import ipex_flash.integrations.transformers  # noqa: F401
