"""python -m ipex_flash selftest [--device cpu|xpu|xpu:N] [--quick] [--json FILE]

Checks every kernel family on one device against ipex_flash.reference's float64 reference,
computed on the CPU: forward (causal, GQA, odd head dims and lengths), flash_attn_func's
softcap, ALiBi and window, varlen, backward (dq, dk, dv), dropout (with the kernels' own
keep-mask) and KV-cache decoding (contiguous and paged, with the append), in float32, float16
and bfloat16. Each check draws fresh inputs on the device, seeded with
crc32("<SEED>/<family>/<dtype>/<case>"), and reports its error:

- outputs: max |x - ref| / (1 + |ref|), which passes exactly when
  torch.testing.assert_close(rtol=atol=tolerance) does; tolerances as the tests': float32 1e-5,
  float16 2e-3, bfloat16 1e-2. The append into a KV cache must be exact.
- gradients: max |x - ref| / max(1, max |ref|), at most twice torch SDPA's own at the same
  precision plus 1e-5 (as tests/backward/test_backward.py), or the dtype's tolerance where SDPA cannot
  compute the same thing (dropout, flash-attn features).

A check that raises fails with the exception's first line and the run goes on. Exit code 0
when every check passes, 1 otherwise, 2 when the device is not available.
"""
from __future__ import annotations

import collections
import functools
import importlib.metadata
import itertools
import json
import math
import os
import time
import zlib
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash._runtime import C
from ipex_flash.reference import attention_reference, flash_attn_reference

SEED = 0
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
GRAD_FLOOR = 1e-5
PACKAGES = ("intel-sycl-rt", "intel-cmplr-lib-ur", "intel-opencl-rt", "torch", "ipex_flash")
# fn(dev=, dtype=) returns rows [(label, error, tolerance)]; quick: part of --quick.
Check = collections.namedtuple("Check", "family case fn quick", defaults=(True,))
ROW = "{:<9} {:<8} {:<42} {:>9} {:>9} {:>7}  {}"  # the table's columns


def cpu64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to("cpu", torch.float64) for t in tensors]


def output_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = cpu64(got, ref)
    return ((got - ref).abs() / (1 + ref.abs())).max().item()


def grad_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = cpu64(got, ref)
    return (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def gradients(fn: Callable, inputs, grad_out: torch.Tensor) -> tuple:
    """fn(*inputs), and the gradients of <fn(*inputs), grad_out> with respect to the inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out, [t.grad for t in leaves]


def randn(dev, dtype, *shape) -> torch.Tensor:
    return torch.randn(*shape, device=dev, dtype=dtype)


def qkv(dev, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, bnhd=False) -> list:
    """q, k, v in SDPA's (B, H, N, D) layout, or with bnhd in flash-attn's (B, N, H, D)."""
    shapes = [(heads_q, len_q), (heads_kv, len_k), (heads_kv, len_k)]
    return [randn(dev, dtype, batch, *(s[::-1] if bnhd else s), dim) for s in shapes]


def forward(shape, causal, *, dev, dtype) -> list:
    q, k, v = qkv(dev, dtype, *shape)
    out = ipex_flash.attention(q, k, v, causal=causal)
    return [("", output_error(out, attention_reference(q, k, v, causal)[0]), TOLERANCE[dtype])]


def features(len_q, len_k, alibi=False, *, dev, dtype, **options) -> list:
    q, k, v = qkv(dev, dtype, 2, 4, 2, len_q, len_k, 64, bnhd=True)
    if alibi:
        options["alibi_slopes"] = torch.rand(2, 4, device=dev) * 0.3
    out = ipex_flash.flash_attn_func(q, k, v, **options)
    return [("", output_error(out, flash_attn_reference(q, k, v, **options)[0]), TOLERANCE[dtype])]


def varlen(lengths, alibi=False, *, dev, dtype, **options) -> list:
    seqs = [qkv(dev, dtype, 1, 4, 2, n_q, n_k, 64, bnhd=True) for n_q, n_k in lengths]
    q, k, v = (torch.cat([s[i][0] for s in seqs]) for i in range(3))
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=dev)
                  for n in zip(*lengths))
    slopes = torch.rand(len(lengths), 4, device=dev) * 0.3 if alibi else None
    max_q, max_k = map(max, zip(*lengths))
    out = ipex_flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                            alibi_slopes=slopes, **options)
    ref = torch.cat([flash_attn_reference(*s, alibi_slopes=None if slopes is None else slopes[b],
                                          **options)[0][0] for b, s in enumerate(seqs)])
    return [("", output_error(out, ref), TOLERANCE[dtype])]


def backward(shape, causal, *, dev, dtype) -> list:
    """Gradients of ipex_flash.attention; tolerance from torch SDPA's own error."""
    q, k, v = qkv(dev, dtype, *shape)
    grad_out = torch.randn_like(q)
    _, got = gradients(lambda a, b, c: ipex_flash.attention(a, b, c, causal=causal), (q, k, v),
                       grad_out)
    _, want = gradients(lambda a, b, c: attention_reference(a, b, c, causal)[0], cpu64(q, k, v),
                        cpu64(grad_out)[0])
    _, sdpa = gradients(lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, is_causal=causal, enable_gqa=True), (q, k, v), grad_out)
    return [(name, grad_error(g, w), 2 * grad_error(s, w) + GRAD_FLOOR)
            for name, g, w, s in zip(("dq", "dk", "dv"), got, want, sdpa)]


def flash_with_grads(dropout_p=0.0, alibi=False, *, dev, dtype, **options) -> list:
    """flash_attn_func's output and gradients against the reference given the keep-mask it
    reports (the sign of S_dmask), at the dtype's tolerance."""
    q, k, v = qkv(dev, dtype, 2, 4, 2, 45, 70, 64, bnhd=True)
    if alibi:
        options["alibi_slopes"] = torch.rand(4, device=dev) * 0.3
    grad_out = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _, probs = ipex_flash.flash_attn_func(*leaves, dropout_p=dropout_p,
                                               return_attn_probs=True, **options)
    keep = None if probs is None else probs >= 0  # S_dmask: dropped entries negative
    out.backward(grad_out)
    ref, want = gradients(lambda a, b, c: flash_attn_reference(
        a, b, c, keep=keep, dropout_p=dropout_p, **options)[0], cpu64(q, k, v), cpu64(grad_out)[0])
    tol = TOLERANCE[dtype]
    return [("out", output_error(out, ref), tol)] + [
        (name, grad_error(t.grad, w), tol) for name, t, w in zip(("dq", "dk", "dv"), leaves, want)]


def kvcache(lengths, heads_q, heads_kv, dim, page_size=None, *, dev, dtype) -> list:
    """Decodes one new token per sequence, appending its key and value to the cache first. The
    cache is (B, capacity, Hkv, D), or with page_size pages of a shuffled pool with spares."""
    batch, longest = len(lengths), max(lengths) + 1
    if page_size is None:  # seen as one page per sequence
        pool, size, table = batch, longest + 3, torch.arange(batch, dtype=torch.int32)[:, None]
    else:
        per_seq, size = -(-longest // page_size), page_size
        pool = batch * per_seq + 2
        table = torch.randperm(pool)[:batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    q = randn(dev, dtype, batch, 1, heads_q, dim)
    k_cache, v_cache = (randn(dev, dtype, pool, size, heads_kv, dim) for _ in range(2))
    k_new, v_new = (randn(dev, dtype, batch, 1, heads_kv, dim) for _ in range(2))
    want_k, want_v = (t.cpu().clone() for t in (k_cache, v_cache))  # the caches after the append
    for (b, n), (want, new) in itertools.product(enumerate(lengths),
                                                 ((want_k, k_new), (want_v, v_new))):
        want[int(table[b, n // size]), n % size] = new[b, 0].cpu()
    out = ipex_flash.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new,
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=dev),
        block_table=None if page_size is None else table.to(dev), causal=True)
    ref = torch.cat([flash_attn_reference(  # against keys and values 0..n of sequence b
        q[b:b + 1], *(t[table[b].long()].flatten(0, 1)[None, :n + 1] for t in (want_k, want_v)),
        causal=True)[0] for b, n in enumerate(lengths)])
    append = max(output_error(k_cache, want_k), output_error(v_cache, want_v))
    return [("out", output_error(out, ref), TOLERANCE[dtype]), ("append", append, 0.0)]


P = functools.partial
CHECKS = [  # forward and backward shapes: (batch, heads_q, heads_kv, len_q, len_k, head_dim)
    Check("forward", "B2 H4 N128 D64", P(forward, (2, 4, 4, 128, 128, 64), False)),
    Check("forward", "causal N100x150 D64", P(forward, (2, 4, 4, 100, 150, 64), True)),
    Check("forward", "causal GQA 8/2 N90x70", P(forward, (1, 8, 2, 90, 70, 64), True)),
    Check("forward", "GQA 4/1 N77x100 D59", P(forward, (2, 4, 1, 77, 100, 59), False)),
    Check("forward", "causal N200x300 D80", P(forward, (1, 4, 2, 200, 300, 80), True), False),
    Check("forward", "N129 D128", P(forward, (1, 4, 4, 129, 129, 128), False), False),
    Check("forward", "N1x300 D256", P(forward, (2, 4, 4, 1, 300, 256), False), False),
    Check("features", "softcap 4", P(features, 77, 200, softcap=4.0)),
    Check("features", "ALiBi causal", P(features, 77, 200, alibi=True, causal=True)),
    Check("features", "window (16, 5)", P(features, 200, 77, window_size=(16, 5))),
    Check("features", "causal Nq>Nk (empty rows)", P(features, 120, 50, causal=True), False),
    Check("features", "window (30, 7) softcap ALiBi",
          P(features, 100, 130, alibi=True, softcap=2.5, window_size=(30, 7)), False),
    Check("varlen", "causal, lengths 0-200",
          P(varlen, [(5, 9), (1, 1), (0, 4), (130, 70), (17, 200)], causal=True)),
    Check("varlen", "window softcap ALiBi", P(varlen, [(3, 0), (64, 64), (70, 33)], alibi=True,
                                              softcap=3.0, window_size=(20, 4)), False),
    Check("backward", "causal GQA 4/2 N70x90", P(backward, (2, 4, 2, 70, 90, 64), True)),
    Check("backward", "N113x203 D59", P(backward, (1, 2, 2, 113, 203, 59), False), False),
    Check("backward", "causal GQA 8/2 N160 D128", P(backward, (1, 8, 2, 160, 160, 128), True),
          False),
    Check("backward", "flash_attn_func window softcap ALiBi", P(
        flash_with_grads, causal=True, window_size=(30, -1), softcap=2.5, alibi=True), False),
    Check("dropout", "p=0.3 causal GQA 4/2", P(flash_with_grads, dropout_p=0.3, causal=True)),
    Check("kvcache", "contiguous GQA 8/2 lens 37,300", P(kvcache, [37, 300], 8, 2, 64)),
    Check("kvcache", "paged 16 GQA 8/2 lens 5,100", P(kvcache, [5, 100], 8, 2, 64, 16)),
    Check("kvcache", "paged 64 MQA 16/1 lens 1,2000", P(kvcache, [1, 2000], 16, 1, 64, 64), False),
    Check("kvcache", "contiguous GQA 4/2 D80 lens 65", P(kvcache, [65], 4, 2, 80), False),
]


def run_check(check: Check, dev: torch.device, dtype: torch.dtype) -> list[dict]:
    """The check's rows; one failed row with the exception's first line if it raises."""
    name = str(dtype).removeprefix("torch.")
    seed = zlib.crc32(f"{SEED}/{check.family}/{name}/{check.case}".encode())
    torch.manual_seed(seed)
    start, message = time.perf_counter(), ""
    try:
        rows = check.fn(dev=dev, dtype=dtype)
    except Exception as exc:  # noqa: BLE001  (any failure is a result)
        first_line = (str(exc).strip() or "-").splitlines()[0]
        rows, message = [("", math.nan, TOLERANCE[dtype])], f"{type(exc).__name__}: {first_line}"
    seconds = time.perf_counter() - start
    return [dict(family=check.family, dtype=name, case=f"{check.case}: {label}" if label else
                 check.case, error=error, tolerance=tol, seconds=seconds, seed=seed,
                 message=message, passed=not message and error <= tol)
            for label, error, tol in rows]


def version(package: str) -> Optional[str]:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(dev: torch.device) -> dict:
    info = C.device_info(launch.queue_handle(dev))
    matrix = dict(IPEX_FLASH_MATRIX=os.environ.get("IPEX_FLASH_MATRIX", "auto"),
                  device_reports_one=info["matrix_engine"])
    return dict(device=str(dev), device_info=info, versions={p: version(p) for p in PACKAGES},
                matrix_engine=matrix, seed=SEED)


def print_header(env: dict) -> None:
    info, matrix = env["device_info"], env["matrix_engine"]
    print(f"ipex_flash self-test on {env['device']}: {info['name']} ({info['platform']}, driver "
          f"{info['driver_version']}, {info['compute_units']} compute units)")
    print("versions: " + ", ".join(f"{p} {v}" for p, v in env["versions"].items() if v))
    print(f"matrix engine: IPEX_FLASH_MATRIX={matrix['IPEX_FLASH_MATRIX']}, the device reports "
          f"{'one' if matrix['device_reports_one'] else 'none'}")
    print(f"seed {SEED}: each check seeds torch with crc32('{SEED}/<family>/<dtype>/<case>')\n")
    print(ROW.format("family", "dtype", "case", "max error", "tolerance", "time", "result"))


def print_row(r: dict, show_time: bool) -> None:
    result = f"{'PASS' if r['passed'] else 'FAIL'} {r['message']}".rstrip()
    print(ROW.format(r["family"], r["dtype"], r["case"],
                     "raised" if r["message"] else f"{r['error']:.2e}", f"{r['tolerance']:.2e}",
                     f"{r['seconds']:.2f}s" if show_time else "", result), flush=True)


def available(device: str) -> bool:
    try:
        dev = torch.device(device)
    except RuntimeError:  # not a device name
        return False
    xpus = torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    return dev.type == "cpu" or (dev.type == "xpu" and (dev.index or 0) < xpus)


def run(device: str | None = None, quick: bool = False, json_path: str | None = None) -> int:
    """Runs the checks on device (None: launch.default_device()) and prints the table, the
    device first. Returns 0 when all pass, 1 when one fails, 2 when the device is not available."""
    if device is None:
        device = str(launch.default_device())
    if not available(device):
        print(f"ipex_flash selftest: device {device!r} is not available: use cpu, or xpu[:N] "
              f"with an Intel GPU and an XPU build of torch (this is {torch.__version__})")
        return 2
    dev = torch.device(device)
    env = environment(dev)
    print_header(env)
    results = []
    for check in (c for c in CHECKS if c.quick or not quick):
        for dtype in DTYPES:
            rows = run_check(check, dev, dtype)
            for i, row in enumerate(rows):
                print_row(row, show_time=i == 0)
            results += rows
    failed = sum(not r["passed"] for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    if json_path:
        for r in results:  # JSON has no NaN
            r["error"] = r["error"] if math.isfinite(r["error"]) else None
        with open(json_path, "w") as f:
            json.dump(dict(env, quick=quick, checks=results, passed=len(results) - failed,
                           failed=failed), f, indent=1)
    return 1 if failed else 0


def add_arguments(parser) -> None:
    parser.add_argument("--device", default=None,
                        help="cpu (the SYCL CPU device), xpu or xpu:N (default: xpu where "
                             "torch has one, else cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer cases per kernel family")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
