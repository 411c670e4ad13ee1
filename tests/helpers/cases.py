"""The dtypes, tiers and inputs the tests draw."""
import pytest

import ipex_flash  # noqa: F401  (imported before torch, see _runtime.py)
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Launch plans (test_launch_plans.py, test_kvcache_call_plans.py, test_serving_step_plans.py).
PLAN_CALLS = 3  # the first builds the plan, the others run it


def tiered(values, default, multi=False):
    """`values` for pytest.mark.parametrize with those not in `default` marked "full": the
    default tier keeps the named cases (at least one of every feature, dtype and mask), the
    long tier (`-m full`) runs the whole grid. multi: each value is a tuple of several
    arguments."""
    full = pytest.mark.full
    return [v if v in default else
            pytest.param(*(v if multi else (v,)), marks=full) for v in values]


def random_qkv(batch, heads_q, heads_kv, len_q, len_k, head_dim, dtype, layout="bhnd"):
    """q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D). layout "bnhd" makes them as (B, N, H, D)
    and transposes to (B, H, N, D) without a copy, as models with that layout do."""
    def make(heads, n):
        if layout == "bnhd":
            return torch.randn(batch, n, heads, head_dim, dtype=dtype).transpose(1, 2)
        return torch.randn(batch, heads, n, head_dim, dtype=dtype)

    return make(heads_q, len_q), make(heads_kv, len_k), make(heads_kv, len_k)
