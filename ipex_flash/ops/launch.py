"""From torch tensors to the host module's launches: SYCL queues, tensor views, the scratch
the kernels ask for, dropout seeds, running the decode or the general forward kernel as C++
chooses, and the LSE's units. Used by every op module (ops/attention.py, ops/flash_attn.py, kvcache/cache_ops.py,
kvcache/paged_varlen.py)."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ipex_flash import _runtime
from ipex_flash._runtime import C

Tensor = torch.Tensor


def queue_handle(device: torch.device) -> int:
    """0 selects the SYCL CPU device; otherwise the sycl::queue* of the current XPU stream
    (untested here: no machine of ours has an Intel GPU)."""
    if device.type == "cpu":
        if _runtime.OPENMP_SPIN == "late":
            warn_openmp_spin()
        return 0
    return int(torch.xpu.current_stream(device).sycl_queue)


def default_device() -> torch.device:
    """The first XPU where torch has one (an Intel GPU with an XPU build of torch), else the
    CPU, whose tensors run on the SYCL CPU device."""
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (XPU work runs asynchronously; CPU calls return
    when done)."""
    if device.type == "xpu":
        torch.xpu.synchronize(device)


def warn_openmp_spin() -> None:
    _runtime.OPENMP_SPIN = "warned"
    warnings.warn(
        "ipex_flash: torch was imported before ipex_flash, so torch's OpenMP threads spin for "
        "milliseconds after each op and slow attention on the SYCL CPU device inside models "
        "(up to ~1.7x). Import ipex_flash before torch, or set GOMP_SPINCOUNT=10000 (or "
        "OMP_WAIT_POLICY=PASSIVE) in the environment.", RuntimeWarning, stacklevel=3)


DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.bool: "bool", torch.int32: "int32", torch.int64: "int64",
                torch.uint8: "uint8"}


def view(t: Tensor) -> "C.TensorView":
    dtype = DTYPE_NAMES.get(t.dtype) or str(t.dtype).removeprefix("torch.")
    return C.TensorView(t.data_ptr(), dtype, t.shape, t.stride())


def flash_fwd(q: "C.TensorView", k: "C.TensorView", v: "C.TensorView", out: "C.TensorView",
              lse: "C.TensorView", options: "C.AttentionOptions", device: torch.device) -> None:
    """C.flash_fwd on (B, H, N, D) views, with the scratch it asks for: the matrix-engine
    kernel reads K and V from a copy packed in tile order (the keys the sequences attend to,
    each sequence's rounded up to whole blocks: matrix/pack_rows.hpp), allocated here so that
    torch's allocator keeps it alive until the kernel has run on an XPU stream."""
    queue = queue_handle(device)
    scratch = torch.empty(C.fwd_scratch_bytes(q, k, v, options, queue), dtype=torch.uint8,
                          device=device)
    C.flash_fwd(q, k, v, out, lse, view(scratch), options, queue)


def flash_bwd(q: "C.TensorView", k: "C.TensorView", v: "C.TensorView", out: "C.TensorView",
              grad_out: "C.TensorView", lse: "C.TensorView", dq: "C.TensorView",
              dk: "C.TensorView", dv: "C.TensorView", delta: "C.TensorView",
              options: "C.AttentionOptions", device: torch.device) -> None:
    """C.flash_bwd on (B, H, N, D) views, with its scratch: the matrix-engine kernels read
    K, K^T, V and the packed Q and dO tiles from copies (twice Q, dO and 1.5 times K, V in
    size), allocated here through torch's allocator for the same reason as flash_fwd's."""
    queue = queue_handle(device)
    scratch = torch.empty(C.bwd_scratch_bytes(q, k, v, options, queue), dtype=torch.uint8,
                          device=device)
    C.flash_bwd(q, k, v, out, grad_out, lse, dq, dk, dv, delta, view(scratch), options, queue)


def pack_keys_used(options: "C.AttentionOptions", keys: Tensor, total: int) -> Tensor:
    """Sizes the matrix forward's K/V pack of a KV cache by the keys its sequences attend to,
    keys (B,) int32 (seqlens_k, less any left pad), total their sum (read by the caller with
    the lengths it reads anyway), rather than by B x max_seqlen_k: a serving step of short
    sequences and one long one would pack B copies of the longest. Returns their prefix sums,
    which the caller keeps alive until the launch has returned."""
    cu_keys = torch.nn.functional.pad(keys.cumsum(0, dtype=torch.int32), (1, 0))
    options.cu_keys_used, options.keys_used = view(cu_keys), total
    return cu_keys


def dropout_params(dropout_p: float, dropout_seed: Optional[Tensor]) -> "C.DropoutParams":
    if dropout_p == 0.0:
        return C.DropoutParams(0.0, 0, 0)
    seed, offset = (int(x) % 2**64 for x in dropout_seed.tolist())
    return C.DropoutParams(dropout_p, seed, offset)


def draw_dropout_seed(device: torch.device) -> Tensor:
    """(seed, offset) as a CPU int64 tensor, drawn from torch's default generator for the
    device, so torch.manual_seed makes dropout reproducible."""
    generator_device = device if device.type != "meta" else torch.device("cpu")
    words = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=generator_device)
    return words.cpu()


def with_contiguous_last_dim(t: Tensor) -> Tensor:
    # The kernels read rows as contiguous vectors; other layouts pay one copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def output_like(q: Tensor, head_dim_v: int) -> Tensor:
    """An uninitialised output for q with v's head dim, its dimensions in q's memory order (a
    (B, N, H, D) tensor seen as (B, H, N, D) gets a (B, N, H, Dv) one seen the same way)."""
    if q.shape[-1] == head_dim_v:
        return torch.empty_like(q)
    order = sorted(range(q.dim() - 1), key=lambda i: -q.stride(i))  # outermost first
    out = q.new_empty([q.shape[i] for i in order] + [head_dim_v])
    return out.permute(*(order.index(i) for i in range(q.dim() - 1)), q.dim() - 1)


def attention_outputs(q: Tensor, head_dim_v: int, lse_shape: tuple, want_lse: bool = True,
                      out: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """Every entry point's (out, lse): out uninitialised in q's memory order with v's head dim
    (output_like), or the caller's own (out=); lse float32 of lse_shape, or None where nothing
    reads it (a launch plan then keeps it in its scratch)."""
    if out is None:
        out = output_like(q, head_dim_v)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if want_lse else None
    return out, lse


# The kernels keep each row's log-sum-exp in their exp2 domain (log2 of the sum of
# exp2(scale * log2(e) * q.k)), so that the backward recomputes probabilities from the scores
# the forward used without a round trip through the natural log. Users see the natural log.
LN2 = 0.6931471805599453


def natural_lse(lse: Tensor, in_place: bool = False) -> Tensor:
    """The natural-log LSE users see, from the kernels' exp2-domain one: a new tensor, or
    `lse` itself converted where nothing else reads it (the calls without a backward)."""
    return lse.mul_(LN2) if in_place else lse * LN2


def wants_backward(*tensors: Tensor) -> bool:
    """Whether autograd runs this forward for inputs that need gradients (eager autograd hands
    an op its inputs as they are, requires_grad included; a traced graph's forward does not
    know, and may take the decode kernel: its gradients are then accurate, not exact)."""
    return any(t.requires_grad for t in tensors)


def float_sinks(sinks: Optional[Tensor]) -> Optional[Tensor]:
    # Read by address: float32 and dense, and kept referenced until the launch has returned.
    return None if sinks is None else sinks.to(torch.float32).contiguous()


def nothing_to_attend(q: Tensor, k: Tensor) -> bool:
    """q (B, Hq, Nq, D) and k (B, Hkv, Nk, D): no query row, or no key for any row. Such calls
    launch no kernel: see fill_unattended and the backward ops."""
    return q.numel() == 0 or k.shape[2] == 0


def fill_unattended(out: Tensor, lse: Tensor, sinks: Optional[Tensor] = None) -> None:
    """out and lse of rows that see no key: 0, and an LSE of -inf (with sinks, (Hq,) float32,
    the sink's logit, the only term of the row's softmax denominator), in the kernels' exp2
    domain as they would write it (natural_lse). lse has the heads at dimension -2 in every
    layout: (B, Hq, Nq), or (Hq, total_q) packed."""
    out.zero_()
    if sinks is None:
        lse.fill_(float("-inf"))
    else:
        lse.copy_((sinks / LN2)[:, None].expand_as(lse))


def run_forward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                options: "C.AttentionOptions", max_len_k: Optional[int] = None,
                num_splits: int = 0, backward_follows: bool = False,
                keys_used: Optional[tuple[Tensor, int]] = None) -> None:
    """The decode kernel or the general forward kernel, as C++ chooses (C.takes_decode_kernel,
    sycl_src/host/variants/decode_or_general.hpp): few query rows per K/V head (decoding, small
    queries) without dropout take the decode kernel, which splits the keys across work-groups
    (num_splits of them, at most C.most_splits(keys), or as many as it chooses for 0).
    q (B, Hq, Nq, D), out (B, Hq, Nq, Dv); k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), or a KV cache
    seen so (options.seqlens_k, maybe pages), whose longest sequence max_len_k is (default Nk).
    options.dropout: the call's dropout. backward_follows: the backward kernels will recompute
    this forward's scores, which they do in the general kernel's order of operations (the
    decode kernel sums q.k in another order), so the general kernel runs. keys_used: a KV
    cache's keys per sequence and their total, which size the general kernel's K/V pack
    (pack_keys_used)."""
    q_v, k_v, v_v = view(q), view(k), view(v)
    device = q.device
    queue = queue_handle(device)
    if C.takes_decode_kernel(q_v, k_v, v_v, options, backward_follows, queue):
        batch, heads_q, len_q, head_dim = q.shape
        heads_kv, head_dim_v = k.shape[1], v.shape[3]
        keys = k.shape[2] if max_len_k is None else max_len_k
        splits = C.decode_num_splits(batch, heads_kv, len_q * (heads_q // heads_kv),
                                     max(head_dim, head_dim_v), keys, queue, num_splits)
        partial_out = torch.empty((batch, heads_q, len_q, splits, head_dim_v),
                                  dtype=torch.float32, device=device)
        partial_lse = torch.empty((batch, heads_q, len_q, splits), dtype=torch.float32,
                                  device=device)
        # A bool attn_mask's bits, where the kernel reads them (C.decode_scratch_bytes); calls
        # without one allocate nothing more.
        # (the tensor held here: a view does not keep its storage alive)
        mask, scratch = options.attn_mask, None
        if mask is not None and mask.dtype == "bool":
            bits = C.decode_scratch_bytes(q_v, k_v, v_v, options, queue)
            if bits:
                scratch = torch.empty(bits, dtype=torch.uint8, device=device)
        C.flash_decode(q_v, k_v, v_v, view(out), view(lse), view(partial_out),
                       view(partial_lse), options, queue,
                       *(() if scratch is None else (view(scratch),)))
    else:  # many rows, dropout, or a 16-bit cache with rows not word-aligned
        _kept = None if keys_used is None else pack_keys_used(options, *keys_used)
        flash_fwd(q_v, k_v, v_v, view(out), view(lse), options, q.device)
