"""python -m ipex_flash [demo|warmup|info|plan|gpu-check|selftest]

demo       attention on the default device: error against torch SDPA, time next to SDPA's
warmup     build the common kernel variants into the persistent cache ahead of time
info       the SYCL device, its limits and the kernel cache location
plan       which kernel a call gets on a device or GPU profile, and why not a faster one
gpu-check  compile every kernel an Intel GPU would run to its native code (needs ocloc:
           scripts/setup/install_ocloc.sh) and check registers, spills, local memory and XMX use
selftest   about a minute of correctness checks of every kernel family on a device
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

import ipex_flash
from ipex_flash.ops import launch
from ipex_flash.tools import gpu_check, plan, selftest
from ipex_flash._runtime import C, default_cache_dir

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _best_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up (and, for ipex_flash, the first-use kernel build)
    launch.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        launch.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def demo(args) -> None:
    dtype = _DTYPES[args.dtype]
    device = torch.device(args.device) if args.device else launch.default_device()
    info = C.device_info(launch.queue_handle(device))
    print(f"device: torch {device} -> {info['name']} ({info['platform']}), "
          f"{info['compute_units']} compute units")
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device) for _ in range(3))
    out = ipex_flash.attention(q, k, v, causal=args.causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
    error = (out.float() - sdpa.float()).abs().max().item()
    print(f"attention(q, k, v, causal={args.causal}) with q, k, v {tuple(shape)} {args.dtype}")
    print(f"output {tuple(out.shape)} {out.dtype}; max |ipex_flash - SDPA| = {error:.2e}")
    ours = _best_seconds(lambda: ipex_flash.attention(q, k, v, causal=args.causal), args.repeats,
                         device)
    theirs = _best_seconds(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal), args.repeats,
        device)
    flops = 4 * args.batch * args.heads * args.seq_len**2 * args.head_dim
    flops *= 0.5 if args.causal else 1.0
    print(f"ipex_flash: {ours * 1e3:8.1f} ms  {flops / ours / 1e9:7.1f} GFLOP/s")
    print(f"torch SDPA: {theirs * 1e3:8.1f} ms  {flops / theirs / 1e9:7.1f} GFLOP/s "
          + (f"({torch.get_num_threads()} threads)" if device.type == "cpu" else ""))
    print(f"ipex_flash / SDPA throughput: {theirs / ours:.2f}x")


def warmup(args) -> None:
    # Decode kernels are specialised on the query rows per K/V head (GQA group size x new
    # tokens), so each --decode-rows value is a variant of its own.
    builds = {"forward": lambda dtype, d: [C.warmup_fwd(dtype, d, 0)],
              "backward": lambda dtype, d: [C.warmup_bwd(dtype, d, 0)],
              "decode": lambda dtype, d: [C.warmup_decode(dtype, d, rows, 0,
                                                          head_dim_v=args.decode_head_dim_v)
                                          for rows in args.decode_rows]}
    C.set_warmup_mode(True)  # leave the cache in the state later processes load fastest from
    for dtype in args.dtypes:
        for head_dim in args.head_dims:
            for direction in args.directions:
                start = time.perf_counter()
                variants = builds[direction](dtype, head_dim)
                names = ", ".join(str(variant) for variant in variants)
                print(f"{direction} {names}: ready in {time.perf_counter() - start:.2f} s")


def info(_args) -> None:
    for key, value in C.device_info().items():
        print(f"{key}: {value}")
    print(f"limits: {C.device_limits()}")
    print(f"cpu target: {os.environ.get('CL_CONFIG_CPU_TARGET_ARCH', 'detected by the runtime')}")
    print(f"matrix path (IPEX_FLASH_MATRIX): {os.environ.get('IPEX_FLASH_MATRIX', 'auto')}")
    print(f"kernel cache: {os.environ.get('SYCL_CACHE_DIR', default_cache_dir())}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ipex_flash", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    p = commands.add_parser("demo", help="run attention and compare it with torch SDPA")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None,
                   help="cpu, xpu or xpu:N (default: xpu where torch has one, else cpu)")
    p.set_defaults(func=demo)
    p = commands.add_parser("warmup", help="build kernel variants into the persistent cache")
    p.add_argument("--dtypes", nargs="+", choices=sorted(_DTYPES), default=sorted(_DTYPES))
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--directions", nargs="+", choices=["forward", "backward", "decode"],
                   default=["forward", "backward", "decode"])
    p.add_argument("--decode-rows", nargs="+", type=int, default=[1, 4, 8],
                   choices=range(1, C.MAX_DECODE_ROWS + 1), metavar="ROWS",
                   help="query rows per K/V head to build decode kernels for (GQA group "
                        "size x new tokens, 16 for more: those run in slices of 16; default "
                        "1 4 8)")
    p.add_argument("--decode-head-dim-v", type=int, default=0, metavar="DV",
                   help="v's head dim for the decode kernels where it differs from the head "
                        "dim (MLA: --head-dims 576 --decode-head-dim-v 512 --directions decode "
                        "--decode-rows 16); default: the head dim")
    p.set_defaults(func=warmup)
    p = commands.add_parser("info", help="show the SYCL device and cache location")
    p.set_defaults(func=info)
    p = commands.add_parser("plan", help="the kernel a call gets, and why not a faster one")
    plan.add_arguments(p)
    p.set_defaults(func=plan.main)
    p = commands.add_parser("gpu-check", help="native-code checks for Intel GPUs (ocloc)")
    gpu_check.add_arguments(p)
    p.set_defaults(func=gpu_check.main)
    p = commands.add_parser("selftest", help="correctness checks of every kernel family")
    selftest.add_arguments(p)
    p.set_defaults(func=lambda a: selftest.run(a.device, a.quick, a.json))
    args = parser.parse_args()
    if args.command is None:
        args = parser.parse_args(["demo"])
    raise SystemExit(args.func(args) or 0)


if __name__ == "__main__":
    main()
