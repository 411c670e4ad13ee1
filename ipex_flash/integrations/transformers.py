"""Hugging Face transformers attention backend that runs ipex_flash's kernels.

    from transformers import AutoModelForCausalLM
    from ipex_flash.integrations import transformers as ipex_transformers

    ipex_transformers.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="ipex_attention")
    # or, on a model already built: model.set_attn_implementation(ipex_transformers.BACKEND)

    # Continuous batching (generate_batch, ContinuousBatchingManager); generate() keeps working:
    ipex_transformers.enable_continuous_batching(model)
    outputs = model.generate_batch(prompts, generation_config)

The backend keeps transformers' SDPA masks (a (B, 1, Nq, Nk) boolean mask, or none when
`is_causal` says it all), so padding, packed sequences and sliding windows reach the kernels as
that mask; Gemma2's logit softcap and GPT-OSS's attention sinks are passed to the kernels.

Two names, because transformers decides by name what a continuous-batching step hands over.
From 5.19 it admits only "sdpa", "paged|eager" and names containing "flash" into continuous
batching, and gives a "flash" name flash-attn's inputs: no mask, packed sequences with their
cumulative lengths, and the paged cache or its block table (transformers_paged.py). BACKEND
stays free of "flash" for everything else (see below). enable_continuous_batching() switches a
model to PAGED_BACKEND, which also serves generate() through BACKEND's mask path; loading with
attn_implementation=PAGED_BACKEND does the same except for models that swap a "flash" name they
do not list for a kernel of their own (GPT-OSS). Before 5.19, continuous batching runs a model
under "paged|" + its name, which register() provides for both names.
"""
from __future__ import annotations

from typing import Optional

import torch

import ipex_flash

try:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask
except ImportError as error:  # transformers is an optional dependency of ipex_flash
    raise ImportError(
        "ipex_flash.integrations.transformers needs Hugging Face transformers: "
        "pip install ipex_flash[transformers]"
    ) from error

# The name models are given as attn_implementation. transformers gives names special meaning by
# substring: one containing "flash" is taken for a flash-attn package and loaded as one, and one
# containing "sdpa" is refused by every model that sets _supports_sdpa = False, which includes
# Gemma2 (softcap) and GPT-OSS (sinks), two of the models this backend exists for.
BACKEND = "ipex_attention"
# The continuous-batching name. "flash" admits it (transformers_paged.py loads ipex_flash for it
# where transformers looks for a flash-attn package), and "flash...2" is what transformers
# requires of a name before it uses flash_attn_with_kvcache's block table on an XPU device.
PAGED_BACKEND = "ipex_flash_attention_2"


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, Nq, D), key and value
    (B, Hkv, Nk, D) in, (B, Nq, Hq, D) contiguous out, and no attention weights.

    sliding_window is accepted and not used: the mask function (sdpa_mask) has already folded
    the window into attention_mask whenever the keys reach past it.
    """
    if kwargs.get("cache") is not None:
        # A continuous-batching step hands over the paged cache and packed sequences, which
        # only PAGED_BACKEND's function reads; transformers gives it to this name only if a
        # model was switched here by hand.
        raise NotImplementedError(
            f"attn_implementation={BACKEND!r} does not read continuous batching's paged KV "
            f"cache; enable_continuous_batching(model) switches the model to {PAGED_BACKEND!r}, "
            "which serves generate_batch and ContinuousBatchingManager"
        )
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError(
            f"attn_implementation={BACKEND!r} does not support a learned position bias "
            "(T5-style models); use 'sdpa' or 'eager'"
        )

    query_length = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # As in transformers' sdpa backend: the mask function returns no mask exactly when a plain
    # top-left causal pattern (or nothing) is right, and a single query row attends to every
    # cached key, so it must not be masked causally.
    is_causal = bool(is_causal) and attention_mask is None and query_length > 1
    if is_causal and key.shape[2] > query_length:
        # Prefill into an empty static cache: the slots past the prompt are unused and a
        # top-left causal mask hides them anyway, so skip reading them.
        key = key[:, :, :query_length]
        value = value[:, :, :query_length]

    output = ipex_flash.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=is_causal,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
        softcap=softcap,
        sinks=s_aux,
    )
    return output.transpose(1, 2).contiguous(), None


def enable_continuous_batching(model: torch.nn.Module) -> str:
    """Readies a model for generate_batch and ContinuousBatchingManager (registering the
    backend) and returns the name continuous batching runs it under; generate() keeps working.
    See transformers_paged.enable_continuous_batching."""
    from ipex_flash.integrations import transformers_paged  # it imports this module

    return transformers_paged.enable_continuous_batching(model)


def register() -> str:
    """Makes BACKEND and PAGED_BACKEND valid attn_implementations for every transformers
    model; returns BACKEND.

    Registers the attention function and, under the same name, transformers' SDPA mask
    function: transformers builds no mask at all for a name that has no mask function. The
    continuous-batching names are registered by transformers_paged.register_paged().
    Calling it again is harmless.
    """
    from ipex_flash.integrations import transformers_paged  # it imports this module

    AttentionInterface.register(BACKEND, attention_forward)
    AttentionMaskInterface.register(BACKEND, sdpa_mask)
    transformers_paged.register_paged()
    return BACKEND
