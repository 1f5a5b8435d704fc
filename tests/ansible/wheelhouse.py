"""Wheels of the node's dependencies without an index: the tests may not reach PyPI, so the
wheels of nvidia-ml-py and prometheus-client (pure Python) are packed again from what the test
venv has installed: every file its RECORD lists, a fresh RECORD, the tag its WHEEL file names.
`pip install --no-index` on the node then installs them as it would the downloaded ones."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from importlib import metadata
from pathlib import Path

NODE_REQUIREMENTS = ("nvidia-ml-py", "prometheus-client")
_INSTALLER_ONLY = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(name: str, out: Path) -> Path:
    dist = metadata.distribution(name)
    files = [f for f in dist.files or () if "__pycache__" not in f.parts and not str(f).startswith("..")]
    info_dir = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    if tags != ["py3-none-any"]:
        raise ValueError(f"{name} is not a pure-Python wheel (tags {tags}): it cannot be packed again here")
    stem = info_dir.removesuffix(".dist-info")
    path = out / f"{stem}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(files, key=str):
            if f.parts[0] == info_dir and f.name in _INSTALLER_ONLY:
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            z.writestr(str(f), data)
            records.append(f"{f},{_record_hash(data)},{len(data)}")
        records.append(f"{info_dir}/RECORD,,")
        z.writestr(f"{info_dir}/RECORD", "\n".join(records) + "\n")
    return path


def fill(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [repack(name, out) for name in NODE_REQUIREMENTS]
