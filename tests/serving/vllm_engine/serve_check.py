"""vLLM's OpenAI-compatible server with ipex_flash's backend in place of CPU_ATTN, asked for a
text completion by the `openai` client, then stopped; every wait has a deadline. Run inside
the vLLM venv by tests/serving/test_vllm_serve.py:

    python serve_check.py [OUT.json]

It saves a tiny random Llama with a word-level tokenizer (tiny_models.py), starts
`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 at a free port with
IPEX_FLASH_VLLM=1, waits for /health, asks for 8 greedy tokens (ignore_eos, so a random
model's early end-of-text cannot shorten the answer), stops the server (SIGINT, then SIGKILL
of its process group after a deadline) and reads its log for the plugin's and the layers'
lines. Prints (and writes to OUT.json) {"ok", "completion", "log", "stop", ...}; exits 1
when something failed, the log's tail in "log_tail".
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tiny_models import make, save_word_tokenizer

READY_DEADLINE_S = 240  # an engine start is 20-35 s here; the first kernel builds add more
REQUEST_TIMEOUT_S = 120
STOP_DEADLINE_S = 30
MAX_TOKENS = 8
PROMPT = "w10 w11 w12 w13 w14 w15 w16 w17"
MODEL_NAME = "tiny-llama"
# What the log must show: the plugin switched the backend, and the layers run on it.
REGISTERED = "registered in place of CPU_ATTN"
SERVES = "ipex_flash: vLLM attention backend IPEX_FLASH serves"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, log) -> subprocess.Popen:
    env = {**os.environ, "IPEX_FLASH_VLLM": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model), "--served-model-name", MODEL_NAME,
               "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--block-size", "32", "--max-model-len", "256",
               "--enforce-eager", "--seed", "0", "--max-num-seqs", "4"]
    # A session of its own, so a stuck server's engine process can be killed with it.
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_healthy(server: subprocess.Popen, port: int) -> float:
    """Seconds until /health answered 200; raises if the server exited or the deadline passed."""
    started = time.monotonic()
    while time.monotonic() - started < READY_DEADLINE_S:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before /health "
                               f"answered")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass  # not listening yet
        time.sleep(1)
    raise TimeoutError(f"/health did not answer within {READY_DEADLINE_S} s")


def complete(port: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                           timeout=REQUEST_TIMEOUT_S, max_retries=0)
    started = time.monotonic()
    answer = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                       temperature=0,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = answer.choices[0]
    return {"text": choice.text, "token_ids": getattr(choice, "token_ids", None),
            "finish_reason": choice.finish_reason,
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": answer.usage.completion_tokens,
            "seconds": time.monotonic() - started}


def stop(server: subprocess.Popen) -> dict:
    """SIGINT (vLLM's own shutdown, engine process included), SIGKILL of the whole process
    group if it is still running after the deadline; any process of the group left behind
    is killed too."""
    started = time.monotonic()
    how = "already exited"
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        how = "SIGINT"
        try:
            server.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            how = "SIGKILL"
    try:
        os.killpg(server.pid, signal.SIGKILL)  # the group is ours: start_new_session
    except ProcessLookupError:
        pass
    server.wait(10)
    return {"by": how, "returncode": server.returncode,
            "seconds": time.monotonic() - started}


def log_lines(text: str, marker: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if marker in line]


def check(work: Path) -> dict:
    model = make(work, "llama")
    save_word_tokenizer(model)
    port = free_port()
    log_path = work / "server.log"
    result: dict = {"ok": False, "port": port, "log_path": str(log_path)}
    with open(log_path, "w") as log:
        server = start_server(model, port, log)
        try:
            result["ready_s"] = wait_healthy(server, port)
            result["completion"] = complete(port)
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
        finally:
            result["stop"] = stop(server)
    text = log_path.read_text(errors="replace")
    result["log"] = {"registered": log_lines(text, REGISTERED), "serves": log_lines(text, SERVES)}
    completion = result.get("completion") or {}
    result["ok"] = ("error" not in result and bool(completion.get("text", "").strip())
                    and completion.get("completion_tokens") == MAX_TOKENS
                    and bool(result["log"]["registered"]) and bool(result["log"]["serves"]))
    if not result["ok"]:
        result["log_tail"] = text.splitlines()[-40:]
    return result


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ipex_flash_serve_") as work:
        result = check(Path(work))
    out = json.dumps(result, indent=1)
    print(out)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(out)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
