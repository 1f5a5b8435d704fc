#!/usr/bin/env bash
# Python 3.12 wheels of gpuops' runtime dependencies, for a lent GPU machine: it has no network
# and its python3 (3.12, with PyTorch) lacks asyncssh, pydantic, ruamel.yaml and the rest that
# `gpuops discover` (tests/gpu/test_nvml_real.py) needs. Run here, where pip reaches an index:
#
#   bash scripts/gpu-wheels.sh            # -> .whl/ (in .gitignore), the versions of .venv
#
# then carry `.whl` in the device call and begin its command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD
# (docs/testing.md, "A session with a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl
venv=.venv/bin/python
[ -x "$venv" ] || { echo "error: no .venv here: run make venv first" >&2; exit 1; }
mkdir -p "$out"
# The runtime closure of gpuops as installed in the venv (dev tools and gpuops itself left out).
mapfile -t pins < <("$venv" - <<'PY'
import importlib.metadata as md
import re

seen, todo = {}, ["gpuops"]
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    seen[key] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
seen.pop("gpuops", None)
for key, version in sorted(seen.items()):
    print(f"{key}=={version}")
PY
)
platforms=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
    manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
for pin in "${pins[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$out" "$pin"
done
echo "$(ls "$out" | wc -l) wheels in $out ($(du -sh "$out" | cut -f1)): ${pins[*]}"
