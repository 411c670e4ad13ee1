"""ipex_flash.integrations.vllm's vllm_xpu_kernels-shaped flash_attn_varlen_func over a cache
that its reshape_and_cache_flash filled, against the float64 reference; its signature, hints
and refusals; install() in a child process."""
import inspect
import os
import subprocess
import sys

import pytest
import torch

from ipex_flash.integrations import vllm as ipex_vllm
from ipex_flash.reference import flash_attn_reference

from helpers.reference import OUTPUT_TOLERANCE
from helpers.vllm_cases import FP8, vllm_cache


# The serving call as vllm-xpu-kernels' test makes it: a decode, a few-token step and a chunked
# prefill, (new tokens, keys in the cache including them).
SEQ_LENS = [(1, 1328), (5, 18), (129, 463)]
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 64


def cached_step(dtype, block_size, kv_cache_dtype):
    """A step's tensors: packed queries, and every sequence's keys and values written by
    reshape_and_cache_flash into a (2, num_blocks, ...) cache at shuffled blocks, from one
    batch of tokens with slot -1 (padding) among them. Returns the call's tensors and the keys
    and values each sequence sees, as the reference reads them."""
    pages = [-(-n_k // block_size) for _, n_k in SEQ_LENS]
    order = torch.randperm(sum(pages) + 4)
    table = torch.zeros(len(SEQ_LENS), max(pages), dtype=torch.int32)
    slots, used = [], 0
    for b, ((_, n_k), count) in enumerate(zip(SEQ_LENS, pages)):
        table[b, :count] = order[used:used + count]
        used += count
        positions = torch.arange(n_k)
        slots += [table[b, positions // block_size].long() * block_size + positions % block_size,
                  torch.full((2,), -1)]
    slots = torch.cat(slots)
    storage = dtype if kv_cache_dtype == "auto" else torch.uint8
    _, key_cache, value_cache = vllm_cache("kv_first", len(order), block_size, HEADS_KV,
                                           HEAD_DIM, storage)
    _, key, value = torch.randn(len(slots), 3, HEADS_KV, HEAD_DIM, dtype=dtype).unbind(1)
    scales = [t.abs().amax().float() / 64.0 for t in (key, value)]
    ipex_vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype,
                                      *scales)
    if kv_cache_dtype != "auto":  # vLLM's attention reads the cache as its FP8 dtype
        key_cache, value_cache = (c.view(FP8[kv_cache_dtype]) for c in (key_cache, value_cache))
    seqs, start = [], 0
    for (n_q, n_k) in SEQ_LENS:
        rows = slice(start, start + n_k)
        k_b, v_b = key[rows], value[rows]
        if kv_cache_dtype != "auto":  # the reference reads what the cache holds, dequantised
            where = slots[rows]
            k_b, v_b = (c.flatten(0, 1)[where].double() * s.double()
                        for c, s in ((key_cache, scales[0]), (value_cache, scales[1])))
        seqs.append((torch.randn(n_q, HEADS_Q, HEAD_DIM, dtype=dtype), k_b, v_b))
        start += n_k + 2
    q = torch.cat([s[0] for s in seqs])
    cu_q = torch.tensor([0] + [n for n, _ in SEQ_LENS]).cumsum(0).to(torch.int32)
    seqused = torch.tensor([n for _, n in SEQ_LENS], dtype=torch.int32)
    return q, key_cache, value_cache, table, cu_q, seqused, scales, seqs


def reference(q, k, v, causal, window, softcap, sinks, scale):
    """float64 (out, lse) of one sequence; sinks join each row's softmax denominator:
    out * exp(lse - lse'), lse' = log(exp(lse) + exp(sink))."""
    out, lse = flash_attn_reference(q[None], k[None], v[None], causal,
                                    (-1, -1) if window is None else tuple(window), softcap,
                                    scale=scale)
    if sinks is not None:
        total = torch.logaddexp(lse, sinks.double()[None, :, None])
        out = out * torch.exp(lse - total).transpose(1, 2)[..., None]
        lse = total
    return out[0], lse[0]


@pytest.mark.parametrize("dtype,block_size,causal,window,softcap,sinks,kv_cache_dtype", [
    (torch.float32, 16, True, None, 0.0, True, "auto"),
    (torch.bfloat16, 64, True, [64, 0], 0.0, True, "auto"),
    (torch.bfloat16, 16, False, [64, 64], 8.0, False, "auto"),
    (torch.float32, 64, False, None, 0.0, False, "auto"),
    (torch.bfloat16, 16, True, None, 0.0, False, "fp8_e4m3"),
])
def test_vllm_call_over_the_written_cache(dtype, block_size, causal, window, softcap, sinks,
                                          kv_cache_dtype):
    q, key_cache, value_cache, table, cu_q, seqused, scales, seqs = cached_step(
        dtype, block_size, kv_cache_dtype)
    s_aux = torch.randn(HEADS_Q, dtype=dtype) if sinks else None
    descales = {} if kv_cache_dtype == "auto" else dict(  # vLLM's expanded views of its scales
        k_descale=scales[0].expand(len(SEQ_LENS), HEADS_KV),
        v_descale=scales[1].expand(len(SEQ_LENS), HEADS_KV))
    buffer = torch.randn(q.shape[0] + 7, HEADS_Q, HEAD_DIM, dtype=dtype)
    before, rest = buffer.clone(), torch.ones(buffer.shape[0], dtype=torch.bool)
    out = buffer[3:3 + q.shape[0]]  # vLLM's output[:num_actual_tokens], here mid-buffer
    rest[3:3 + q.shape[0]] = False
    scale = HEAD_DIM ** -0.5
    result, lse = ipex_vllm.flash_attn_varlen_func(
        q, key_cache, value_cache, max(n for n, _ in SEQ_LENS), cu_q,
        max(n for _, n in SEQ_LENS), seqused_k=seqused, softmax_scale=scale, causal=causal,
        block_table=table, window_size=window, softcap=softcap, s_aux=s_aux, out=out,
        return_softmax_lse=True, **descales)
    assert result.data_ptr() == out.data_ptr() and lse.shape == (HEADS_Q, q.shape[0])
    assert torch.equal(buffer[rest], before[rest])
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, (q_b, k_b, v_b) in enumerate(seqs):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref_out, ref_lse = reference(q_b, k_b, v_b, causal, window, softcap, s_aux, scale)
        torch.testing.assert_close(out[rows].double(), ref_out, rtol=rtol, atol=atol)
        torch.testing.assert_close(lse[:, rows].double(), ref_lse, rtol=1e-4, atol=1e-4)


def test_host_kv_lens_hints_and_packed_keys():
    """host_kv_lens is seqused_k given on the host; num_splits_kv and is_mix_batch are hints
    that leave the result; without a block table, cu_seqlens_k (7th) packs the keys."""
    q, key_cache, value_cache, table, cu_q, seqused, _, seqs = cached_step(torch.float32, 16,
                                                                           "auto")
    call = dict(block_table=table, causal=True)
    expected = ipex_vllm.flash_attn_varlen_func(q, key_cache, value_cache, 129, cu_q, 1328,
                                                seqused_k=seqused, **call)
    assert isinstance(expected, torch.Tensor)
    lens = [n for _, n in SEQ_LENS]
    assert torch.equal(ipex_vllm.flash_attn_varlen_func(
        q, key_cache, value_cache, 129, cu_q, 1328, host_kv_lens=lens, is_mix_batch=False,
        **call), expected)
    split = ipex_vllm.flash_attn_varlen_func(q, key_cache, value_cache, 129, cu_q, 1328,
                                             seqused_k=seqused, num_splits_kv=4, **call)
    torch.testing.assert_close(split, expected, rtol=1e-5, atol=1e-5)
    k, v = (torch.cat([s[i] for s in seqs]) for i in (1, 2))
    cu_k = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    packed = ipex_vllm.flash_attn_varlen_func(q, k, v, 129, cu_q, 1328, cu_k, causal=True)
    torch.testing.assert_close(packed, expected, rtol=1e-5, atol=1e-5)


def test_signature_and_unsupported_arguments():
    names = ("q k v max_seqlen_q cu_seqlens_q max_seqlen_k cu_seqlens_k seqused_k q_v dropout_p "
             "softmax_scale causal window_size softcap alibi_slopes deterministic "
             "return_attn_probs block_table return_softmax_lse out scheduler_metadata q_descale "
             "k_descale v_descale num_splits fa_version s_aux num_splits_kv is_mix_batch "
             "host_kv_lens")  # vllm_xpu_kernels' order
    assert list(inspect.signature(ipex_vllm.flash_attn_varlen_func).parameters) == names.split()
    q, k, v = torch.randn(3, 4, 2, 32)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for extra, name in ((dict(q_v=torch.randn(4, 2, 32)), "q_v"),
                        (dict(host_kv_lens=[4], seqused_k=cu[1:]), "host_kv_lens"),
                        (dict(window_size=[1, 2, 3]), "window_size")):
        with pytest.raises(ValueError, match=name):
            ipex_vllm.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, **extra)


INSTALL_CHECK = """
import importlib.util, logging, sys, torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import ipex_flash
from ipex_flash.integrations import vllm as ipex_vllm
from ipex_flash.kvcache import slot_write
assert importlib.util.find_spec("vllm_xpu_kernels") is None, "vllm-xpu-kernels is installed"
assert ipex_vllm.install() and ipex_vllm.install()  # a second call keeps the first's op
from vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func
import vllm_xpu_kernels
assert flash_attn_varlen_func is ipex_vllm.flash_attn_varlen_func
assert vllm_xpu_kernels.flash_attn_interface is ipex_vllm
kv, key, value = torch.zeros(2, 4, 16, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
def write(kv):
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, kv[0], kv[1],
        torch.tensor([5, -1, 40]), "auto", torch.ones(()), torch.ones(()))
    return kv.sum()
write(kv)
expected = torch.zeros(2, 64, 2, 8)
expected[:, 5], expected[:, 40] = torch.stack([key[0], value[0]]), torch.stack([key[2], value[2]])
assert torch.equal(kv.flatten(1, 2), expected)
compiled = torch.zeros_like(kv)
torch.compile(write, backend="aot_eager", fullgraph=True)(compiled)
assert torch.equal(compiled, kv)
print("installed")
"""


def test_install_makes_vllm_imports_reach_ipex_flash():
    """In a child process, so the module alias and the op stay out of this one; vLLM and
    vllm-xpu-kernels are not installed here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", INSTALL_CHECK], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "installed", run.stderr[-3000:]
    # (each call says what took effect: the second found its own op in place)
    assert run.stderr.count("vllm_xpu_kernels.flash_attn_interface is ipex_flash.integrations."
                            "vllm") == 2, run.stderr[-3000:]
