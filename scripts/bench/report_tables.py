"""The pieces benchmark_report.py's sections are made of: the benchmark runs (the file each
benchmark writes and its command), Markdown tables, spans of ratios, and a section's head,
which names the command and the machine its figures were measured on."""
from __future__ import annotations

# The file each benchmark writes, and the command that writes it.
RUNS = {
    "forward_4096.json": "benchmark.py --seq-lens 4096 --head-dims 64 128 --dtypes float32 "
                         "bfloat16 --naive-max-len 2048",
    "forward.json": "benchmark.py --dtypes float32 bfloat16 --head-dims 64 128",
    "backward.json": "benchmark.py --passes backward fwd+bwd --seq-lens 1024 2048 4096 "
                     "--head-dims 64 --dtypes float32 bfloat16 --naive-max-len 4096 --budget 5",
    "decode.json": "benchmark.py --decode --repeats 7",
    "serving.json": "benchmark_serving.py",
    "sdpa.json": "benchmark_sdpa.py",
    "runtime.json": "runtime_costs.py",
    "host_cost.json": "benchmark_host_cost.py",
    "generate_batch.json": "benchmark_generate_batch.py",
    "distributed.json": "benchmark_distributed.py",
    "distributed_ring.json": "benchmark_ring_probes.py",
    "vllm_generate.json": "benchmark_vllm_generate.py",
}


def ratio(rows, **match) -> list[float]:
    """ipex_flash / SDPA of the rows whose fields have the given values."""
    return [r["ratio_to_sdpa"] for r in rows if all(r[f] == v for f, v in match.items())]


def span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def machine(data: dict) -> str:
    m = data.get("machine") or {}
    if isinstance(m, str):
        return m
    cpu = m.get("device") or m.get("cpu", "?")
    cores = m.get("compute_units") or m.get("cores")
    parts = [cpu + (f", {cores} cores" if cores else "")]
    if "amx" in m:
        parts.append("AMX" if m["amx"] else "no AMX")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}" + (f" with {m['torch_threads']} threads"
                                              if m.get("torch_threads") else ""))
    return ", ".join(parts)


def table(header, rows) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def section(title: str, name: str, data: dict) -> list[str]:
    return ["", f"## {title}", "",
            f"`python scripts/bench/{RUNS[name]}` (`{name}`), on {machine(data)}.", ""]
