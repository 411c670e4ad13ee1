"""The matrix-engine backward (flash_bwd_matrix.hpp: dK/dV and dQ on joint_matrix) through the
backward suite's own checks, once per matrix mode:
  emulated  IPEX_FLASH_MATRIX=emulate: the same kernels with the joint_matrix calls replaced by
            sub-group arithmetic of the same tile semantics (matrix_tile.hpp); runs anywhere
  emulated8 IPEX_FLASH_MATRIX=emulate8: the same, in DG2 / Arrow Lake-H's XMX shape (N = 8
            with sub-group 8, 8 x 16 tiles): the kernels' 8-wide form
  16, 8     the real joint_matrix kernels with AMX's and XMX's tile heights; run where the
            SYCL CPU device has a matrix engine (AMX)
Each case first checks that the mode really selects the matrix backward for the call."""
import pytest
import torch

import ipex_flash
from ipex_flash._runtime import C
from ipex_flash.reference import flash_attn_reference

from helpers.backward import HEAD_DIMS, LENGTHS, check_gradients, check_transposed_layout_and_scale
from helpers.cases import random_qkv, tiered
from helpers.dropout import check_reported_mask
from helpers.flash_attn import OPTIONS, check_gradients_match_reference, pack
from helpers.sdpa import B, HKV, HQ, assert_grads_close, check_masked_gradients, grads_of, mask_of
from ipex_flash.reference import sdpa_reference

HAS_MATRIX_ENGINE = C.device_info()["matrix_engine"]
needs_engine = pytest.mark.skipif(
    not HAS_MATRIX_ENGINE,
    reason="the SYCL CPU device of this machine has no matrix engine (AMX bf16 tiles); the "
           "emulated mode runs these kernels here, and gpu-check builds them for Intel GPUs")
MODES = [pytest.param("emulate", id="emulated"),
         pytest.param("emulate8", id="emulated8"),
         pytest.param("16", id="amx16", marks=needs_engine),
         pytest.param("8", id="xmx8", marks=needs_engine)]
# The engine tiles float16 only where it has FP16 tiles (not Sapphire Rapids' AMX): the real
# modes run bfloat16, the emulated one both.
DTYPES_OF = {"emulate": [torch.float16, torch.bfloat16], "emulate8": [torch.bfloat16],
             "16": [torch.bfloat16],
             "8": [torch.bfloat16]}


@pytest.fixture
def matrix_backward(monkeypatch):
    """Sets IPEX_FLASH_MATRIX and checks that the backward variant chosen for (dtype,
    head_dim, features) under it is a matrix one."""
    def use(mode, dtype, head_dim, features=0):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        name = str(dtype).removeprefix("torch.")
        plan = C.plan("backward", "", name, head_dim, features, 1, mode)
        # emulate: the dQ and dK/dV kernels with their tiles in registers up to head dim 128
        # (dK/dV in two passes over the rows past 64), as PVC, BMG and Lunar Lake run them;
        # emulate8: both up to 128 too, as DG2 and Arrow Lake-H run them (dQ with two or more
        # sub-groups per rows from 32, dK/dV in two passes from 48), but dK/dV staged through
        # SLM with softcap beside a float mask past 64.
        padded = plan["variant"].head_dim
        softcap_wide_float = features & 1 and features & (8 | 16 | 32) and padded > 64
        dq_registers = padded <= 128
        dkdv_registers = dq_registers and (mode != "emulate8" or not softcap_wide_float)
        assert plan["header"] == ("programs/flash_bwd_dkdv_registers.hpp" if dkdv_registers
                                  else "programs/flash_bwd_dq_registers.hpp" if dq_registers
                                  else "programs/flash_bwd_matrix.hpp"), plan
        assert plan["variant"].matrix_registers == dq_registers
        assert plan["variant"].dkdv_registers == dkdv_registers
        assert plan["variant"].matrix_m > 0
        assert plan["variant"].matrix_n == (8 if mode == "emulate8" else 16)
    return use


def dtypes(mode):
    return DTYPES_OF[mode]


# Default tier: an odd head dim (both kernels with their tiles in registers, dK/dV in one pass)
# and 128 (dK/dV in two passes over the rows); a single row, and Nq > Nk over several blocks.
# The long tier runs the whole grid.
@pytest.mark.parametrize("len_q,len_k", tiered(LENGTHS, [(1, 1), (200, 77)], multi=True))
@pytest.mark.parametrize("head_dim", tiered(HEAD_DIMS, [59, 128]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_reference(matrix_backward, mode, causal, head_dim, len_q, len_k):
    # float16 past d = 64: test_wide_head_dkdv_in_registers's long tier.
    for dtype in dtypes(mode) if head_dim <= 64 else [torch.bfloat16]:
        matrix_backward(mode, dtype, head_dim)
        check_gradients(*random_qkv(2, 2, 2, len_q, len_k, head_dim, dtype), causal, dtype)


@pytest.mark.parametrize("heads_q,heads_kv", [(4, 2), (6, 1)])
@pytest.mark.parametrize("mode", MODES)
def test_grouped_query_heads(matrix_backward, mode, heads_q, heads_kv):
    for dtype in dtypes(mode):
        matrix_backward(mode, dtype, 64)
        check_gradients(*random_qkv(2, heads_q, heads_kv, 90, 70, 64, dtype), True, dtype)


# Default tier: the 8-wide form (the 16-wide one's transposed case, a head dim of its own to
# compile, runs in the long tier; test_gradients_match_reference covers its scale).
@pytest.mark.parametrize("mode", [pytest.param("emulate", id="emulated", marks=pytest.mark.full),
                                  *MODES[1:]])
def test_transposed_layout_and_scale(matrix_backward, mode):
    for dtype in dtypes(mode):
        matrix_backward(mode, dtype, 80)
        check_transposed_layout_and_scale(dtype)


# Default tier: causal with a window, softcap and ALiBi at once (each option alone: long tier).
@pytest.mark.parametrize("causal,window,softcap,alibi",
                         tiered(OPTIONS, [(True, (20, -1), 2.5, True)], multi=True))
@pytest.mark.parametrize("mode", MODES)
def test_windows_softcap_alibi(matrix_backward, mode, causal, window, softcap, alibi):
    features = (1 if softcap else 0) | (2 if alibi else 0)
    matrix_backward(mode, torch.bfloat16, 64, features)
    check_gradients_match_reference(torch.bfloat16, causal, window, softcap, alibi)


# Head dims in (64, 128]: the register dQ kernel (16-key slabs on the GPUs, one reduction step
# of its dQ product; 32 in the emulation's 16 x 32 tiles) and the register dK/dV kernel in two
# passes, under each score change: their per-sub-group mask votes (bool and float masks with a
# hidden block), softcap and ALiBi with a window, dropout (the dK pass reads its factors off
# P after dropout). Default tier: the options together; the long tier the masks and dropout
# (each a build of minutes on the CPU device; at d = 64 the default tier has them). (Two
# reduction steps per slab, the emulation's form at head dims 80 and 112: the long tier of
# test_transposed_layout_and_scale.)
@pytest.mark.parametrize("case", tiered(["bool", "float32", "options", "dropout"],
                                        ["options"]))
def test_wide_head_dq_in_registers(matrix_backward, case):
    head_dim = 128
    features = {"bool": 4, "float32": 8, "options": 1 | 2, "dropout": 0}[case]
    matrix_backward("emulate", torch.bfloat16, head_dim, features)
    if case in ("bool", "float32"):
        check_masked_gradients(torch.bfloat16, case, True, head_dim)
    elif case == "options":
        check_gradients_match_reference(torch.bfloat16, True, (20, -1), 2.5, True, head_dim)
    else:
        check_reported_mask(torch.bfloat16, True, head_dim)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_dropout_mask_applies(matrix_backward, mode, causal):
    for dtype in dtypes(mode):
        matrix_backward(mode, dtype, 64)
        check_reported_mask(dtype, causal)


@pytest.mark.parametrize("kind", ["bool", "float32"])
@pytest.mark.parametrize("mode", MODES)
def test_sdpa_masks(matrix_backward, monkeypatch, mode, kind):
    """Emulated, the matrix backward with a mask; on the CPU device's AMX, the vector backward
    by design (DeviceLimits::matrix_masked_backward: its compiler crashes on the masked matrix
    backward), which the plan must say and the gradients must still meet."""
    features = 4 if kind == "bool" else 8
    if mode in ("16", "8"):
        monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
        plan = C.plan("backward", "", "bfloat16", 64, features, 1, mode)
        assert plan["header"] == "programs/flash_bwd.hpp", plan
    else:
        matrix_backward(mode, torch.bfloat16, 64, features)
    check_masked_gradients(torch.bfloat16, kind, True)


# Default tier: the 8-wide form (the 16-wide one, a head dim of its own to compile: long tier).
@pytest.mark.parametrize("mode", [pytest.param("emulate", id="emulated", marks=pytest.mark.full),
                                  *MODES[1:]])
def test_varlen(matrix_backward, mode):
    """Packed sequences of lengths 1 to 90 (test_flash_attn_api's varlen gradient check, in
    bfloat16 here: the matrix kernels take 16-bit inputs only)."""
    matrix_backward(mode, torch.bfloat16, 32)
    check_varlen_gradients(32, torch.bfloat16)


def check_varlen_gradients(head_dim, dtype):
    lengths = [(5, 9), (1, 1), (40, 33), (70, 90)]
    qs, ks, vs = zip(*[(torch.randn(nq, 4, head_dim, dtype=dtype),
                        torch.randn(nk, 2, head_dim, dtype=dtype),
                        torch.randn(nk, 2, head_dim, dtype=dtype)) for nq, nk in lengths])
    q, cu_q, max_q = pack(qs)
    k, cu_k, max_k = pack(ks)
    v, _, _ = pack(vs)
    grad_out = torch.randn(q.shape, dtype=dtype)
    a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
    ipex_flash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, max_q, max_k,
                                      causal=True).backward(grad_out)
    for i in range(len(lengths)):
        rows_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rows_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
        a64, b64, c64 = (t.double()[None].requires_grad_() for t in (qs[i], ks[i], vs[i]))
        flash_attn_reference(a64, b64, c64, causal=True)[0].backward(
            grad_out[rows_q].double()[None])
        for got, want in ((a.grad[rows_q], a64.grad[0]), (b.grad[rows_k], b64.grad[0]),
                          (c.grad[rows_k], c64.grad[0])):
            error = (got.double() - want).abs().max().item()
            assert error <= 1e-2 * max(1.0, want.abs().max().item()), (i, error)


# Head dims in (64, 128]: the register dK/dV kernel walks the rows twice (dV, then dK), each
# pass over every query head of its K/V head (grouped heads) and only the rows its keys' block
# can see (packed sequences of lengths 1 to 90, causal), in both 16-bit types.
# Default tier: bfloat16 (float16's kernels at d = 128, minutes of building each on the CPU
# device: long tier).
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, marks=pytest.mark.full),
                                   torch.bfloat16])
@pytest.mark.parametrize("case", ["grouped", "varlen"])
def test_wide_head_dkdv_in_registers(matrix_backward, case, dtype):
    head_dim = 128  # the kernels test_gradients_match_reference builds
    matrix_backward("emulate", dtype, head_dim)
    if case == "grouped":
        check_gradients(*random_qkv(2, 6, 2, 90, 70, head_dim, dtype), True, dtype)
    else:
        check_varlen_gradients(head_dim, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_differs_from_vector_kernel(matrix_backward, mode, monkeypatch):
    """The matrix backward really ran: from the same forward output, P and dS rounded to
    bfloat16 before their products give other low bits than the vector kernel's float32
    products (both match the reference in the tests above)."""
    q, k, v = random_qkv(1, 2, 2, 100, 100, 64, torch.bfloat16)
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16)
    out, lse = torch.ops.ipex_flash.attention_forward(q, k, v, True, None, 0.0, None)

    def grads():
        return torch.ops.ipex_flash.attention_backward(grad_out, q, k, v, out, lse, causal=True)

    matrix_backward(mode, torch.bfloat16, 64)
    matrix = grads()
    monkeypatch.setenv("IPEX_FLASH_MATRIX", "0")
    vector = grads()
    assert any(not torch.equal(m, v) for m, v in zip(matrix, vector))


# The 8-wide register kernels (DG2, Arrow Lake-H). dQ: one sub-group per rows at d = 16, two
# from 32, each with its share of dQ^T. dK/dV: both accumulators resident in one walk over the
# rows at d = 16, one at a time in two walks at 32, and two sub-groups per keys, each with its
# share of dK^T and dV^T, from 40 (which pads to 48: three tiles a share). Softcap alone and
# beside ALiBi or a mask too (the SLM-staged dK/dV is left to softcap with a float mask past 64).
# Default tier: d = 40 (two sub-groups for dQ and for dK/dV); the long tier 16 and 32.
@pytest.mark.parametrize("head_dim", tiered([16, 32, 40], [40]))
def test_eight_wide_backward_in_registers(matrix_backward, head_dim):
    matrix_backward("emulate8", torch.bfloat16, head_dim, 2)
    shares = {16: (1, 1), 32: (2, 1), 40: (2, 2)}[head_dim]  # (dQ's, dK/dV's)
    for features, registers in ((0, True), (4, True), (8, True), (1, True), (1 | 2, True),
                                (1 | 4, True), (1 | 8, True)):
        plan = C.plan("backward", "", "bfloat16", head_dim, features, 1, "emulate8")
        assert plan["variant"].matrix_registers, (features, plan)
        assert plan["variant"].dkdv_registers == registers, (features, plan)
        dkdv, dq = plan["kernels"][3:5]
        # A bool mask packed into bits for the register dQ (score/mask_bits_kernel.hpp).
        assert (plan["kernels"][5:] == ["ipex_flash::flash_mask_bits_kernel"]) == (
            features & 4 != 0), plan
        assert dq.startswith("ipex_flash::flash_bwd_dq_matrix_registers_kernel"), plan
        assert dq.endswith(f", {str(registers).lower()}, {shares[0]}>"), plan  # the packs' layout
        if registers:
            assert dkdv.startswith("ipex_flash::flash_bwd_dkdv_matrix_registers_kernel"), plan
            assert dkdv.endswith(f", 8, 16, 8, {shares[1]}>"), plan
        else:
            assert dkdv.startswith("ipex_flash::flash_bwd_dkdv_matrix_kernel"), plan
    for causal in (False, True):
        check_gradients(*random_qkv(2, 4, 2, 75, 101, head_dim, torch.bfloat16), causal,
                        torch.bfloat16)
    check_gradients_match_reference(torch.bfloat16, True, (20, -1), 0.0, True, head_dim)
    check_gradients_match_reference(torch.bfloat16, True, (20, -1), 2.5, False, head_dim)


# The 8-wide register dK/dV runs the query blocks that see its whole key block in a lean loop,
# without the block mask's code, with score changes but a float mask past d = 64
# (score/block_mask.hpp, split_blocks): without causal, 150 queries give each key block two
# such blocks of 64 rows, and 70 one, before a partial one. The long tier adds d = 128 (two
# walks over the rows; a build of minutes each) and the float mask.
@pytest.mark.parametrize("head_dim,change", tiered(
    [(64, "softcap"), (64, "alibi"), (64, "softcap+alibi"), (64, "bool"), (64, "float32"),
     (128, "softcap"), (128, "alibi"), (128, "softcap+alibi"), (128, "bool")],
    [(64, "softcap"), (64, "alibi"), (64, "softcap+alibi"), (64, "bool")], multi=True))
def test_eight_wide_dkdv_lean_blocks_with_score_changes(matrix_backward, head_dim, change):
    features = {"softcap": 1, "alibi": 2, "softcap+alibi": 3, "bool": 4, "float32": 8}[change]
    matrix_backward("emulate8", torch.bfloat16, head_dim, features)
    if change in ("bool", "float32"):
        check_masked_gradients(torch.bfloat16, change, False, head_dim)
    else:
        check_gradients_match_reference(torch.bfloat16, False, (-1, -1),
                                        2.5 if features & 1 else 0.0, features & 2 != 0,
                                        head_dim, lengths=(150, 90))


# Past d = 64 on the 8-wide engines each sub-group holds at most four 8-row tiles of dQ^T, dK^T
# or dV^T (32 registers), so the rows split over the fewest sub-groups that give whole tiles: 3 at
# d = 96, 4 at 128, 5 at 80 (72 pads to it), 7 at 112. Each computes the block's scores again.
# Long tier only: each builds for minutes on the CPU device (the default tier has the 8-wide
# d = 128 plain, in test_gradients_match_reference).
@pytest.mark.parametrize("head_dim", tiered([72, 96, 112, 128], []))
def test_eight_wide_backward_in_registers_past_64(matrix_backward, head_dim):
    shares = {72: 5, 96: 3, 112: 7, 128: 4}[head_dim]
    for features in (0, 1, 2, 4):
        matrix_backward("emulate8", torch.bfloat16, head_dim, features)
        dkdv, dq = C.plan("backward", "", "bfloat16", head_dim, features, 1,
                          "emulate8")["kernels"][3:5]
        assert dq.endswith(f", true, {shares}>") and dkdv.endswith(f", 8, 16, 8, {shares}>"), (
            dq, dkdv)
    for causal in (False, True):
        check_gradients(*random_qkv(2, 4, 2, 75, 101, head_dim, torch.bfloat16), causal,
                        torch.bfloat16)
    check_gradients_match_reference(torch.bfloat16, True, (20, -1), 2.5, False, head_dim)


# Softcap beside a mask (SDPA's softcap with attn_mask): dQ in registers on either engine, dK/dV in
# registers too but on the 8-wide ones beside a float mask past d = 64, staged through SLM there
# (in registers it spilled); both register kernels take the short tanh, and the blocks the causal
# mask leaves
# whole run in a loop of their own with the score changes but without the causal mask's code.
# Default tier: each engine's form once per mask kind; the rest (builds of minutes each on the
# CPU device) in the long tier.
@pytest.mark.parametrize("mode,head_dim,kind", tiered(
    [(m, d, kind) for m, d in (("emulate", 64), ("emulate8", 64), ("emulate", 128),
                               ("emulate8", 128)) for kind in ("bool", "float32")],
    [("emulate", 64, "float32"), ("emulate8", 64, "bool")],
    multi=True))
def test_softcap_beside_a_mask(matrix_backward, mode, head_dim, kind):
    dtype = torch.bfloat16
    matrix_backward(mode, dtype, head_dim, 1 | (4 if kind == "bool" else 8))
    q, k, v = random_qkv(B, HQ, HKV, 75, 101, head_dim, dtype)
    mask = mask_of(kind, (B, 1, 75, 101), torch.float32 if kind == "float32" else dtype)
    got = grads_of(lambda a, b, c: ipex_flash.scaled_dot_product_attention(
        a, b, c, attn_mask=mask, is_causal=True, enable_gqa=True, softcap=5.0), q, k, v)
    truth = grads_of(lambda a, b, c: sdpa_reference(a, b, c, mask, True, softcap=5.0),
                     q.double(), k.double(), v.double())
    plain = grads_of(lambda a, b, c: sdpa_reference(a, b, c, mask, True, softcap=5.0,
                                                    compute_dtype=dtype), q, k, v)
    assert_grads_close(got, truth, plain, dtype)
