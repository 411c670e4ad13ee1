import zlib

import pytest
import torch

import ipex_flash  # noqa: F401  (registers the ops)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (rtol, atol) of the kernel's output against the float64 reference computed from the same
# (already rounded) inputs: float32 accumulates like the reference; half types add one
# rounding of the output (2^-11 relative for float16, 2^-8 for bfloat16).
OUTPUT_TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
# The log-sum-exp is float32 for every input dtype.
LSE_TOLERANCE = (1e-5, 1e-5)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Every test draws fresh inputs from a seed of its own (stable across runs, so a failure
    reproduces)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def random_qkv(batch, heads_q, heads_kv, len_q, len_k, head_dim, dtype, layout="bhnd"):
    """q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D). layout "bnhd" makes them as (B, N, H, D)
    and transposes to (B, H, N, D) without a copy, as models with that layout do."""
    def make(heads, n):
        if layout == "bnhd":
            return torch.randn(batch, n, heads, head_dim, dtype=dtype).transpose(1, 2)
        return torch.randn(batch, heads, n, head_dim, dtype=dtype)

    return make(heads_q, len_q), make(heads_kv, len_k), make(heads_kv, len_k)


def assert_matches_reference(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
    if lse is not None:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.double(), ref_lse, rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])
