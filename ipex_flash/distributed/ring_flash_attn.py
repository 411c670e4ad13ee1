"""ring-flash-attention's public names, so that code written against it switches by changing
one import:

    from ring_flash_attn import *                          # CUDA
    from ipex_flash.distributed.ring_flash_attn import *   # Intel GPUs, the SYCL CPU device

`import *` gives the names ring-flash-attention 0.1.8's package exports (its __init__.py),
with its signatures, defaults and results; each also takes softcap= and sinks= as keywords.
"""
from ipex_flash.distributed.hf_adapter import (  # noqa: F401
    substitute_hf_flash_attn, update_ring_flash_attn_params)
from ipex_flash.distributed.llama3 import (  # noqa: F401
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func, llama3_flash_attn_varlen_qkvpacked_func)
from ipex_flash.distributed.packed import (  # noqa: F401
    ring_flash_attn_kvpacked_func, ring_flash_attn_qkvpacked_func,
    ring_flash_attn_varlen_kvpacked_func, ring_flash_attn_varlen_qkvpacked_func,
    stripe_flash_attn_kvpacked_func, stripe_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_kvpacked_func, zigzag_ring_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_varlen_kvpacked_func, zigzag_ring_flash_attn_varlen_qkvpacked_func)
from ipex_flash.distributed.ring import (  # noqa: F401
    ring_flash_attn_func, zigzag_ring_flash_attn_func)
from ipex_flash.distributed.stripe import stripe_flash_attn_func  # noqa: F401
from ipex_flash.distributed.varlen import ring_flash_attn_varlen_func  # noqa: F401
from ipex_flash.distributed.zigzag_varlen import (  # noqa: F401
    zigzag_ring_flash_attn_varlen_func)

__all__ = [
    "llama3_flash_attn_prepare_cu_seqlens", "llama3_flash_attn_varlen_func",
    "llama3_flash_attn_varlen_kvpacked_func", "llama3_flash_attn_varlen_qkvpacked_func",
    "ring_flash_attn_func", "ring_flash_attn_kvpacked_func", "ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func", "ring_flash_attn_varlen_kvpacked_func",
    "ring_flash_attn_varlen_qkvpacked_func",
    "zigzag_ring_flash_attn_func", "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func",
    "zigzag_ring_flash_attn_varlen_func", "zigzag_ring_flash_attn_varlen_kvpacked_func",
    "zigzag_ring_flash_attn_varlen_qkvpacked_func",
    "stripe_flash_attn_func", "stripe_flash_attn_kvpacked_func",
    "stripe_flash_attn_qkvpacked_func",
    "substitute_hf_flash_attn", "update_ring_flash_attn_params",
]
