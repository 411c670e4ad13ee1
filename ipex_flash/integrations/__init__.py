"""Adapters that plug ipex_flash's kernels into other libraries.

Each submodule imports its library itself, so `import ipex_flash` never pulls in an optional
dependency:

    ipex_flash.integrations.transformers   Hugging Face transformers attention backend
    ipex_flash.integrations.vllm           vllm-xpu-kernels' attention entry point and cache write
    ipex_flash.integrations.sglang         sgl-kernel's flash_attn module (SGLang's XPU backend)
"""
