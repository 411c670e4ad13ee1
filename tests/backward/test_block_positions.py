"""Masks, ALiBi and dropout at global positions (BlockPositions, what the rings give each
call): the blocks of rows and keys of one attention, each run as its own call at its global
positions with the whole call's window, see, bias and keep exactly what the whole call does.
The keys are cut at 13 and 38 (off the four-key groups the keep-mask is drawn in), the rows
at 21: the blocks' outputs merged by their LSEs are the whole call's output, and their
gradients, given the whole output and LSE, add up to the whole call's. The same blocks drawn at their local positions keep another mask, which
these checks see. Vector kernels in float32, the matrix kernels emulated in bfloat16."""
import pytest
import torch

from ipex_flash.distributed._blocks import band, rectangle_call
from ipex_flash.ops import launch
from ipex_flash.ops.flash_attn import attend, attend_backward
from ipex_flash.ops.flash_attn_args import BlockPositions

N, ROW_CUTS, KEY_CUTS = 50, (0, 21, 50), (0, 13, 38, 50)
P = 0.3
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _blocks(causal, window):
    """(call, its BlockPositions) for every pair of row and key runs that sees something."""
    low, high = band(causal, window)
    for r0, r1 in zip(ROW_CUTS, ROW_CUTS[1:]):
        for k0, k1 in zip(KEY_CUTS, KEY_CUTS[1:]):
            call = rectangle_call((r0, r1), r0, (k0, k1), k0, low, high)
            if call is not None:
                yield call, BlockPositions.of([(0, *call.starts)], torch.device("cpu"))


def _args(call, whole_window, slopes, seed, placed_at):
    """A placed call is masked by the whole call's window from its global diagonal, an
    unplaced one by its own window around its own diagonal (what the rings' plans give)."""
    window = whole_window if placed_at else call.window
    return (None, None, 0, 0, None, False, *window, 0.0, slopes, P, seed, *placed_at)


def _whole_and_blocks(dtype, causal, window, alibi, heads):
    torch.manual_seed(3)
    q = torch.randn(2, N, heads[0], 64, dtype=dtype)
    k, v = (torch.randn(2, N, heads[1], 64, dtype=dtype) for _ in range(2))
    grad_out = torch.randn_like(q)
    slopes = torch.rand(heads[0]) * 0.3 if alibi else None
    seed = launch.draw_dropout_seed(q.device)
    whole_window = (window[0], 0 if causal else window[1])
    out, lse = attend(q, k, v, None, None, 0, 0, None, causal, *whole_window, 0.0, slopes, P,
                      seed)
    grads = attend_backward(grad_out, q, k, v, out, lse, None, None, 0, 0, None, causal,
                            *whole_window, 0.0, slopes, P, seed)

    def by_blocks(placed: bool):
        acc = torch.zeros(out.shape, dtype=torch.float32)
        acc_lse = torch.full(lse.shape, float("-inf"))
        parts = [torch.zeros(t.shape, dtype=torch.float32) for t in (q, k, v)]
        for call, positions in _blocks(causal, window):
            rows, keys = slice(*call.q_rows), slice(*call.k_rows)
            placed_at = (None, positions) if placed else ()
            b_out, b_lse = attend(q[:, rows], k[:, keys], v[:, keys],
                                  *_args(call, whole_window, slopes, seed, placed_at))
            merged = torch.logaddexp2(acc_lse[..., rows], b_lse)
            weight = lambda w: torch.exp2(w - merged).transpose(1, 2).unsqueeze(-1)  # noqa
            acc[:, rows] = acc[:, rows] * weight(acc_lse[..., rows]) + b_out.float() * weight(b_lse)
            acc_lse[..., rows] = merged
            b_grads = attend_backward(grad_out[:, rows], q[:, rows], k[:, keys], v[:, keys],
                                      out[:, rows], lse[..., rows],
                                      *_args(call, whole_window, slopes, seed,
                                            (positions,) if placed else ()))
            for part, grad, cut in zip(parts, b_grads, (rows, keys, keys)):
                part[:, cut] += grad.float()
        return [acc, acc_lse, *parts]

    return [out.float(), lse, *(g.float() for g in grads)], by_blocks


def _errors(got, want):
    return [((a - b).abs().max() / max(1.0, b.abs().max())).item() for a, b in zip(got, want)]


VECTOR, EMULATED, EMULATED8 = ("0", torch.float32), ("emulate", torch.bfloat16), (
    "emulate8", torch.bfloat16)
# Default tier: the emulated matrix kernels once, causal with ALiBi (the register forward, dQ and
# dK/dV with the misaligned keys' shift); their other cases, whose builds take minutes each on
# the CPU device, run in the long tier.
CASES = [(VECTOR, False, (-1, -1), False),
         pytest.param(EMULATED, False, (-1, -1), False, marks=pytest.mark.full)] + [
    (VECTOR, True, (-1, -1), True), (EMULATED, True, (-1, -1), True),
    pytest.param(EMULATED8, True, (-1, -1), True, marks=pytest.mark.full),
    (VECTOR, False, (9, 17), True)]


@pytest.mark.parametrize("mode_dtype,causal,window,alibi", CASES)
def test_blocks_keep_and_bias_what_the_whole_does(monkeypatch, mode_dtype, causal, window,
                                                  alibi):
    mode, dtype = mode_dtype
    monkeypatch.setenv("IPEX_FLASH_MATRIX", mode)
    whole, by_blocks = _whole_and_blocks(dtype, causal, window, alibi, (4, 2))
    errors = _errors(by_blocks(placed=True), whole)
    assert max(errors) <= TOLERANCE[dtype], dict(zip(["out", "lse", "dq", "dk", "dv"], errors))
    # The check can fail: the blocks drawn at their own positions keep other probabilities.
    local = _errors(by_blocks(placed=False), whole)
    assert local[0] > 20 * TOLERANCE[dtype], local
