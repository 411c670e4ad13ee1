"""ipex_flash: FlashAttention for Intel GPUs in SYCL, as PyTorch custom ops.

    import torch, ipex_flash
    out = torch.ops.ipex_flash.attention(q, k, v, causal=True)   # (B, H, N, D)
    out, lse = ipex_flash.attention(q, k, v, causal=True, return_lse=True)
"""
from ipex_flash._runtime import C as _C  # noqa: F401  (sets up SYCL before anything runs)
from ipex_flash import ops  # noqa: F401  (registers torch.ops.ipex_flash.*)
from ipex_flash.attention import attention
from ipex_flash.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
from ipex_flash.kvcache import flash_attn_with_kvcache

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
__version__ = "0.1.0"
