"""The node side as one zipapp: what the fleet pushes to nodes that have no gpuops installed.

It holds `gpuops/__init__.py`, `gpuops/core`, `gpuops/node` and pynvml's single module — stdlib
otherwise — so a node needs only Python 3.8+ and the NVIDIA driver. The archive is built
byte-for-byte reproducibly (sorted entries, fixed timestamps), so its hash names it in the node's
cache: an unchanged agent is never uploaded twice.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gpuops

_FIXED_TIME = (2020, 1, 1, 0, 0, 0)
_MAIN = b"import sys\nfrom gpuops.node.main import main\nsys.exit(main())\n"


@dataclass(frozen=True)
class Zipapp:
    data: bytes
    digest: str  # sha256 hex of data

    @property
    def name(self) -> str:
        return f"gpuops-agent-{self.digest[:16]}.pyz"


def _files() -> list[tuple[str, bytes]]:
    root = Path(gpuops.__file__).parent
    files = [("gpuops/__init__.py", (root / "__init__.py").read_bytes())]
    for part in ("core", "node"):
        for path in sorted((root / part).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                files.append((f"gpuops/{path.relative_to(root).as_posix()}", path.read_bytes()))
    spec = importlib.util.find_spec("pynvml")
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        files.append(("pynvml.py", Path(spec.origin).read_bytes()))
    files.append(("__main__.py", _MAIN))
    return sorted(files)


@lru_cache(maxsize=1)
def build() -> Zipapp:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in _files():
            info = zipfile.ZipInfo(name, _FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    return Zipapp(data, hashlib.sha256(data).hexdigest())
