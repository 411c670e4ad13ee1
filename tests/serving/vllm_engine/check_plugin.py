"""The plugin's switch as vLLM loads it (vllm.plugins.load_general_plugins, the loader every vLLM
process calls), and the block sizes vLLM gives the backend; run inside the vLLM venv by
tests/serving/test_vllm_engine.py, printing one JSON object:

    python check_plugin.py
"""
from __future__ import annotations

import json
import os
import sys


def load(switch, broken: bool = False) -> dict:
    """What vLLM's loader does with IPEX_FLASH_VLLM=switch (None: unset): which backends point
    at ipex_flash, or the error that stopped it."""
    import vllm.plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for member in AttentionBackendEnum:
        member.clear_override()
    vllm.plugins.plugins_loaded = False
    os.environ.pop("IPEX_FLASH_VLLM", None)
    if switch is not None:
        os.environ["IPEX_FLASH_VLLM"] = switch
    hidden = {name: sys.modules.pop(name) for name in list(sys.modules)
              if name == "ipex_flash" or name.startswith("ipex_flash.")}
    if broken:
        sys.modules["ipex_flash"] = None  # an install whose package cannot be imported
    try:
        vllm.plugins.load_general_plugins()
        error = None
    except Exception as e:  # noqa: BLE001  (reported to the test)
        error = f"{type(e).__name__}: {e}"
    finally:
        sys.modules.pop("ipex_flash", None)
        sys.modules.update(hidden)
    ours = {member.name: member.get_path() for member in AttentionBackendEnum
            if member.is_overridden() and "ipex_flash" in member.get_path()}
    return {"error": error, "ipex_flash_backends": ours}


def platform_choice() -> dict:
    """The class the CPU platform picks for a decoder layer, and the name it then reports."""
    import torch
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto",
                                     block_size=32)
    path = current_platform.get_attn_backend_cls(None, config)
    return {"path": path, "name": resolve_obj_by_qualname(path).get_name()}


def block_sizes() -> dict:
    """The kernel page vLLM chooses for a block (its worker's select_common_block_size), and
    the backend's refusal of a page it cannot read."""
    from vllm.v1.worker.utils import select_common_block_size

    from ipex_flash.integrations.vllm_backend.backend import IpexFlashBackend
    from ipex_flash.integrations.vllm_backend.metadata import check_block_size

    chosen = {n: select_common_block_size(n, [IpexFlashBackend]) for n in (32, 512, 1024, 528)}
    try:
        check_block_size(600)
        refusal = None
    except ValueError as e:
        refusal = str(e)
    return {"chosen": chosen, "refusal_600": refusal}


def main() -> None:
    result = {"unset": load(None), "on": load("1")}
    result["platform"] = platform_choice()  # (with the switch on, as load("1") left it)
    result.update(off=load("0"), bad_value=load("yes"), broken=load("1", broken=True),
                  block_sizes=block_sizes())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
