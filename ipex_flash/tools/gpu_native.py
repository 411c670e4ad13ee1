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
_SOURCE = re.compile(r"\b(r\d+)\.\d+<")  # a source operand's register (regioned: <...>)


def _rescale_branches(ops: list, factors: list, forward: list, labels: dict, loop) -> list:
    """The spans of `loop` that only a block whose max rose runs: O's rescale, a forward branch
    over multiplies that share one source register (the rows' factor; IGC moves some products
    through the accumulator registers, so moves may come between them) and nothing else. The
    register forward keeps its rescale so (forward/registers_kernel.hpp): a block that does not
    raise a row's max past its threshold skips it, and past a row's first blocks few do."""
    found = []
    for at, label in forward:
        end = labels.get(label, -1)
        if not loop[0] <= at < end <= loop[1]:
            continue
        skipped = [i for i in range(at + 1, end) if not ops[i].startswith("sync.")]
        muls = [i for i in skipped if ops[i] == "mul"]
        if (len(muls) >= 8 and 4 * len(muls) >= 3 * len(skipped)
                and all(ops[i] in ("mul", "mov") for i in skipped)
                and set.intersection(*(factors[i] for i in muls))):
            found.append((at + 1, end))
    return found


def _asm_counts(asm: Path) -> dict:
    """DPAS and all instructions of a disassembled kernel, and of its main loop.

    Loops are the spans from a label to a branch back to it; those holding DPAS are read, a
    loop inside another counted once per turn of the outer one. The loops over blocks (a K/V
    block of the forward and dQ a turn, a query block of dK/dV) are the outermost loops holding
    DPAS, looking through a loop when two or more such loops inside it take up most of its
    instructions (dK/dV's loop over the query heads around its loops over query blocks). Three
    in a row are the split of run_blocks (score/block_mask.hpp): a general loop, the lean loop
    of the fully visible blocks, which holds neither the mask's nor dropout's code, and a second
    general loop; the lean loop issues the fewest instructions per DPAS of the three. The main
    loop is the lean loop holding the most DPAS (dK/dV past d = 64 has one per pass over the
    rows), the fewest instructions per DPAS among equals; in a kernel without the split, its
    loop over blocks holding the most DPAS so. The edge loop is the costliest general loop
    (none without the split). loop_issued leaves out sync.* (scoreboard waits,
    which take no issue slot) and O's rescale where a branch skips it (_rescale_branches: what
    a block issues whose max does not rise), loop_rescale counts that branch; loop_nested
    counts the loops inside the main loop, whose bodies run more than once per block (the
    static count then under-states the cost);
    loop_block_loads and loop_prefetches count its 2-D block loads and prefetches (a block
    load that writes no register); loop_spills its spill and fill accesses (scratch space
    sends, `.ss[`, or PVC's scratch block reads and writes), edge_spills the same of the edge
    loop. block_issued and block_nested: the same of the decode
    kernel's loop over key blocks (below; in its register form, which splits its blocks as the
    forward does, the lean loop)."""
    labels, ops, block2d, scratch, spans = {}, [], [], [], set()
    factors, forward = [], []  # a mul's source registers; (branch, label) of forward branches
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
            spans.add((labels[branch.group(3)], len(ops) + 1))
        elif branch:
            forward.append((len(ops), branch.group(3)))
        fields = _PREDICATE.sub("", stripped).split()
        opcode = fields[0]
        sources = " ".join(fields[3:5])  # past opcode, size, destination
        factors.append(set(_SOURCE.findall(sources)) if opcode == "mul" else set())
        ops.append("dpas" if _DPAS.match(stripped) else opcode)
        block2d.append("" if "load_block2d" not in stripped else
                       "prefetch" if "rd:0;" in stripped else "load")
        # Spill and fill: an LSC message to scratch space (Xe2: `.ss[`), or the data port's
        # scratch block read or write (PVC, named so in the disassembly's comment).
        scratch.append(".ss[" in stripped or "scratch block" in stripped)
    dpas_before = [0]
    for op in ops:
        dpas_before.append(dpas_before[-1] + (op == "dpas"))

    def dpas_in(loop):
        return dpas_before[loop[1]] - dpas_before[loop[0]]

    def issued(loop):
        return sum(1 for op in ops[loop[0]:loop[1]] if not op.startswith("sync."))

    def per_dpas(loop):
        return issued(loop) / dpas_in(loop)

    def inside(inner, outer):
        return inner != outer and outer[0] <= inner[0] and inner[1] <= outer[1]

    holding = [loop for loop in spans if dpas_in(loop)]

    def outermost(within):  # the loops holding DPAS inside `within` (None: the kernel)
        found = [loop for loop in holding if within is None or inside(loop, within)]
        return sorted(loop for loop in found if not any(inside(loop, o) for o in found))

    leans, generals = [], []

    def read(within):  # the loops over blocks inside `within`, into leans and generals
        blocks = []
        for loop in outermost(within):
            inner = outermost(loop)
            if len(inner) >= 2 and 2 * sum(e - s for s, e in inner) > loop[1] - loop[0]:
                read(loop)
            else:
                blocks.append(loop)
        if len(blocks) == 3 and per_dpas(blocks[1]) == min(map(per_dpas, blocks)):
            leans.append(blocks[1])
            generals.extend((blocks[0], blocks[2]))
        else:
            leans.extend(blocks)

    read(None)
    main = max(leans, key=lambda loop: (dpas_in(loop), -per_dpas(loop)), default=(0, 0))
    edge = max(generals, key=per_dpas, default=(0, 0))
    body = ops[main[0]:main[1]]
    rescale = sum(issued(skipped) for skipped in
                  _rescale_branches(ops, factors, forward, labels, main))
    # The decode kernel's loop over key blocks (gpu_bandwidth.py): of the outermost loops, the
    # one with the most DPAS, then one with loops inside it (it always holds the loop over the
    # work-group's K/V heads, whose count is known at run time only; the new tokens' append
    # before it has none), then the most instructions.
    def nested(loop):
        return sum(1 for other in spans if inside(other, loop))

    heaviest = max((loop for loop in spans if not any(inside(loop, o) for o in spans)),
                   key=lambda loop: (dpas_in(loop), nested(loop) > 0, issued(loop)),
                   default=(0, 0))
    if generals:  # the register form splits its blocks (run_blocks): all but a split's edge
        heaviest = main  # blocks (a window's, the partial last) run its lean loop
    return {"dpas": ops.count("dpas"), "instructions": len(ops), "loop_dpas": body.count("dpas"),
            "loop_instructions": len(body),
            "loop_issued": issued(main) - rescale,
            "loop_rescale": rescale,
            "loop_nested": nested(main),
            "loop_block_loads": block2d[main[0]:main[1]].count("load"),
            "loop_prefetches": block2d[main[0]:main[1]].count("prefetch"),
            "loop_spills": sum(scratch[main[0]:main[1]]),
            "edge_dpas": dpas_in(edge), "edge_issued": issued(edge),
            "edge_spills": sum(scratch[edge[0]:edge[1]]),
            "block_issued": issued(heaviest),
            "block_nested": nested(heaviest)}


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
            "loop_issued": 0, "loop_rescale": 0, "loop_nested": 0, "loop_block_loads": 0,
            "loop_prefetches": 0,
            "edge_dpas": 0, "edge_issued": 0, "block_issued": 0, "block_nested": 0}
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


def short_kernel(name: str) -> str:
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
              f"{'/dpas':>6} {'edge':>5}  result")
    print(header)
    print("-" * len(header))
    for r in sorted(reports, key=lambda r: (r.target, r.family, r.dtype, r.head_dim, r.kernel)):
        status = "ok" if not r.violations else "FAIL: " + "; ".join(r.violations)
        if not r.violations and r.spill > 0:
            status = "ok (spill reported, not enforced: gpu_rules.py)"
        # DPAS share of the main loop's instructions (gpu-check's "loop%"), for XMX kernels.
        loop_share = f"{100 * r.loop_dpas_share:5.1f}" if r.loop_dpas else f"{'-':>5}"
        # Issued instructions per DPAS in the main loop (the lean loop of the fully visible
        # blocks where the kernel has one); "+": loops nested in it were counted once, so the
        # figure is a lower bound. edge: the general loop's (the blocks the mask cuts through).
        per_dpas = (f"{r.loop_per_dpas:5.1f}{'+' if r.loop_nested else ' '}" if r.loop_per_dpas
                    else f"{'-':>5} ")
        edge = f"{r.loop_per_dpas_edge:5.1f}" if r.loop_per_dpas_edge else f"{'-':>5}"
        if not r.built:
            outcome = "not built" if r.violations else "refused"
            print(f"{r.target:6} {short_kernel(r.kernel):44} {r.mode:4} {outcome}: {r.error}")
            continue
        print(f"{r.target:6} {short_kernel(r.kernel):44} {r.mode:4} {r.simd:4d} {r.grf:4d} "
              f"{r.slm:7d} {r.slm_limit:7d} {r.spill:6d} {r.private:5d} {r.dpas:5d} "
              f"{r.instructions:6d} {loop_share} {per_dpas} {edge}  {status}")
