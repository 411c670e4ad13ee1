"""The transformers backend's two names and its attention function over transformers' SDPA
masks: what the public module (transformers.py) and continuous batching (transformers_paged.py)
both build on, kept here so that neither imports the other.

Outside continuous batching both names run attention_forward: transformers' SDPA mask (a
(B, 1, Nq, Nk) boolean mask, or none when `is_causal` says it all) goes to the kernels as it
is, with Gemma2's logit softcap and GPT-OSS's attention sinks.
"""
from __future__ import annotations

from typing import Optional

import torch

import ipex_flash
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

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


def register_attention() -> None:
    """Registers BACKEND's attention function and, under the same name, transformers' SDPA mask
    function: transformers builds no mask at all for a name that has no mask function.
    Idempotent."""
    AttentionInterface.register(BACKEND, attention_forward)
    AttentionMaskInterface.register(BACKEND, sdpa_mask)
