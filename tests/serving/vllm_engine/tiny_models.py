"""Tiny random decoder models saved locally for vLLM's engine to load (no hub): each family's
config at a few layers and a small width, weights drawn from a fixed seed. Run inside the vLLM
venv (it imports transformers): python tiny_models.py OUT_DIR NAME [NAME ...]

Weights are drawn wider than the families' default (initializer_range 0.2 instead of 0.02), so
that a greedy step's best and second-best logits are apart by more than the rounding of
either backend: with the defaults the logits are near-uniform and greedy decoding compares
rounding, not attention.

save_word_tokenizer gives a model directory a tokenizer, for the servers' text prompts: one
word per token id ("<pad>", "<s>", "</s>", "<unk>", then "w4" ... "w511"), so a prompt's
text names its token ids and any generated id decodes to a word."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 512, 128, 4, 2, 32, 2
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              head_dim=HEAD_DIM, max_position_embeddings=1024, initializer_range=0.2,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# What each model brings to attention, and the window its sliding layers use.
WINDOW = 24
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    # A window shorter than the prompts, on every layer.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    # Softcap on the scores and the logits; sliding and global layers alternate.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"sliding_window": WINDOW, "attn_logit_softcapping": 20.0,
                "tie_word_embeddings": True,
                "final_logit_softcapping": 30.0, "query_pre_attn_scalar": HEAD_DIM,
                "hidden_activation": "gelu_pytorch_tanh",
                "layer_types": ["sliding_attention", "full_attention"]}),
    # ALiBi's slopes instead of rotary positions.
    "bloom": ("BloomConfig", "BloomForCausalLM",
              {"num_key_value_heads": HEADS, "tie_word_embeddings": True}),
    # Encoder-only attention (bidirectional, no KV cache), served as an embedding model.
    "bert": ("BertConfig", "BertModel", {"num_key_value_heads": HEADS}),
    # Learned sinks on every layer; sliding and global layers alternate; experts (MoE).
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "head_dim": 64, "layer_types": ["sliding_attention", "full_attention"]}),
}


def make(out_dir: Path, name: str) -> Path:
    import transformers

    config_cls, model_cls, extra = FAMILIES[name]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32)
    path = out_dir / name
    model.save_pretrained(path, safe_serialization=True)
    if name == "bert":  # vLLM's pooling runner loads a tokenizer, whatever the prompts
        save_word_tokenizer(path)
    return path


def save_word_tokenizer(model_dir: Path) -> None:
    """A word-level tokenizer over the whole vocabulary (whitespace splits words), saved as
    transformers' PreTrainedTokenizerFast beside the model, where vLLM's server loads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0-3: COMMON's pad, bos, eos, then unk
    words = special + [f"w{i}" for i in range(len(special), VOCAB)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                           unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>", unk_token="<unk>").save_pretrained(model_dir)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for family in sys.argv[2:]:
        print(make(out, family))
