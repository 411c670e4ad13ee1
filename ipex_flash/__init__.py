"""ipex_flash: FlashAttention for Intel GPUs in SYCL, as PyTorch custom ops.

    import torch, ipex_flash
    out = torch.ops.ipex_flash.attention(q, k, v, causal=True)   # (B, H, N, D)
    out, lse = ipex_flash.attention(q, k, v, causal=True, return_lse=True)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # SDPA's contract
    with ipex_flash.sdpa_override(): model(x)   # torch's SDPA calls routed to ipex_flash
    out = ipex_flash.flash_attn_func(q, k, v, causal=True)   # flash-attn's (B, N, H, D)

Entry points here (attention.py, sdpa.py, flash_attn_interface.py, flash_attn_packed.py,
flash_attn_kvcache.py, integrations/); below them ops/ (torch.library ops, validation,
launch), kvcache/ (KV-cache ops and helpers) and tools/ (the CLI, selftest, gpu-check), over
the compiled host module ipex_flash._C (loaded by _runtime.py).
"""
import os as _os

from ipex_flash._runtime import C as _C  # noqa: F401  (sets up SYCL before anything runs)
from ipex_flash.attention import attention
from ipex_flash.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
from ipex_flash.flash_attn_packed import (
    flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func)
from ipex_flash.flash_attn_kvcache import flash_attn_with_kvcache
from ipex_flash.sdpa import enable_sdpa_override, scaled_dot_product_attention, sdpa_override

__all__ = ["attention", "enable_sdpa_override", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache", "scaled_dot_product_attention", "sdpa_override"]
__version__ = "0.1.0"

if _os.environ.get("IPEX_FLASH_SGLANG", "").strip() not in ("", "0"):
    # SGLang's processes never import ipex_flash themselves: a sitecustomize.py that does
    # lets this switch make sgl_kernel.flash_attn ipex_flash's (integrations/sglang.py).
    from ipex_flash.integrations import sglang as _sglang
    _sglang.install_from_env()
