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
stays free of "flash" for everything else (transformers_attention.py says why). enable_continuous_batching() switches a
model to PAGED_BACKEND, which also serves generate() through BACKEND's mask path; loading with
attn_implementation=PAGED_BACKEND does the same except for models that swap a "flash" name they
do not list for a kernel of their own (GPT-OSS). Before 5.19, continuous batching runs a model
under "paged|" + its name, which register() provides for both names.
"""
from __future__ import annotations

import torch

try:  # what the backend uses of transformers, so that a missing one is named here
    from transformers import AttentionInterface, AttentionMaskInterface  # noqa: F401
    from transformers.masking_utils import sdpa_mask  # noqa: F401
except ImportError as error:  # transformers is an optional dependency of ipex_flash
    raise ImportError(
        "ipex_flash.integrations.transformers needs Hugging Face transformers: "
        "pip install ipex_flash[transformers]"
    ) from error

# The names and the mask-path attention function live in transformers_attention.py, which
# continuous batching (transformers_paged.py) builds on too.
from ipex_flash.integrations.transformers_attention import (  # noqa: F401,E402
    BACKEND, PAGED_BACKEND, attention_forward, register_attention)


def enable_continuous_batching(model: torch.nn.Module) -> str:
    """Readies a model for generate_batch and ContinuousBatchingManager (registering the
    backend) and returns the name continuous batching runs it under; generate() keeps working.
    See transformers_paged.enable_continuous_batching."""
    # Imported on use, so that importing this module does not load transformers' continuous
    # batching.
    from ipex_flash.integrations import transformers_paged

    return transformers_paged.enable_continuous_batching(model)


def register() -> str:
    """Makes BACKEND and PAGED_BACKEND valid attn_implementations for every transformers
    model; returns BACKEND.

    Registers the attention function and, under the same name, transformers' SDPA mask
    function: transformers builds no mask at all for a name that has no mask function. The
    continuous-batching names are registered by transformers_paged.register_paged().
    Calling it again is harmless.
    """
    from ipex_flash.integrations import transformers_paged  # (on use: see above)

    register_attention()
    transformers_paged.register_paged()
    return BACKEND
