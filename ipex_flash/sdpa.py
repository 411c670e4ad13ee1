"""torch.nn.functional.scaled_dot_product_attention's contract on ipex_flash's kernels, and a
switch that routes unchanged models' SDPA calls to it."""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch
from torch.utils._device import DeviceContext

from ipex_flash.ops import fast_path, launch
from ipex_flash.ops.sdpa_contract import sdpa_contract_error
from ipex_flash.ops.validation import SUPPORTED_DTYPES, head_dim_error, raise_error, scale_error

Tensor = torch.Tensor
_FN = "ipex_flash.scaled_dot_product_attention"


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *, softcap: Optional[float] = None,
                                 sinks: Optional[Tensor] = None) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention, computed by FlashAttention kernels.

    query (..., Hq, L, E), key (..., Hkv, S, E) and value (..., Hkv, S, Ev) with the same
    leading dimensions (any number, including none); the output is (..., Hq, L, Ev).
    E, Ev <= 256 (Ev may differ from E, as in MLA's 192 / 128). Hkv must equal Hq, or be 1, or divide Hq with enable_gqa.
    attn_mask: bool (True = take part) or additive float (float32 or the query's dtype),
    broadcastable to (..., Hq, L, S); read in place (broadcast dimensions are never expanded
    in memory); blocks it hides entirely are skipped. is_causal is top-left aligned and, as in
    torch, combined with attn_mask when both are given. Rows that see no key give 0 (also
    when there are no keys at all, S = 0, as torch).

    Beyond SDPA: softcap (> 0: scores s become softcap * tanh(s / softcap) before the mask is
    added, Gemma 2) and sinks ((Hq,) logits that join every row's softmax denominator and
    contribute no value, GPT-OSS).

    Differentiable in query, key, value, sinks and a float attn_mask that requires grad.
    """
    if (dropout_p == 0.0 and type(is_causal) is bool
            and not fast_path.needs_dispatcher(query, key, value, attn_mask, sinks)
            and query.dim() == 4):
        # Nothing for autograd or tracing: the launch plan of this signature, made after the
        # first call of it has been checked and run.
        return fast_path.sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                              float(softcap or 0.0), sinks, lambda: _general(
                                  query, key, value, attn_mask, 0.0, is_causal, scale,
                                  enable_gqa, softcap, sinks))
    return _general(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                    softcap, sinks)


def _general(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, softcap,
             sinks) -> Tensor:
    raise_error(sdpa_contract_error(_FN, query, key, value, attn_mask, dropout_p, is_causal,
                                    enable_gqa))
    lead = query.shape[:-3] if query.dim() >= 3 else ()
    q, k, v = (_as_bhnd(t) for t in (query, key, value))
    mask = None
    if attn_mask is not None:
        mask = attn_mask.expand(*lead, q.shape[1], q.shape[2], k.shape[2])
        mask = mask.reshape(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    seed = launch.draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    # 4-D calls keep their plans in fast_path.sdpa.
    out = fast_path.forward(q, k, v, is_causal, scale, dropout_p, seed, False, mask, sinks,
                            float(softcap or 0.0), plans=query.dim() != 4)[0]
    return out if query.dim() == 4 else out.reshape(query.shape[:-1] + (value.shape[-1],))


def _as_bhnd(t: Tensor) -> Tensor:
    """(..., H, N, D) as (B, H, N, D), B the product of the leading dimensions (a view
    whenever the strides allow; given, not inferred, so that empty tensors reshape too)."""
    if t.dim() == 2:
        return t.unsqueeze(0).unsqueeze(0)
    if t.dim() == 3:
        return t.unsqueeze(0)
    return t if t.dim() == 4 else t.reshape(math.prod(t.shape[:-3]), *t.shape[-3:])


# ---- routing unchanged models' torch.nn.functional.scaled_dot_product_attention ----

_torch_sdpa = torch.nn.functional.scaled_dot_product_attention


def serves(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
           enable_gqa=False) -> bool:
    """Whether ipex_flash takes this SDPA call (the override sends the rest to torch): the
    contract holds, and the inputs are ones the kernels take."""
    if any(isinstance(t, torch.Tensor) and t.is_nested for t in (query, key, value)):
        return False
    if sdpa_contract_error(_FN, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return False
    if query.dim() < 3 or query.device.type not in ("cpu", "xpu") or \
            query.dtype not in SUPPORTED_DTYPES:
        return False
    if key.device != query.device or value.device != query.device:
        return False
    if head_dim_error(_FN, query.shape[-1], value.shape[-1]) is not None:
        return False
    if scale_error(_FN, scale) is not None:
        return False
    return attn_mask is None or attn_mask.device == query.device


def _intercepted(tensors: tuple) -> bool:
    """Whether torch would hand this call to something else first: a tensor subclass (DTensor)
    or a torch function mode other than a device context, such as torch's context_parallel,
    which turns SDPA into ring attention over the ranks' shards. Taking such a call here would
    attend over the local shard alone."""
    if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors):
        return True
    if torch.compiler.is_compiling():  # (the compiler traces the modes itself)
        return False
    return any(not isinstance(mode, DeviceContext)
               for mode in torch.overrides._get_current_function_mode_stack())


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
    tensors = tuple(t for t in (query, key, value, attn_mask) if isinstance(t, torch.Tensor))
    if not _intercepted(tensors) and serves(query, key, value, attn_mask, dropout_p, is_causal,
                                            scale, enable_gqa):
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                            scale, enable_gqa)
    return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                       is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


# Named as the function it stands in for: code that patches torch.nn.functional's function by
# its __name__ (torch's context_parallel wraps it so that its calls see DTensors, which
# _intercepted then hands back to torch) must find it under that name.
_routed_sdpa.__name__ = _routed_sdpa.__qualname__ = "scaled_dot_product_attention"


def enable_sdpa_override(enabled: bool = True) -> None:
    """Routes (or stops routing) torch.nn.functional.scaled_dot_product_attention to ipex_flash
    for every call it serves (see serves()); other calls go to torch's own."""
    torch.nn.functional.scaled_dot_product_attention = _routed_sdpa if enabled else _torch_sdpa


@contextlib.contextmanager
def sdpa_override() -> Iterator[None]:
    """``with ipex_flash.sdpa_override(): model(...)``: SDPA calls inside run on ipex_flash
    where it serves them. Nesting is allowed; leaving restores what was there before."""
    before = torch.nn.functional.scaled_dot_product_attention
    enable_sdpa_override(True)
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = before
