"""The command line (`python -m ipex_flash`, cli.py) and what it runs besides attention:
selftest (selftest.py) and gpu-check, the native-code checks for Intel GPUs without a GPU
(gpu_check.py: the driver; gpu_grid.py: the calls and kernel programs per GPU; gpu_native.py:
ocloc and its output; gpu_rules.py: what every kernel must satisfy)."""
