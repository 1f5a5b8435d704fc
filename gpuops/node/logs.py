"""Where the node side logs: stderr, one prefixed line per record (stdout is the protocol's)."""

from __future__ import annotations

import logging
import sys


def log_to_stderr(level: str = "WARNING") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gpuops-agent: %(levelname)s %(message)s"))
    root = logging.getLogger("gpuops")
    root.addHandler(handler)
    root.setLevel(level)
