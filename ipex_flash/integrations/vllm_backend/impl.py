"""IpexFlashImpl: one attention layer of a vLLM model on ipex_flash's kernels.

Per step vLLM calls do_kv_cache_update (the new tokens' keys and values into the paged cache)
and then forward (every request's new tokens against its pages, written into vLLM's output
buffer). Both are ipex_flash's ops on the tensors' own device: the SYCL CPU device for CPU
tensors, the stream's queue for XPU tensors."""
from __future__ import annotations

from typing import Optional

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionImpl, AttentionType

import ipex_flash
from ipex_flash.integrations.vllm_backend.metadata import IpexFlashMetadata
from ipex_flash.kvcache import slot_write
from ipex_flash.kvcache.slot_write import CACHE_FORMATS

# A child of vLLM's logger, so the lines appear in vLLM's log with its format.
logger = init_logger("vllm.ipex_flash")
_ENCODER_TYPES = (AttentionType.ENCODER, AttentionType.ENCODER_ONLY)


class IpexFlashImpl(AttentionImpl[IpexFlashMetadata]):

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: Optional[list[float]], sliding_window: Optional[int],
                 kv_cache_dtype: str, logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: Optional[str] = None,
                 sinks: Optional[torch.Tensor] = None) -> None:
        if kv_cache_dtype in ("float16", "bfloat16"):
            kv_cache_dtype = "auto"  # the cache holds the model's 16-bit keys as they are
        if kv_cache_dtype not in CACHE_FORMATS:
            raise NotImplementedError(f"ipex_flash's vLLM backend: kv_cache_dtype must be one "
                                      f"of {sorted(CACHE_FORMATS)}, got {kv_cache_dtype!r}")
        if attn_type in _ENCODER_TYPES and CACHE_FORMATS[kv_cache_dtype] is not None:
            raise NotImplementedError("ipex_flash's vLLM backend: encoder attention reads no "
                                      "cache, so it takes no FP8 kv_cache_dtype")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.cache_format = CACHE_FORMATS[kv_cache_dtype]  # None: the model's dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.alibi_slopes = (None if alibi_slopes is None
                             else torch.tensor(alibi_slopes, dtype=torch.float32))
        # vLLM's window counts the query's own key: (sliding_window - 1) keys to the left.
        if sliding_window is None:
            self.window = None
        elif attn_type == AttentionType.ENCODER_ONLY:
            self.window = [sliding_window - 1, sliding_window - 1]
        else:
            self.window = [sliding_window - 1, 0]
        self.sinks = sinks
        if sinks is not None and sinks.shape != (num_heads,):
            raise ValueError(f"ipex_flash's vLLM backend: sinks must be (num_heads,) = "
                             f"({num_heads},), got {tuple(sinks.shape)}")
        logger.info_once(
            "ipex_flash: vLLM attention backend IPEX_FLASH serves a %s layer (%d heads, %d kv "
            "heads, head size %d, kv cache %s%s%s%s%s)", getattr(attn_type, "value", attn_type),
            num_heads, num_kv_heads, head_size, kv_cache_dtype,
            f", window {sliding_window}" if sliding_window else "",
            f", softcap {self.logits_soft_cap}" if self.logits_soft_cap else "",
            ", ALiBi" if alibi_slopes is not None else "", ", sinks" if sinks is not None else "")

    def split_cache(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's layer cache (num_blocks, heads, block_size, 2 * head_size), in whatever
        physical order, as key and value caches (num_blocks, block_size, heads, head_size):
        strided views, no copy. An FP8 cache (uint8 storage) is viewed as its format."""
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        if self.cache_format is not None and key_cache.dtype == torch.uint8:
            key_cache, value_cache = (c.view(self.cache_format) for c in (key_cache,
                                                                          value_cache))
        return key_cache, value_cache

    def do_kv_cache_update(self, layer: torch.nn.Module, key: torch.Tensor,
                           value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        if self.attn_type in _ENCODER_TYPES or key is None or value is None:
            # Encoder attention reads its keys from the step, not from a cache; a cross-attention
            # step after the first brings no new keys.
            return
        key_cache, value_cache = self.split_cache(kv_cache)
        # key and value may hold padding rows past slot_mapping's tokens; the write takes
        # slot_mapping's count, as vLLM's own.
        # (the op's work without its dispatch: vLLM's own custom op around this call is what
        # torch.compile sees)
        slot_write.checked_write(key, value, key_cache, value_cache, slot_mapping,
                                 self.kv_cache_dtype, layer._k_scale, layer._v_scale)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Optional[IpexFlashMetadata],
                output: torch.Tensor, output_scale: Optional[torch.Tensor] = None,
                output_block_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("ipex_flash's vLLM backend does not fuse the output's "
                                      "quantisation (output_scale)")
        if attn_metadata is None:  # vLLM's profiling run
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        options = dict(softmax_scale=self.scale, window_size=self.window,
                       softcap=self.logits_soft_cap, alibi_slopes=self._alibi(query.device),
                       s_aux=self.sinks, out=output[:n])
        if self.attn_type in _ENCODER_TYPES:
            cu = attn_metadata.query_start_loc
            ipex_flash.flash_attn_varlen_func(
                query[:n], key[:n], value[:n], cu_seqlens_q=cu, cu_seqlens_k=cu,
                max_seqlen_q=attn_metadata.max_query_len,
                max_seqlen_k=attn_metadata.max_query_len, causal=False, **options)
            return output
        key_cache, value_cache = self.split_cache(kv_cache)
        q = query[:n]
        if self.cache_format is not None:
            # One scale per tensor (vLLM's layer._k_scale), as the kernels' descales: expanded
            # views, read without a copy.
            shape = (attn_metadata.query_start_loc.shape[0] - 1, self.num_kv_heads)
            options.update(k_descale=layer._k_scale.expand(shape),
                           v_descale=layer._v_scale.expand(shape))
            if q.dtype == torch.float32:
                # The kernels read FP8 pages into 16-bit registers beside a 16-bit q: a float32
                # model's queries go in as bfloat16 (a rounding of 2^-8, below the cache's 2^-4
                # or 2^-3) and the output comes back into vLLM's float32 buffer.
                q = q.to(torch.bfloat16)
                options["out"] = None
        result = ipex_flash.flash_attn_varlen_func(
            q=q, k=key_cache, v=value_cache, cu_seqlens_q=attn_metadata.query_start_loc,
            max_seqlen_q=attn_metadata.max_query_len, seqused_k=attn_metadata.seq_lens,
            max_seqlen_k=attn_metadata.max_seq_len, causal=attn_metadata.causal,
            block_table=attn_metadata.block_table, **options)
        if options["out"] is None:
            output[:n].copy_(result)
        return output

    def _alibi(self, device: torch.device) -> Optional[torch.Tensor]:
        if self.alibi_slopes is not None and self.alibi_slopes.device != device:
            self.alibi_slopes = self.alibi_slopes.to(device)
        return self.alibi_slopes
