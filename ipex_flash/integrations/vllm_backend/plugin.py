"""The switch that puts vLLM's engine on ipex_flash: the `vllm.general_plugins` entry point,
which vLLM calls in each of its processes (front end, engine core, workers) before it picks an
attention backend.

    IPEX_FLASH_VLLM=1   ipex_flash's backend is registered in place of the platform's default:
                        CPU_ATTN on the CPU platform (which always takes it), FLASH_ATTN on XPU.
                        The setup is checked first; what is broken raises, and vLLM stops.
    unset or 0          registered as AttentionBackendEnum.CUSTOM only, and nothing else
                        changes: `--attention-backend CUSTOM` selects it where the platform
                        honours a choice.

The wheel installs this file twice: here, and as the top-level module ipex_flash_vllm that
the entry point names. That one imports nothing of ipex_flash until register() runs, so a
broken ipex_flash install is an error at engine start with the import's reason, rather than
vLLM logging a failed plugin and running its own backend.
"""
from __future__ import annotations

import os

SWITCH = "IPEX_FLASH_VLLM"
BACKEND = "ipex_flash.integrations.vllm_backend.backend.IpexFlashBackend"


def register() -> None:
    """The entry point. Safe to call more than once (vLLM may load plugins again)."""
    from vllm.logger import init_logger
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    logger = init_logger("vllm.ipex_flash")
    switch = os.environ.get(SWITCH, "").strip()
    if switch not in ("", "0", "1"):
        raise ValueError(f"{SWITCH} must be 1 (ipex_flash in place of the platform's attention "
                         f"backend) or 0 / unset (selectable as CUSTOM), got {switch!r}")
    if switch != "1":
        register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
        logger.debug("ipex_flash: attention backend registered as CUSTOM (%s is not 1)",
                     SWITCH)
        return
    replaced, device = _platform_default(AttentionBackendEnum)
    if device == "cpu" and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ):
        # torch is loaded before any plugin, so its OpenMP threads here keep spinning after
        # each op and slow the SYCL CPU device's kernels (ipex_flash/_runtime.py); processes
        # vLLM starts from this one (its workers) read the short spin when they load torch.
        os.environ["GOMP_SPINCOUNT"] = "10000"
    _check_setup(device)
    register_backend(replaced, BACKEND)
    logger.info("ipex_flash: attention backend IPEX_FLASH registered in place of %s, the %s "
                "platform's default (%s=1); its kernels run on %s", replaced.name, device,
                SWITCH, "the SYCL CPU device" if device == "cpu" else "the XPU's SYCL queue")


def _platform_default(backends) -> tuple:
    """(the backend the platform would run, its device type)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return backends.CPU_ATTN, "cpu"
    if current_platform.is_xpu():
        return backends.FLASH_ATTN, "xpu"
    raise RuntimeError(f"{SWITCH}=1: ipex_flash's attention backend runs on vLLM's CPU and XPU "
                       f"platforms, and this one is {current_platform.device_type!r}; unset "
                       f"{SWITCH}")


def _check_setup(device: str) -> None:
    """ipex_flash imports and its SYCL device answers; else an error that says what is wrong."""
    try:
        import ipex_flash  # noqa: F401
        from ipex_flash._runtime import C
        from ipex_flash.ops.launch import queue_handle
    except Exception as e:
        raise RuntimeError(f"{SWITCH}=1, but ipex_flash cannot be imported ({type(e).__name__}: "
                           f"{e}); reinstall it (pip install 'ipex_flash[cpu]' for the CPU "
                           f"device) or unset {SWITCH}") from e
    import torch

    if device == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise RuntimeError(f"{SWITCH}=1 on vLLM's XPU platform, but torch sees no XPU")
    try:
        C.device_info(queue_handle(torch.device(device, 0) if device == "xpu"
                                   else torch.device("cpu")))
    except Exception as e:
        hint = ("the CPU device needs Intel's OpenCL CPU runtime and a SYCL runtime up to "
                "2026.1: pip install 'ipex_flash[cpu]'" if device == "cpu"
                else "check the XPU driver and torch's XPU build")
        raise RuntimeError(f"{SWITCH}=1, but ipex_flash's SYCL {device} device does not answer "
                           f"({type(e).__name__}: {e}); {hint}") from e
