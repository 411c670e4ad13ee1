"""The rules gpu-check enforces on every kernel a GPU would build (README, "Intel GPUs").

- it builds for the target (the host planned it, and ocloc compiled it);
- its local memory fits the target's, and the host's estimate for the variant covers it (the
  estimate is what chose the tiles);
- at the common head dims (gpu_grid.COMMON_HEAD_DIMS) it neither spills nor uses private
  (scratch) memory; at other head dims these are reported, not enforced;
- an XMX kernel contains DPAS instructions.
"""
from __future__ import annotations

from ipex_flash.gpu_grid import COMMON_HEAD_DIMS

# Kernels of a matrix program that do no matrix products themselves.
_NO_PRODUCTS = ("flash_fwd_pack_kv_kernel", "flash_decode_merge_kernel")


def kernel_violations(r) -> list:
    if not r.built:
        return [f"not built: {r.error}"]
    found = []
    if r.slm > r.slm_limit:
        found.append(f"local memory {r.slm} > {r.slm_limit}")
    if r.slm > r.slm_estimate:
        found.append(f"local memory {r.slm} above the host's estimate {r.slm_estimate}")
    if r.head_dim in COMMON_HEAD_DIMS and r.spill > 0:
        found.append(f"spills {r.spill} bytes")
    if r.head_dim in COMMON_HEAD_DIMS and r.private > 0:
        found.append(f"private memory {r.private} bytes")
    if r.matrix and not any(name in r.kernel for name in _NO_PRODUCTS) and r.dpas == 0:
        found.append("XMX variant without DPAS")
    return found


def check_rules(reports: list) -> None:
    for r in reports:
        r.violations = kernel_violations(r)
