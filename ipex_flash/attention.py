"""User-facing attention in PyTorch's SDPA layout."""
from __future__ import annotations

from typing import Optional, Union

import torch

from ipex_flash.ops import attention as _attention_ops  # noqa: F401  (registers the ops)
from ipex_flash.ops import fast_path, launch
from ipex_flash.ops.validation import check_attention_inputs, check_dropout_p


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
    dropout_p: float = 0.0,
    deterministic: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention, softmax(q @ k^T * scale) @ v, computed by FlashAttention kernels.

    Computes what ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale, enable_gqa=True)`` computes, without materialising the
    (Nq, Nk) score matrix.

    Args:
        q: (B, Hq, Nq, D) queries.
        k: (B, Hkv, Nk, D) keys; Hq must be a multiple of Hkv (GQA; Hkv = 1 is MQA).
        v: (B, Hkv, Nk, Dv) values; Dv may differ from D (MLA prefill: D = 192, Dv = 128).
        causal: mask keys after the query's position, aligned to the top-left corner as in
            SDPA: query row i sees keys 0..i, also when Nq != Nk::

                Nq=3, Nk=5     keys ->
                  row 0        1 0 0 0 0
                  row 1        1 1 0 0 0
                  row 2        1 1 1 0 0

        scale: multiplier of q @ k^T; default 1 / sqrt(D).
        return_lse: also return the log-sum-exp of each row's scaled scores (not
            differentiable: its gradient is ignored).
        dropout_p: as in SDPA, each attention probability is zeroed with probability
            dropout_p and the kept ones scaled by 1 / (1 - dropout_p). The mask comes from a
            Philox generator keyed by a seed drawn from torch's default generator, so
            torch.manual_seed makes it reproducible; the backward regenerates it.
        deterministic: request bitwise-reproducible gradients. The backward kernels are
            always deterministic (no atomics), so this costs nothing.

    Differentiable in q, k and v; gradients come back in their dtype and layout.

    All three tensors share one dtype (float32, float16 or bfloat16) and one device (cpu:
    the SYCL CPU device; xpu: the tensor's stream queue). Any strides are accepted; a last
    dimension that is not contiguous costs a copy. D and Dv may be 1 to 256. Softmax and
    accumulation run in float32.

    Returns:
        out: (B, Hq, Nq, Dv) in q's dtype and layout; with return_lse also
        lse: (B, Hq, Nq) float32, natural log.
    """
    # Checked here too, so a non-tensor argument gets our message rather than the dispatcher's.
    check_attention_inputs("ipex_flash.attention", q, k, v, scale)
    check_dropout_p("ipex_flash.attention", dropout_p)
    seed = launch.draw_dropout_seed(q.device) if dropout_p > 0.0 else None
    out, lse = fast_path.forward(q, k, v, causal, scale, dropout_p, seed, deterministic)
    return (out, launch.natural_lse(lse)) if return_lse else out
