"""vLLM's cache write, ipex_flash.integrations.vllm.reshape_and_cache_flash, against a per-token
loop (vllm-xpu-kernels' test shapes, both cache layouts, padded keys, slots of -1, FP8 formats
in uint8 and float8 storage), bad input leaving the cache unchanged, opcheck and
torch.compile."""
import pytest
import torch

from ipex_flash.integrations import vllm as ipex_vllm
from ipex_flash.kvcache import slot_write

from helpers.vllm_cases import FP8, vllm_cache


def expected_caches(key_cache, value_cache, key, value, slots, convert=lambda row, which: row):
    """The caches after the write, token by token: slot -1 writes nothing."""
    k_ref, v_ref = key_cache.clone(), value_cache.clone()
    block_size = key_cache.shape[1]
    for i, slot in enumerate(slots.tolist()):
        if slot != -1:
            k_ref[slot // block_size, slot % block_size] = convert(key[i], 0)
            v_ref[slot // block_size, slot % block_size] = convert(value[i], 1)
    return k_ref, v_ref


def token_batch(num_tokens, heads, head_size, dtype, num_slots, padding=3):
    """key and value as unbind views of a (tokens, 3, heads, head_size) qkv tensor with
    `padding` rows past the slots (vLLM pads the batch), and distinct random slots, about a
    quarter of them -1 (never the first token's)."""
    _, key, value = torch.randn(num_tokens + padding, 3, heads, head_size, dtype=dtype).unbind(1)
    slots = torch.randperm(num_slots)[:num_tokens]
    slots[1:][torch.rand(num_tokens - 1) < 0.25] = -1
    return key, value, slots


@pytest.fixture(params=["host", "device"])
def write_path(request, monkeypatch):
    """The CPU device's write (host memory: the slots read on the host) and the one a GPU runs
    (no value read on the host), taken on the CPU device."""
    if request.param == "device":
        monkeypatch.setattr(slot_write.launch_plans, "reads_host_memory", lambda device: False)
    return request.param


@pytest.mark.parametrize("layout", ["kv_first", "block_first", "vllm_layers"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_tokens,head_size,block_size",
                         [(42, 64, 8), (42, 80, 16), (42, 120, 32), (17, 256, 16)])
def test_write_matches_per_token_loop(num_tokens, head_size, block_size, dtype, layout,
                                      write_path):
    kv, key_cache, value_cache = vllm_cache(layout, 24, block_size, 8, head_size, dtype)
    key, value, slots = token_batch(num_tokens, 8, head_size, dtype, 24 * block_size)
    k_ref, v_ref = expected_caches(key_cache, value_cache, key, value, slots)
    one = torch.ones((), dtype=torch.float32)
    ipex_vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "auto", one, one)
    assert torch.equal(key_cache, k_ref) and torch.equal(value_cache, v_ref)


@pytest.mark.parametrize("storage", ["uint8", "float8"])
@pytest.mark.parametrize("kv_cache_dtype", list(FP8))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_write_quantises_and_saturates(dtype, kv_cache_dtype, storage, write_path):
    fmt, limit = FP8[kv_cache_dtype], torch.finfo(FP8[kv_cache_dtype]).max
    _, key_cache, value_cache = vllm_cache("kv_first", 12, 16, 4, 64, torch.uint8)
    if storage == "float8":
        key_cache, value_cache = key_cache.view(fmt), value_cache.view(fmt)
    key, value, slots = token_batch(30, 4, 64, dtype, 12 * 16)
    k_scale, v_scale = (t[:30].abs().amax().float() / 64.0 for t in (key, value))  # as vLLM
    key[0, 0, :4], value[0, 1, 4:9] = 1e30, -1e30  # past the format's range
    k_ref, v_ref = expected_caches(  # cache.cpp's rule: x / scale in float32, saturated
        key_cache.view(fmt), value_cache.view(fmt), key, value, slots, lambda row, which: (
            row.float() / (k_scale, v_scale)[which]).clamp(-limit, limit).to(fmt))
    ipex_vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype,
                                      k_scale, v_scale)
    assert key_cache.dtype == (torch.uint8 if storage == "uint8" else fmt)
    assert torch.equal(key_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), v_ref.view(torch.uint8))
    written = [c.view(fmt).flatten(0, 1)[slots[0]].float() for c in (key_cache, value_cache)]
    assert torch.equal(written[0][0, :4], torch.full((4,), limit))
    assert torch.equal(written[1][1, 4:9], torch.full((5,), -limit))
    # Apart from the loop: stored * scale is the key to the format's relative precision (3
    # mantissa bits for e4m3, 2 for e5m2), or to scale * its smallest normal for tiny values.
    rel, tiny = 2.0 ** (-4 if fmt == torch.float8_e4m3fn else -3), torch.finfo(fmt).smallest_normal
    for i in (slots >= 0).nonzero()[1:, 0].tolist():
        row = key_cache.view(fmt).flatten(0, 1)[slots[i]].double() * k_scale.double()
        error = (row - key[i].double()).abs()
        assert (error <= rel * key[i].double().abs() + tiny * k_scale.double()).all()


def test_all_slots_skipped_or_none_leave_the_cache():
    kv, key_cache, value_cache = vllm_cache("kv_first", 4, 16, 2, 32, torch.bfloat16)
    before = kv.clone()
    key, value, _ = token_batch(6, 2, 32, torch.bfloat16, 64)
    one = torch.ones(())
    for slots in (torch.full((6,), -1), torch.empty(0, dtype=torch.int64)):
        ipex_vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "auto",
                                          one, one)
        assert torch.equal(kv, before)


SLOTS = dict(dtype=torch.int64)
# (changes to a good call, the exception, the argument its message names).
BAD = {"unknown format": (dict(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype"),
       "auto cache of another dtype": (dict(cache_dtype=torch.float16), TypeError, "key_cache"),
       "fp8 into a float32 cache": (dict(kv_cache_dtype="fp8"), TypeError, "key_cache"),
       "e5m2 into an e4m3 cache": (dict(kv_cache_dtype="fp8_e5m2",
                                        cache_dtype=torch.float8_e4m3fn), TypeError, "key_cache"),
       "value of another shape": (dict(value=torch.randn(9, 2, 16)), ValueError, "value"),
       "cache of another head size": (dict(key_cache=torch.zeros(4, 16, 2, 8)), ValueError,
                                      "key_cache"),
       "caches of two shapes": (dict(value_cache=torch.zeros(5, 16, 2, 16)), ValueError,
                                "value_cache"),
       "float slots": (dict(slot_mapping=torch.zeros(8)), TypeError, "slot_mapping"),
       "more slots than tokens": (dict(slot_mapping=torch.zeros(12, **SLOTS)), ValueError,
                                  "slot_mapping"),
       "2-D slots": (dict(slot_mapping=torch.zeros(2, 4, **SLOTS)), ValueError, "slot_mapping"),
       "slots on another device": (dict(slot_mapping=torch.zeros(8, device="meta", **SLOTS)),
                                   ValueError, "slot_mapping"),
       "slot past the cache": (dict(slot=64), ValueError, "slot_mapping"),
       "slot below -1": (dict(slot=-2), ValueError, "slot_mapping"),
       "fp8 scale of two values": (dict(kv_cache_dtype="fp8", cache_dtype=torch.uint8,
                                        k_scale=torch.ones(2)), TypeError, "k_scale")}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument_and_writes_nothing(case):
    changes, error, name = BAD[case]
    changes = dict(changes)
    cache_dtype = changes.pop("cache_dtype", torch.float32)
    kv = torch.randn(2, 4, 16, 2, 16).to(cache_dtype)
    before = kv.clone()
    key, value, _ = token_batch(8, 2, 16, torch.float32, 64)
    slots = torch.arange(8, dtype=torch.int64) * 7
    slots[3] = changes.pop("slot", slots[3])  # the other tokens are good: nothing written
    args = dict(key=key, value=value, key_cache=kv[0], value_cache=kv[1], slot_mapping=slots,
                kv_cache_dtype="auto", k_scale=torch.ones(()), v_scale=torch.ones(()))
    args.update(changes)
    with pytest.raises(error, match=name):
        ipex_vllm.reshape_and_cache_flash(**args)
    assert torch.equal(kv.view(torch.uint8), before.view(torch.uint8))


def test_opcheck_and_torch_compile():
    kv, key_cache, value_cache = vllm_cache("kv_first", 6, 16, 2, 32, torch.bfloat16)
    key, value, slots = token_batch(20, 2, 32, torch.bfloat16, 96)
    scale = torch.tensor(0.05)
    torch.library.opcheck(torch.ops.ipex_flash.reshape_and_cache_flash,
                          (key, value, key_cache, value_cache, slots, "auto", scale, scale))

    def step(key, value, kv, slots):  # a layer's write, then a read of the cache
        torch.ops.ipex_flash.reshape_and_cache_flash(key, value, kv[0], kv[1], slots, "fp8",
                                                     scale, scale)
        return kv.view(torch.float8_e4m3fn).float().sum()

    fp8 = [vllm_cache("kv_first", 6, 16, 2, 32, torch.uint8)[0] for _ in range(2)]
    fp8[1].copy_(fp8[0])
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(key, value, fp8[0], slots), step(key, value, fp8[1], slots))
    assert torch.equal(fp8[0], fp8[1])


def test_write_reads_no_device_value():
    """The write proper runs on meta tensors, which hold no values: it reads none on the host
    (no sync), so a graph can capture it. (The slot-range check before it does read them.)"""
    kv = torch.empty(2, 4, 16, 2, 8, dtype=torch.uint8, device="meta")
    key, scale = torch.empty(5, 2, 8, device="meta"), torch.empty((), device="meta")
    slot_write.write(key, key, kv[0], kv[1], torch.empty(5, dtype=torch.int64, device="meta"),
                     torch.float8_e5m2, scale, scale)
