"""SDPA's contract at the edges (errors, fake tensors, torch.compile) and the override that
routes unchanged models' torch.nn.functional.scaled_dot_product_attention calls."""
import pytest
import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash import sdpa
from ipex_flash.reference import sdpa_reference

from helpers.cases import random_qkv
from helpers.reference import OUTPUT_TOLERANCE

TORCH_SDPA = F.scaled_dot_product_attention


@pytest.mark.parametrize("case,error,match", [
    ("dtype_mismatch", RuntimeError, "same dtype"),
    ("heads_without_gqa", RuntimeError, "enable_gqa"),
    ("heads_not_dividing", RuntimeError, "divide"),
    ("mask_dtype", RuntimeError, "attn_mask dtype"),
    ("mask_shape", RuntimeError, "does not broadcast"),
    ("key_head_dim", ValueError, "key's head dim"),
    ("batch_dims", RuntimeError, "leading"),
    ("dropout", ValueError, "dropout_p"),
    ("sinks_shape", ValueError, "sinks"),
])
def test_errors_name_the_argument(case, error, match):
    q, k, v = random_qkv(2, 4, 2, 8, 9, 16, torch.float32)
    kwargs = dict(enable_gqa=True)
    if case == "dtype_mismatch":
        k = k.double()
    elif case == "heads_without_gqa":
        kwargs = {}
    elif case == "heads_not_dividing":
        k, v = k[:, :1].repeat(1, 3, 1, 1), v[:, :1].repeat(1, 3, 1, 1)
    elif case == "mask_dtype":
        kwargs["attn_mask"] = torch.zeros(8, 9, dtype=torch.int32)
    elif case == "mask_shape":
        kwargs["attn_mask"] = torch.ones(7, 9, dtype=torch.bool)
    elif case == "key_head_dim":
        k = k[..., :8]
    elif case == "batch_dims":
        k, v = k[:1], v[:1]
    elif case == "dropout":
        kwargs["dropout_p"] = 1.5
    elif case == "sinks_shape":
        kwargs["sinks"] = torch.zeros(3)
    with pytest.raises(error, match=match):
        ipex_flash.scaled_dot_product_attention(q, k, v, **kwargs)


def test_single_kv_head_broadcasts_without_enable_gqa():
    """torch broadcasts one K/V head over the query heads even without enable_gqa."""
    q, k, v = random_qkv(2, 4, 1, 20, 30, 32, torch.float32)
    out = ipex_flash.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.double(), sdpa_reference(q, k, v, is_causal=True),
                               rtol=1e-5, atol=1e-5)


def test_opcheck_with_mask_and_sinks():
    q, k, v = random_qkv(2, 4, 2, 20, 30, 32, torch.float32)
    mask = (torch.rand(2, 1, 20, 30) > 0.3).expand(2, 4, 20, 30)
    torch.library.opcheck(torch.ops.ipex_flash.attention_forward.default, (q, k, v),
                          dict(attn_mask=mask, sinks=torch.randn(4)))


def model_block(q, k, v, mask):
    """What a model's attention does: project, call SDPA, project."""
    out = F.scaled_dot_product_attention(q * 0.5, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_override_routes_and_restores(dtype, monkeypatch):
    q, k, v = random_qkv(2, 4, 2, 40, 50, 64, dtype)
    mask = torch.rand(2, 1, 40, 50) > 0.2
    calls = []
    real = sdpa.scaled_dot_product_attention
    monkeypatch.setattr(sdpa, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with ipex_flash.sdpa_override():
        got = model_block(q, k, v, mask)
        model_block(q.double(), k.double(), v.double(), mask)  # float64: torch's own
    assert len(calls) == 1
    assert F.scaled_dot_product_attention is TORCH_SDPA
    want = sdpa_reference(q * 0.5, k, v, mask).transpose(1, 2).flatten(2)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


def test_override_serves_inside_a_device_context(monkeypatch):
    """torch's device context (`with torch.device(...)`, set_default_device) is a function
    mode of its own; the override still serves calls made inside one (other modes and tensor
    subclasses go to torch: tests/distributed/test_distributed_failures.py)."""
    q, k, v = random_qkv(1, 2, 2, 8, 8, 16, torch.float32)
    calls = []
    real = sdpa.scaled_dot_product_attention
    monkeypatch.setattr(sdpa, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with ipex_flash.sdpa_override(), torch.device("cpu"):
        F.scaled_dot_product_attention(q, k, v)
    assert len(calls) == 1


def test_global_switch():
    try:
        ipex_flash.enable_sdpa_override()
        assert F.scaled_dot_product_attention is not TORCH_SDPA
    finally:
        ipex_flash.enable_sdpa_override(False)
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_override_under_torch_compile_with_gradients():
    q, k, v = random_qkv(2, 4, 2, 40, 50, 32, torch.float32)
    mask = torch.rand(2, 1, 40, 50) > 0.2
    torch._dynamo.reset()
    targets = []

    def recording_inductor(graph_module, example_inputs):
        targets.extend(str(node.target) for node in graph_module.graph.nodes)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(graph_module, example_inputs)

    with ipex_flash.sdpa_override():
        compiled = torch.compile(model_block, fullgraph=True, dynamic=False,
                                 backend=recording_inductor)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = compiled(*leaves, mask)
        out.sum().backward()
    assert any("ipex_flash.attention_forward" in target for target in targets), targets
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want = sdpa_reference(ref_leaves[0] * 0.5, *ref_leaves[1:], mask).transpose(1, 2).flatten(2)
    want.sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for got, ref in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=1e-5, atol=1e-5)
