"""vLLM's per-layer KV-cache write, reshape_and_cache_flash: each token's key and value rows
copied into a paged cache at the slot slot_mapping gives it (slot = block * block_size +
offset; -1: the token is not cached), quantised for an FP8 cache. The same arguments and
semantics as vllm-xpu-kernels' csrc/cache.cpp (but for a NaN, which stays NaN here where its
saturation turns it into the format's largest value), written with torch ops, registered as

    ipex_flash::reshape_and_cache_flash(key, value, key_cache!, value_cache!, slot_mapping,
        kv_cache_dtype, k_scale, v_scale) -> ()

with a fake implementation, so torch.compile traces it. The write reads no device value on
the host, so it can be captured in a graph; the check that every slot lies inside the cache
reads them where that is free: see check_slot_values.
"""
from __future__ import annotations

import torch

from ipex_flash.kvcache import fp8_quant
from ipex_flash.ops import launch_plans

Tensor = torch.Tensor
_FN = "ipex_flash.integrations.vllm.reshape_and_cache_flash"

# vLLM's kv_cache_dtype strings the write takes (csrc/cache.cpp's DISPATCH_BY_KV_CACHE_DTYPE):
# the element type of the cache, None for "auto" (the cache holds key's dtype unchanged).
CACHE_FORMATS = {"auto": None, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                 "fp8_e5m2": torch.float8_e5m2}
KEY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_write(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor,
                v_scale: Tensor) -> None:
    """Everything about the call but the slots' values, before anything is written."""
    if kv_cache_dtype not in CACHE_FORMATS:
        raise ValueError(f"{_FN}: kv_cache_dtype must be one of {sorted(CACHE_FORMATS)}, got "
                         f"{kv_cache_dtype!r}")
    fmt = CACHE_FORMATS[kv_cache_dtype]
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{_FN}: {name} must be (num_tokens, num_kv_heads, head_size), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
        if t.dtype not in KEY_DTYPES:
            raise TypeError(f"{_FN}: {name} must be float32, float16 or bfloat16, got {t.dtype}")
    if value.shape != key.shape or value.dtype != key.dtype:
        raise ValueError(f"{_FN}: value must have key's shape and dtype {tuple(key.shape)} "
                         f"{key.dtype}, got {tuple(value.shape)} {value.dtype}")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(cache, Tensor) or cache.dim() != 4 or cache.shape[2:] != key.shape[1:]:
            shape = tuple(cache.shape) if isinstance(cache, Tensor) else type(cache).__name__
            raise ValueError(f"{_FN}: {name} must be (num_blocks, block_size, "
                             f"{key.shape[1]}, {key.shape[2]}) after key, got {shape}")
        if cache.shape[0] * cache.shape[1] == 0:
            raise ValueError(f"{_FN}: {name} has no slots, shape {tuple(cache.shape)}")
        # vLLM allocates an FP8 cache as uint8 and may hand over either that or a float8 view.
        allowed = (key.dtype,) if fmt is None else (torch.uint8, fmt)
        if cache.dtype not in allowed:
            raise TypeError(f"{_FN}: with kv_cache_dtype={kv_cache_dtype!r}, {name} must be "
                            f"{' or '.join(str(d) for d in allowed)}, got {cache.dtype}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"{_FN}: value_cache must have key_cache's shape "
                         f"{tuple(key_cache.shape)}, got {tuple(value_cache.shape)}")
    if (not isinstance(slot_mapping, Tensor) or slot_mapping.is_floating_point()
            or slot_mapping.is_complex() or slot_mapping.dtype == torch.bool):
        raise TypeError(f"{_FN}: slot_mapping must be an integer tensor (int64 in vLLM)")
    # As csrc/cache.cpp: the tokens are slot_mapping's; key may hold more rows (padding).
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > key.shape[0]:
        raise ValueError(f"{_FN}: slot_mapping must be (num_tokens,) with num_tokens <= "
                         f"key.shape[0] = {key.shape[0]}, got {tuple(slot_mapping.shape)}")
    if fmt is not None:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if (not isinstance(scale, Tensor) or not scale.is_floating_point()
                    or scale.numel() != 1):
                raise TypeError(f"{_FN}: {name} must be a float tensor of one element with an "
                                f"FP8 cache")
    named = (("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
             ("slot_mapping", slot_mapping))
    named += (("k_scale", k_scale), ("v_scale", v_scale)) if fmt is not None else ()
    for name, t in named:
        if t.device != key.device:
            raise ValueError(f"{_FN}: {name} is on {t.device}, key on {key.device}")


def _capturing(device: torch.device) -> bool:
    backend = getattr(torch, device.type, None)
    probe = getattr(backend, "is_current_stream_capturing", None)
    return bool(probe and probe())


def check_slot_values(slot_mapping: Tensor, num_slots: int) -> None:
    """Every slot -1 or in [0, num_slots). It reads the slots, which is free for host memory
    (the CPU device); on a GPU it would wait for the device once per layer and step, so there
    it runs only with IPEX_FLASH_SYNC_CACHE_CHECKS=1 (as the decode steps' own value checks)
    and never during a graph capture. Unchecked, a slot out of range is not written (write)."""
    if slot_mapping.device.type == "meta" or slot_mapping.numel() == 0:
        return
    if slot_mapping.device.type != "cpu" and (not launch_plans.SYNC_CACHE_CHECKS
                                              or _capturing(slot_mapping.device)):
        return
    bad = (slot_mapping < -1) | (slot_mapping >= num_slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{_FN}: slot_mapping[{i}] = {int(slot_mapping[i])} is outside the "
                         f"cache: slots are -1 (skip) or in [0, num_blocks * block_size = "
                         f"{num_slots})")


def _as_bytes(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if fp8_quant.is_fp8(t) else t


def write(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
          slot_mapping: Tensor, fmt, k_scale: Tensor, v_scale: Tensor) -> None:
    """The write itself, on checked arguments, without a host read of device values."""
    tokens = slot_mapping.shape[0]
    if tokens == 0:
        return
    key, value = key[:tokens], value[:tokens]
    if fmt is not None:  # cache.cpp's CopyWithScaleOp: x / scale in float32, saturating
        heads = key.shape[1]
        key, value = (fp8_quant.quantise(t[None], s.reshape(1, 1).float().expand(1, heads),
                                         fmt)[0]
                      for t, s in ((key, k_scale), (value, v_scale)))
        # FP8 caches given as uint8 or float8: both written through their bytes.
        key, value, key_cache, value_cache = map(_as_bytes, (key, value, key_cache, value_cache))
    block_size = key_cache.shape[1]
    slots = slot_mapping.long()
    if launch_plans.reads_host_memory(slots.device) and _write_in_host_memory(
            key, value, key_cache, value_cache, slots):
        return
    valid = (slots >= 0) & (slots < key_cache.shape[0] * block_size)
    # index_put_ cannot skip an index, and which slots to skip is only known on the device.
    # A skipped token is sent to the slot of the first written token with that token's row:
    # several writes of one row to one slot leave that row. With no token written at all,
    # every token rewrites slot 0 with its own current contents.
    first = torch.argmax(valid.to(torch.int32))  # argmax: the first maximum
    source = torch.where(valid, torch.arange(tokens, device=slots.device), first)
    any_valid = valid.any()
    target = torch.where(any_valid, slots[source], 0)
    blocks, offsets = target // block_size, target % block_size
    for rows, cache in ((key, key_cache), (value, value_cache)):
        cache.index_put_((blocks, offsets), torch.where(any_valid, rows[source], cache[0, 0]))


def _write_in_host_memory(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                          slots: Tensor) -> bool:
    """The write where the caches are in host memory (the CPU device): which tokens are skipped
    is read here for free (check_slot_values has read the slots already), and one index_copy_
    a cache writes the rest, where the device path takes a dozen ops to avoid that read (its
    cost dominated a vLLM decode step's attention). False where a cache's blocks are not one
    run of slots (a view that cannot be flattened): the device path writes those."""
    try:
        key_slots, value_slots = (c.view(-1, *c.shape[2:]) for c in (key_cache, value_cache))
    except RuntimeError:
        return False
    written = slots >= 0
    if not bool(written.all()):
        slots, key, value = slots[written], key[written], value[written]
    key_slots.index_copy_(0, slots, key)
    value_slots.index_copy_(0, slots, value)
    return True


@torch.library.custom_op("ipex_flash::reshape_and_cache_flash",
                         mutates_args=("key_cache", "value_cache"), device_types=("cpu", "xpu"))
def reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                            slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor,
                            v_scale: Tensor) -> None:
    """Writes key[i], value[i] (num_tokens, num_kv_heads, head_size) into key_cache,
    value_cache (num_blocks, block_size, num_kv_heads, head_size) at slot slot_mapping[i] =
    block * block_size + offset, for i < len(slot_mapping); -1 writes nothing. In place;
    the caches may be any views (in vLLM, the two halves of one (2, num_blocks, ...) tensor).

    kv_cache_dtype: "auto" (the caches have key's dtype) or "fp8" / "fp8_e4m3" / "fp8_e5m2":
    the caches are uint8 or that float8 dtype and hold key / k_scale, value / v_scale (float
    tensors of one element) rounded to nearest, saturating at the format's largest value (a
    NaN stays NaN).
    """
    checked_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                  v_scale)


def checked_write(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                  slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor,
                  v_scale: Tensor) -> None:
    """The op's work without the op's dispatch (about 100 us a call on the CPU device), for
    callers that are traced as a whole already: vLLM's backend writes from inside vLLM's own
    custom op (integrations/vllm_backend/impl.py)."""
    check_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                v_scale)
    check_slot_values(slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    write(key, value, key_cache, value_cache, slot_mapping, CACHE_FORMATS[kv_cache_dtype],
          k_scale, v_scale)


@reshape_and_cache_flash.register_fake
def _reshape_and_cache_flash_fake(key, value, key_cache, value_cache, slot_mapping,
                                  kv_cache_dtype, k_scale, v_scale):
    check_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                v_scale)
    return None
