"""Control machine: the wheels a node installs, and one digest that names them.

    python build_wheels.py SOURCE WHEELHOUSE REQUIREMENT... [--download]

Builds gpuops' wheel from SOURCE (a gpuops checkout) into WHEELHOUSE, offline: from a copy of
the package's own files, so leftovers of earlier builds in SOURCE/build never reach a node, and
without build isolation, so no index is asked for setuptools. Each REQUIREMENT (a distribution
name: nvidia-ml-py, prometheus-client) must have a wheel in WHEELHOUSE; with --download the
missing ones are fetched with `pip download` (the only step that needs an index).

Prints one JSON object: {"wheels": [file names], "digest": hex, "downloaded": [names]}. The
digest covers what the wheels hold, not their zip metadata (a rebuilt wheel of the same code has
other timestamps but the same digest), so a node reinstalls only when the code changes. The
wheel is built again only when the package files changed since the last build into WHEELHOUSE.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_of(wheelhouse: str, name: str) -> str | None:
    """The newest wheel of distribution `name` in the wheelhouse (by file name), or None."""
    want = _canonical(name)
    found = sorted(
        f for f in os.listdir(wheelhouse) if f.endswith(".whl") and _canonical(f.split("-")[0]) == want
    )
    return found[-1] if found else None


def _fail(message: str) -> None:
    print(json.dumps({"failed": True, "msg": message}))
    sys.exit(1)


STAMP = "gpuops-wheel.source"


def source_digest(source: str) -> str:
    """sha256 over the package files a build copies (relative name and bytes, sorted)."""
    h = hashlib.sha256()
    paths = [name for name in PACKAGE_FILES if os.path.isfile(os.path.join(source, name))]
    for top, dirs, files in os.walk(os.path.join(source, "gpuops")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.relpath(os.path.join(top, f), source) for f in files if not f.endswith(".pyc")]
    for rel in sorted(paths):
        with open(os.path.join(source, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def build(source: str, wheelhouse: str) -> str:
    """gpuops' wheel in the wheelhouse: the one built before from the same package files (named
    with their digest in gpuops-wheel.source), else a new one."""
    digest = source_digest(source)
    stamp = os.path.join(wheelhouse, STAMP)
    if os.path.isfile(stamp):
        with open(stamp) as f:
            said = f.read().split()
        if len(said) == 2 and said[0] == digest and os.path.isfile(os.path.join(wheelhouse, said[1])):
            return said[1]
    wheel = _build(source, wheelhouse)
    with open(stamp + ".tmp", "w") as f:
        f.write(f"{digest} {wheel}\n")
    os.replace(stamp + ".tmp", stamp)
    return wheel


def _build(source: str, wheelhouse: str) -> str:
    with tempfile.TemporaryDirectory(prefix="gpuops-wheel-") as tmp:
        tree = os.path.join(tmp, "src")
        os.mkdir(tree)
        for name in PACKAGE_FILES:
            path = os.path.join(source, name)
            if os.path.isfile(path):
                shutil.copy2(path, tree)
        shutil.copytree(
            os.path.join(source, "gpuops"),
            os.path.join(tree, "gpuops"),
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        out = os.path.join(tmp, "out")
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        argv += ["--disable-pip-version-check", "-q", "-w", out, tree]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            _fail(f"building the gpuops wheel from {source} failed: {said}")
        (wheel,) = os.listdir(out)
        for old in os.listdir(wheelhouse):
            if _canonical(old.split("-")[0]) == "gpuops" and old.endswith(".whl"):
                os.unlink(os.path.join(wheelhouse, old))
        shutil.move(os.path.join(out, wheel), os.path.join(wheelhouse, wheel))
        return wheel


def content_digest(path: str) -> str:
    """sha256 over the wheel's members (name and bytes, sorted), RECORD left out: it lists the
    same hashes in build order."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if name.endswith(".dist-info/RECORD"):
                continue
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


def main(argv: list[str]) -> None:
    download = "--download" in argv
    args = [a for a in argv if a != "--download"]
    if len(args) < 2:
        _fail("usage: build_wheels.py SOURCE WHEELHOUSE REQUIREMENT... [--download]")
    source, wheelhouse, requirements = args[0], args[1], args[2:]
    if not os.path.isfile(os.path.join(source, "gpuops", "node", "agent.py")):
        _fail(f"{source} is not a gpuops checkout (no gpuops/node/agent.py): set gpuops_node_source")
    os.makedirs(wheelhouse, exist_ok=True)
    wheels = [build(source, wheelhouse)]
    downloaded = []
    for requirement in requirements:
        wheel = _wheel_of(wheelhouse, requirement)
        if wheel is None and download:
            argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
            argv += ["--disable-pip-version-check", "-q", "-d", wheelhouse, requirement]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            wheel = _wheel_of(wheelhouse, requirement)
            if done.returncode != 0 or wheel is None:
                said = (done.stderr.strip().splitlines() or ["no wheel came"])[-1]
                _fail(f"pip download {requirement} into {wheelhouse} failed: {said}")
            downloaded.append(requirement)
        if wheel is None:
            _fail(
                f"no wheel of {requirement} in {wheelhouse}: put one there "
                f"(pip download --no-deps -d {wheelhouse} {requirement}) or set gpuops_node_download: true"
            )
        wheels.append(wheel)
    h = hashlib.sha256()
    for wheel in wheels:
        wheel_digest = content_digest(os.path.join(wheelhouse, wheel))
        h.update(wheel.split("-")[0].encode() + b"\0" + wheel_digest.encode())
    print(json.dumps({"wheels": wheels, "digest": h.hexdigest(), "downloaded": downloaded}))


if __name__ == "__main__":
    main(sys.argv[1:])
