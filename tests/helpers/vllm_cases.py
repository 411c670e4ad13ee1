"""Shared by the vLLM tests: vLLM's FP8 cache formats and its K/V cache layouts."""
import torch

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
       "fp8_e5m2": torch.float8_e5m2}


def vllm_cache(layout, num_blocks, block_size, heads, head_size, dtype):
    """One tensor holding K and V with finite random contents, and the two caches as views of
    it: "kv_first" (2, num_blocks, ...) as vLLM's FlashAttention backend allocates it,
    "block_first" (num_blocks, 2, ...) as vllm-xpu-kernels' tests do, "vllm_layers"
    (num_blocks, block_size, heads, 2 * head_size), a token's key and value side by side, as
    vLLM 0.32 lays out a layer's cache (LBNHC). dtype uint8: FP8 bytes."""
    if layout == "vllm_layers":
        kv = torch.randn(num_blocks, block_size, heads, 2 * head_size)
    else:
        shape = (2, num_blocks) if layout == "kv_first" else (num_blocks, 2)
        kv = torch.randn(*shape, block_size, heads, head_size)
    kv = kv.to(torch.float8_e4m3fn).view(torch.uint8) if dtype == torch.uint8 else kv.to(dtype)
    if layout == "vllm_layers":
        return (kv, *kv.split(head_size, dim=-1))
    return (kv, kv[0], kv[1]) if layout == "kv_first" else (kv, kv[:, 0], kv[:, 1])
