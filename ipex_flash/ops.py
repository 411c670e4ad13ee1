"""The ipex_flash operators, registered with torch.library.

    ipex_flash::attention_forward(q, k, v, causal, scale) -> (out, lse)
        The forward kernel. CPU tensors run on the SYCL CPU device, XPU tensors on their
        stream's SYCL queue; a fake implementation serves torch.compile and meta tensors.
    ipex_flash::attention(q, k, v, causal, scale) -> out
        SDPA's signature; composite over attention_forward, so torch.compile sees through it.

Layout: (B, H, N, D) as in torch.nn.functional.scaled_dot_product_attention.
"""
from __future__ import annotations

from typing import Optional

import torch

from ipex_flash._runtime import C
from ipex_flash._validation import check_attention_inputs, softmax_scale

Tensor = torch.Tensor

# Masks are diagonal bands (see MaskParams in sycl_src/device/params.hpp); SDPA's causal mask
# is top-left aligned: row i sees keys 0..i.
_NO_MASK = dict(diag_offset=0, window_left=-1, window_right=-1)
_CAUSAL_TOP_LEFT = dict(diag_offset=0, window_left=-1, window_right=0)


def _queue_handle(device: torch.device) -> int:
    """0 selects the SYCL CPU device; otherwise the sycl::queue* of the current XPU stream
    (untested here: no machine of ours has an Intel GPU)."""
    if device.type == "cpu":
        return 0
    return int(torch.xpu.current_stream(device).sycl_queue)


def _view(t: Tensor) -> "C.TensorView":
    return C.TensorView(t.data_ptr(), str(t.dtype).removeprefix("torch."), list(t.shape),
                        list(t.stride()))


def _with_contiguous_last_dim(t: Tensor) -> Tensor:
    # The kernels read rows as contiguous vectors; other layouts pay one copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    """out in q's layout (a (B, N, H, D) tensor transposed to (B, H, N, D) gets the same
    strides back), lse (B, Hq, Nq) float32."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.custom_op("ipex_flash::attention_forward", mutates_args=(),
                         device_types=("cpu", "xpu"))
def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                      scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
    check_attention_inputs("ipex_flash.attention", q, k, v, scale)
    q, k, v = (_with_contiguous_last_dim(t) for t in (q, k, v))
    out, lse = _forward_outputs(q)
    mask = C.MaskParams(**(_CAUSAL_TOP_LEFT if causal else _NO_MASK))
    C.flash_fwd(_view(q), _view(k), _view(v), _view(out), _view(lse),
                softmax_scale(scale, q.shape[-1]), mask, _queue_handle(q.device))
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal=False, scale=None):
    check_attention_inputs("ipex_flash.attention", q, k, v, scale)
    return _forward_outputs(_with_contiguous_last_dim(q))


_lib = torch.library.Library("ipex_flash", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> Tensor")


def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
               scale: Optional[float] = None) -> Tensor:
    return torch.ops.ipex_flash.attention_forward(q, k, v, causal, scale)[0]


# Composite: autograd, fake tensors and torch.compile all come from attention_forward.
_lib.impl("attention", _attention, "CompositeImplicitAutograd")
