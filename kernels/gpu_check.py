"""`make gpu-check`: run knobkeeper_kernels.gpu_check from this folder, with no install.

The device machine runs it with its own bare python3 (its torch and triton; no network, maybe no
setuptools), so the package is put on sys.path rather than pip-installed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from knobkeeper_kernels.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
