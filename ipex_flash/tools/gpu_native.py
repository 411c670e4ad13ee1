"""Intel's offline compiler (ocloc, with IGC) on our SPIR-V, and what its output says.

`ocloc compile -spirv_input` builds a module's native code for one GPU; `ocloc disasm` writes
its .ze_info (per kernel: SIMD width, GRF count, SLM, spill and private memory sizes) and one
.asm file per kernel, where DPAS (XMX) instructions and the instruction count are read.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# Where scripts/setup/install_ocloc.sh puts it, relative to the environment's prefix.
_INSTALLED = Path("ocloc") / "bin" / "ocloc"


def find_ocloc() -> str | None:
    """$IPEX_FLASH_OCLOC, the environment's own ocloc (scripts/setup/install_ocloc.sh), or PATH."""
    import sys
    if os.environ.get("IPEX_FLASH_OCLOC"):
        return os.environ["IPEX_FLASH_OCLOC"]
    local = Path(sys.prefix) / _INSTALLED
    if local.exists():
        return str(local)
    return shutil.which("ocloc")


def ocloc_version(ocloc: str) -> str:
    result = subprocess.run([ocloc, "--version"], capture_output=True, text=True)
    return (result.stdout + result.stderr).strip().splitlines()[0] if result.returncode == 0 else ""


def parse_ze_info(text: str) -> dict:
    """{kernel name: execution_env fields} from the first `kernels:` section of a .ze_info."""
    kernels, current, in_kernels = {}, None, False
    for line in text.splitlines():
        if not line.startswith(" "):
            if in_kernels and line.strip():
                break  # the next top-level section (kernels_misc_info, ...)
            in_kernels = line.startswith("kernels:")
            continue
        if not in_kernels:
            continue
        match = re.match(r"  - name:\s+(\S+)", line)
        if match:
            current = kernels.setdefault(match.group(1), {})
            continue
        match = re.match(r"\s{6}(\w+):\s+(\S+)", line)
        if current is not None and match:
            current[match.group(1)] = match.group(2)
    return kernels


_LABEL = re.compile(r"L(\d+):$")
_BRANCH = re.compile(r"(\(\S+\)\s+)?(jmpi|goto|while|brc|brd)\b.*?\bL(\d+)\b")
_DPAS = re.compile(r"(\(\S+\)\s+)?dpasw?\b")
_PREDICATE = re.compile(r"^\(\S+\)\s+")


def _asm_counts(asm: Path) -> dict:
    """DPAS and all instructions of a disassembled kernel, and of its main loop: the longest
    loop (a branch back to an earlier label) holding DPAS, e.g. the matrix kernels' loop over
    K/V or Q blocks. Its DPAS share says how much of the loop's issue the matrix engine gets;
    the rest is softmax, loads, stores and barriers. loop_issued leaves out sync.* (scoreboard
    waits, which take no issue slot); loop_nested counts the loops inside the main loop, whose
    bodies run more than once per block (the static count then under-states the cost);
    loop_block_loads and loop_prefetches count its 2-D block loads and prefetches (a block
    load that writes no register)."""
    labels, ops, block2d, loops = {}, [], [], []
    for line in asm.read_text(errors="replace").splitlines():
        stripped = line.strip()
        label = _LABEL.match(stripped)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        if not stripped or stripped.startswith("//"):
            continue
        branch = _BRANCH.match(stripped)
        if branch and branch.group(3) in labels:  # a label already seen: a backward branch
            loops.append((labels[branch.group(3)], len(ops) + 1))
        opcode = _PREDICATE.sub("", stripped).split(" ", 1)[0]
        ops.append("dpas" if _DPAS.match(stripped) else opcode)
        block2d.append("" if "load_block2d" not in stripped else
                       "prefetch" if "rd:0;" in stripped else "load")
    main = max((loop for loop in loops if "dpas" in ops[loop[0]:loop[1]]),
               key=lambda loop: loop[1] - loop[0], default=(0, 0))
    body = ops[main[0]:main[1]]
    return {"dpas": ops.count("dpas"), "instructions": len(ops), "loop_dpas": body.count("dpas"),
            "loop_instructions": len(body),
            "loop_issued": sum(1 for op in body if not op.startswith("sync.")),
            "loop_nested": sum(1 for loop in loops
                               if loop != main and main[0] <= loop[0] and loop[1] <= main[1]),
            "loop_block_loads": block2d[main[0]:main[1]].count("load"),
            "loop_prefetches": block2d[main[0]:main[1]].count("prefetch")}


def _compile_image(ocloc: str, spirv: Path, device: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [ocloc, "compile", "-q", "-spirv_input", "-file", str(spirv), "-device", device,
         "-output_no_suffix", "-output", "native", "-out_dir", str(out)],
        capture_output=True, text=True)
    built = out / "native.bin"
    if result.returncode != 0 or not built.exists():
        message = (result.stdout + result.stderr).strip().splitlines()
        return {"error": f"ocloc exit {result.returncode}: " +
                         (" ".join(message[-3:]) if message else "no output")}
    dump = out / "disasm"
    subprocess.run([ocloc, "disasm", "-file", str(built), "-device", device, "-dump", str(dump)],
                   capture_output=True, text=True)
    kernels = {}
    for name, env in parse_ze_info((dump / ".ze_info").read_text()).items():
        if name.startswith("Intel_Symbol_Table"):
            continue
        asm = dump / f".text.{name}.asm"
        counts = _asm_counts(asm) if asm.exists() else {
            "dpas": 0, "instructions": 0, "loop_dpas": 0, "loop_instructions": 0,
            "loop_issued": 0, "loop_nested": 0, "loop_block_loads": 0, "loop_prefetches": 0}
        kernels[name] = {
            "simd": int(env.get("simd_size", 0)), "grf": int(env.get("grf_count", 0)),
            "slm": int(env.get("slm_size", 0)), "spill": int(env.get("spill_size", 0)),
            "private": int(env.get("private_size", 0)), **counts}
    return {"kernels": kernels}


def compile_module(ocloc: str, work: Path, module_id: str, device: str, out: Path) -> dict:
    """Native code of a module's SPIR-V images (work/<module_id>.part*.spv) for `device`:
    {"kernels": {mangled name: figures}}, with "error" when the kernel compiler or ocloc
    failed on (part of) it."""
    error_file = work / f"{module_id}.error"
    if error_file.exists():
        return {"error": "kernel compiler: " + error_file.read_text().splitlines()[0]}
    images = sorted(work.glob(f"{module_id}.part*.spv"))
    if not images:
        return {"error": "no SPIR-V was written"}
    merged = {"kernels": {}}
    for i, image in enumerate(images):
        result = _compile_image(ocloc, image, device, out / f"part{i}")
        merged["kernels"].update(result.get("kernels", {}))
        if "error" in result:
            merged["error"] = result["error"]
    return merged


def _short_kernel(name: str) -> str:
    base, _, args = name.partition("<")
    base = base.split("::")[-1].replace("_kernel", "").replace("flash_", "")
    args = re.sub(r"\bfloat\b", "fp32", args.removesuffix(">"))
    for long, short in (("ipex_flash::bfloat16_bits", "bf16"), ("sycl::half", "fp16"),
                        ("ipex_flash::float8_", "fp8_"), ("_bits", ""), ("ipex_flash::", ""),
                        (" ", "")):
        args = args.replace(long, short)
    return f"{base}<{args}>" if args else base


def print_table(reports: list) -> None:
    """One line per kernel and target; figures per work-item lane where IGC gives them per
    thread (spill and private sizes are per hardware thread of `simd` lanes)."""
    header = (f"{'target':6} {'kernel':44} {'mode':4} {'simd':>4} {'grf':>4} {'slm':>7} "
              f"{'limit':>7} {'spill':>6} {'priv':>5} {'dpas':>5} {'insts':>6} {'loop%':>5} "
              f"{'/dpas':>6}  result")
    print(header)
    print("-" * len(header))
    for r in sorted(reports, key=lambda r: (r.target, r.family, r.dtype, r.head_dim, r.kernel)):
        status = "ok" if not r.violations else "FAIL: " + "; ".join(r.violations)
        if not r.violations and r.spill > 0:
            status = "ok (spill reported, not enforced: gpu_rules.py)"
        # DPAS share of the main loop's instructions (gpu-check's "loop%"), for XMX kernels.
        loop_share = f"{100 * r.loop_dpas_share:5.1f}" if r.loop_dpas else f"{'-':>5}"
        # Issued instructions per DPAS in a fully visible block's main loop; "+": loops
        # nested in it were counted once, so the figure is a lower bound.
        per_dpas = (f"{r.loop_per_dpas:5.1f}{'+' if r.loop_nested else ' '}" if r.loop_per_dpas
                    else f"{'-':>5} ")
        if not r.built:
            print(f"{r.target:6} {_short_kernel(r.kernel):44} {r.mode:4} not built: {r.error}")
            continue
        print(f"{r.target:6} {_short_kernel(r.kernel):44} {r.mode:4} {r.simd:4d} {r.grf:4d} "
              f"{r.slm:7d} {r.slm_limit:7d} {r.spill:6d} {r.private:5d} {r.dpas:5d} "
              f"{r.instructions:6d} {loop_share} {per_dpas}  {status}")
