"""`python -m gpuops.simfleet serve --dir DIR`: the sim fleet process (see runner.py)."""

from __future__ import annotations

import sys

from gpuops.simfleet.runner import main

if __name__ == "__main__":
    sys.exit(main())
