"""python -m ipex_flash [demo|warmup|info|gpu-check|selftest]: see ipex_flash/tools/cli.py."""
from ipex_flash.tools.cli import main

if __name__ == "__main__":
    main()
