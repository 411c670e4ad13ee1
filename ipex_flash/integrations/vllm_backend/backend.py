"""IpexFlashBackend: what vLLM's engine asks of an attention backend before it runs one (the
dtypes, head and block sizes, cache layouts and features it serves), answered for ipex_flash's
kernels. The work is in metadata.py (per step) and impl.py (per layer)."""
from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionType
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.kv_cache_layout import KVCacheLayout

from ipex_flash.kvcache.checks import MAX_PAGE_SIZE, PAGE_SIZE_STEP
from ipex_flash.ops.validation import MAX_HEAD_DIM

PATH = f"{__name__}.IpexFlashBackend"
# The page sizes the kernels read: multiples of 16 up to 512. Given as exact sizes, not as a
# MultipleOf, so that vLLM splits a larger block (a hybrid model's attention block rounded up
# to its mamba page) into the largest of them that divides it, and the kernels see pages they
# read; metadata.py refuses a block that still exceeds them, naming block_size.
KERNEL_BLOCK_SIZES = list(range(PAGE_SIZE_STEP, MAX_PAGE_SIZE + 1, PAGE_SIZE_STEP))


class IpexFlashBackend(AttentionBackend):
    accept_output_buffer: bool = True
    # vLLM calls impl.do_kv_cache_update (the cache write) before impl.forward.
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16", "fp8",
                                                      "fp8_e4m3", "fp8_e5m2"]

    @staticmethod
    def get_name() -> str:
        """The name it is registered under in this process (plugin.py): CPU_ATTN or FLASH_ATTN
        in their place, else CUSTOM. vLLM's layers look the backend up by this name."""
        for member in AttentionBackendEnum:
            if member.is_overridden() and member.get_path() == PATH:
                return member.name
        return AttentionBackendEnum.CUSTOM.name

    @staticmethod
    def get_impl_cls():
        from ipex_flash.integrations.vllm_backend.impl import IpexFlashImpl
        return IpexFlashImpl

    @staticmethod
    def get_builder_cls():
        from ipex_flash.integrations.vllm_backend.metadata import IpexFlashMetadataBuilder
        return IpexFlashMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return list(KERNEL_BLOCK_SIZES)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return 1 <= head_size <= MAX_HEAD_DIM

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple:
        # The kernels read any strides with a contiguous head dim; both layer-outermost
        # layouts let vLLM split blocks into kernel pages (a block-outermost one does not).
        # LBNHC first: a token's heads side by side, as flash-attn's cache.
        return (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in (AttentionType.DECODER, AttentionType.ENCODER,
                             AttentionType.ENCODER_ONLY, AttentionType.ENCODER_DECODER)
