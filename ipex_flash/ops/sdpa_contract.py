"""SDPA's contract (ipex_flash/sdpa.py): what torch's scaled_dot_product_attention would refuse,
with torch's exception types and messages where torch raises."""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash.ops.validation import dropout_p_error, mask_type_error, tensor_error


def sdpa_contract_error(fn: str, query, key, value, attn_mask, dropout_p, is_causal,
                        enable_gqa) -> Optional[Exception]:
    """What SDPA's contract says is wrong with a call (the exception to raise), or None. It
    returns rather than raises, so that the override can ask it under torch.compile too."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if (error := tensor_error(fn, name, t)) is not None:
            return error
        if t.dim() < 2:
            return ValueError(f"{fn}: {name} must have at least 2 dimensions (..., L, E), got "
                              f"shape {tuple(t.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        return RuntimeError(f"{fn}: expected query, key, and value to have the same dtype, "
                            f"got {query.dtype}, {key.dtype} and {value.dtype}")
    if query.dim() != key.dim() or key.dim() != value.dim() or \
            query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]:
        return RuntimeError(f"{fn}: query, key and value must have the same leading (batch) "
                            f"dimensions, got {tuple(query.shape)}, {tuple(key.shape)} and "
                            f"{tuple(value.shape)}")
    if key.shape[-1] != query.shape[-1]:
        return ValueError(f"{fn}: key's head dim (last dimension) must equal query's "
                          f"({query.shape[-1]}), got {key.shape[-1]}")
    for name, t in (("query", query), ("value", value)):
        if t.shape[-1] < 1:
            return ValueError(f"{fn}: {name}'s head dim (last dimension) must be at least 1, "
                              f"got shape {tuple(t.shape)}")
    heads_q = query.shape[-3] if query.dim() >= 3 else 1
    heads_kv = key.shape[-3] if key.dim() >= 3 else 1
    if heads_q != heads_kv and not (heads_kv == 1 or (enable_gqa and heads_q % heads_kv == 0)):
        return RuntimeError(
            f"{fn}: query has {heads_q} heads and key/value {heads_kv}: the number of heads in "
            "key and value must equal query's, be 1, or divide it with enable_gqa=True")
    if not isinstance(is_causal, bool):
        return TypeError(f"{fn}: is_causal must be a bool, got {type(is_causal).__name__}")
    if (error := dropout_p_error(fn, dropout_p) or mask_type_error(fn, attn_mask)) is not None:
        return error
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in (torch.float32, query.dtype):
            return RuntimeError(f"{fn}: expected attn_mask dtype to be bool or float32 or to "
                                f"match query dtype, got {attn_mask.dtype} and {query.dtype}")
        full = (*query.shape[:-2], query.shape[-2], key.shape[-2])
        shape = tuple(attn_mask.shape)  # broadcasts to exactly `full`, torch's rules
        if len(shape) > len(full) or any(s not in (1, f) for s, f in
                                         zip(reversed(shape), reversed(full))):
            return RuntimeError(f"{fn}: attn_mask of shape {shape} does not broadcast to "
                                f"(..., Hq, L, S) = {full}")
    return None
