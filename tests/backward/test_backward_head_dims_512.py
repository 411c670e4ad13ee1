"""The backward at head dims past 256 (up to v's limit, 512, and q's and k's, 576): dq, dk, dv
against float64 autograd at sizes off the tiles' powers of two (320, 448), at 512 and with V's
head dim apart (512 / 256, 576 / 512); float32, bfloat16, float16, causal and not, GQA; the
vector kernels and the matrix kernels emulated. And where a GPU's local memory holds no
backward kernel for a head dim, the error that names the head dim, the device and the largest
head dim it fits, through a GPU profile on the CPU device."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference

from helpers.cases import tiered
from helpers.reference import OUTPUT_TOLERANCE

DIMS = [(320, 320), (448, 448), (512, 512), (512, 256), (576, 512)]
CASES = [(dtype, d, d_v) for dtype in (torch.float32, torch.bfloat16, torch.float16)
         for d, d_v in DIMS]
DEFAULT = [(torch.float32, 320, 320), (torch.float32, 512, 256), (torch.float32, 576, 512),
           (torch.bfloat16, 448, 448), (torch.float16, 320, 320)]


def qkv(batch, heads_q, heads_kv, len_q, len_k, d, d_v, dtype):
    return (torch.randn(batch, heads_q, len_q, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, d_v, dtype=dtype))


def grads_of(fn, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    fn(*leaves).backward(grad_out)
    return [t.grad for t in leaves]


def check_gradients(dtype, d, d_v, causal, len_q=21, len_k=45):
    """dq, dk, dv of ipex_flash.attention (GQA 3) against float64 autograd through the
    reference, by the rule of tests/forward/test_value_head_dim.py: max error <= rtol *
    max(1, max |gradient|), rtol the output's (1e-5 float32, 1e-2 bfloat16, 2e-3 float16)."""
    q, k, v = qkv(1, 6, 2, len_q, len_k, d, d_v, dtype)
    grad_out = torch.randn(1, 6, len_q, d_v, dtype=dtype)
    got = grads_of(lambda a, b, c: ipex_flash.attention(a, b, c, causal=causal), (q, k, v),
                   grad_out)
    want = grads_of(lambda a, b, c: attention_reference(a, b, c, causal=causal)[0],
                    (q.double(), k.double(), v.double()), grad_out.double())
    rtol, _ = OUTPUT_TOLERANCE[dtype]
    for name, g, w, like in zip("qkv", got, want, (q, k, v)):
        assert g.dtype == dtype and g.shape == like.shape, name
        error = (g.double() - w).abs().max().item()
        assert error <= rtol * max(1.0, w.abs().max().item()), (name, error)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,d,d_v", tiered(CASES, DEFAULT, multi=True))
def test_gradients_match_reference(dtype, d, d_v, causal):
    check_gradients(dtype, d, d_v, causal)


@pytest.mark.parametrize("mode,d,d_v", [
    ("emulate", 320, 320), pytest.param("emulate", 576, 512, marks=pytest.mark.full),
    pytest.param("emulate8", 448, 448, marks=pytest.mark.full)])
def test_matrix_backward_emulated(monkeypatch, mode, d, d_v):
    """bfloat16 gradients on the matrix backward (SLM-staged past head dim 128, as GPUs with
    XMX run it), its joint_matrix calls emulated."""
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    variant = C.plan("backward", "", "bfloat16", max(d, d_v), 0, 1, mode)["variant"]
    assert variant.matrix_m > 0 and not variant.matrix_registers
    for causal in (False, True):
        check_gradients(torch.bfloat16, d, d_v, causal)


# The largest head dim whose backward fits each kind of GPU's local memory per work-group:
# the vector kernels' float32 tiles (float32, and every dtype on Meteor Lake, which has no
# XMX), the matrix kernels' (16-bit inputs on XMX).
VECTOR_LIMIT = {128: 320, 64: 160}
MATRIX_LIMIT = {128: 576, 64: 480}
TITLES = {"pvc": "Data Center GPU Max", "bmg": "Battlemage", "dg2": "Arc A-series",
          "lnl": "Lunar Lake", "mtl": "Meteor Lake", "arl-h": "Arrow Lake-H"}


def backward_limit(name, dtype):
    kib = C.profile_limits(name)["local_mem_bytes"] // 1024
    matrix = dtype != "float32" and bool(C.profile_limits(name)["matrix"])
    return kib, (MATRIX_LIMIT if matrix else VECTOR_LIMIT)[kib]


@pytest.mark.parametrize("name", C.profile_names())
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_backward_fits_or_names_its_limit(name, dtype):
    """Up to the limit the backward plans within the GPU's local memory; past it, at every
    head dim the API takes, the error names the head dim, the GPU, its local memory and the
    limit."""
    kib, limit = backward_limit(name, dtype)
    for head_dim in [160, 192, 320, 352, 448, 480, 512, 576]:
        if head_dim <= limit:
            plan = C.plan("backward", name, dtype, head_dim)
            assert plan["slm_bytes"] <= kib * 1024, (head_dim, plan)
            continue
        message = (rf"no backward kernel for head dim {head_dim} on {name} \({TITLES[name]}\): "
                   rf"its {kib} KiB of local memory per work-group .* fits head dims up to "
                   rf"{limit}")
        with pytest.raises(RuntimeError, match=message):
            C.plan("backward", name, dtype, head_dim)


@pytest.fixture
def profile(monkeypatch):
    def set_profile(name, mode="auto"):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        C.set_device_profile(name)
    yield set_profile
    C.set_device_profile("")


@pytest.mark.parametrize("name,dtype,d,d_v", [("mtl", torch.float32, 512, 512),
                                              ("bmg", torch.float32, 576, 512)])
def test_backward_error_reaches_the_caller(profile, name, dtype, d, d_v):
    """A training call on such a GPU (its profile on the CPU device): the forward runs (the
    vector forward's K/V slabs), and backward() raises the error naming the limit, through the
    same variant choice a call on that GPU takes."""
    profile(name)
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 5, 9, d, d_v, dtype))
    out = ipex_flash.attention(q, k, v, causal=True)
    assert torch.isfinite(out).all()
    _, limit = backward_limit(name, str(dtype).removeprefix("torch."))
    with pytest.raises(RuntimeError, match=rf"no backward kernel for head dim {max(d, d_v)} "
                                           rf"on {name} .* fits head dims up to {limit}"):
        out.sum().backward()
