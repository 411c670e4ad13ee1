"""Tolerances of the kernels' results against the float64 reference, and the checks that
apply them."""
import ipex_flash  # noqa: F401  (imported before torch, see _runtime.py)
import torch
from ipex_flash.reference import flash_attn_reference, sdpa_reference

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


def assert_matches_reference(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
    if lse is not None:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.double(), ref_lse, rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])


def check_against_reference(out, lse, q, k_cache, v_cache, lengths, dtype, **options):
    """Sequence b's output and LSE against the float64 reference over its first lengths[b]
    cache rows; ALiBi slopes of shape (B, Hq) give each sequence its own row."""
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    slopes = options.pop("alibi_slopes", None)
    for b, length in enumerate(lengths):
        if slopes is not None:
            options["alibi_slopes"] = slopes[b] if slopes.dim() == 2 else slopes
        ref_out, ref_lse = flash_attn_reference(q[b:b + 1], k_cache[b:b + 1, :length],
                                                v_cache[b:b + 1, :length], **options)
        torch.testing.assert_close(out[b:b + 1].double(), ref_out, rtol=rtol, atol=atol)
        finite = ~torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse[b:b + 1]), ~finite)
        torch.testing.assert_close(lse[b:b + 1].double()[finite], ref_lse[finite],
                                   rtol=LSE_TOLERANCE[0], atol=LSE_TOLERANCE[1])


def check_sinks_against_reference(out, q, k_cache, v_cache, lengths, sinks, dtype):
    """Sequence b's output, with a sink per query head, against the float64 SDPA reference over
    its first lengths[b] cache rows (flash-attn's (B, N, H, D) layout)."""
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for b, length in enumerate(lengths):
        ref = sdpa_reference(q[b:b + 1].transpose(1, 2), k_cache[b:b + 1, :length].transpose(1, 2),
                             v_cache[b:b + 1, :length].transpose(1, 2), sinks=sinks)
        torch.testing.assert_close(out[b:b + 1].double(), ref.transpose(1, 2), rtol=rtol,
                                   atol=atol)
