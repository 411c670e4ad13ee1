"""The per-step metadata of ipex_flash's vLLM backend, built once per step and shared by the
layers of a KV-cache group: vLLM's own tensors, passed on as they are. Nothing here reads a
device value on the host, so a decode step stays free of waits (docs/serving.md)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import (AttentionMetadataBuilder, CommonAttentionMetadata)
from vllm.v1.kv_cache_interface import AttentionSpec, CrossAttentionSpec

from ipex_flash.kvcache.checks import MAX_PAGE_SIZE, PAGE_SIZE_STEP, is_kernel_page_size


@dataclass
class IpexFlashMetadata:
    num_actual_tokens: int  # the step's tokens, without padding
    max_query_len: int
    query_start_loc: torch.Tensor  # (num_reqs + 1,) int32: cu_seqlens_q
    max_seq_len: int  # an upper bound of seq_lens
    seq_lens: torch.Tensor  # (num_reqs,) int32: keys per request, the step's included
    block_table: torch.Tensor  # (num_reqs, max_blocks) int32
    slot_mapping: torch.Tensor
    causal: bool = True


class IpexFlashMetadataBuilder(AttentionMetadataBuilder[IpexFlashMetadata]):
    """Decodes, prefills, chunked prefills and their mixtures take the same call (the serving
    call: every request's new tokens over its pages), so the batch needs no reordering."""

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.is_cross_attention = isinstance(kv_cache_spec, CrossAttentionSpec)
        check_block_size(kv_cache_spec.block_size)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> IpexFlashMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError(
                "ipex_flash's vLLM backend: a per-request causal flag (a tensor "
                "CommonAttentionMetadata.causal) is not supported; each step is causal or not")
        return IpexFlashMetadata(
            num_actual_tokens=m.num_actual_tokens, max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc, max_seq_len=m.max_seq_len, seq_lens=m.seq_lens,
            block_table=m.block_table_tensor, slot_mapping=m.slot_mapping,
            causal=False if self.is_cross_attention else bool(m.causal))


def check_block_size(block_size: int) -> None:
    """The kernels' pages are multiples of 16 up to 512 tokens. vLLM splits a larger block into
    such pages where the cache layout allows (backend.KERNEL_BLOCK_SIZES); a block still outside
    them is refused here, at engine start, rather than at the first step."""
    if not is_kernel_page_size(block_size):
        raise ValueError(
            f"ipex_flash's vLLM backend: block_size must be a multiple of {PAGE_SIZE_STEP} up "
            f"to {MAX_PAGE_SIZE} (or a multiple of 16 that vLLM splits into such pages), got "
            f"{block_size}; pass block_size= (--block-size) accordingly")
