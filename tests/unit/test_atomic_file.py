"""core/atomic_file.py, the one atomic file replacement both sides use: exact modes (0600 by
default), the umask honoured where asked, nothing left behind when a write fails, and a reader
that never sees part of a file."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.core.atomic_file import atomic_write


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_private_and_holds_the_text(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "plan.json"
    atomic_write(target, "é\n")
    assert target.read_bytes() == "é\n".encode()
    assert mode_of(target) == 0o600
    assert os.listdir(tmp_path) == ["plan.json"]


def test_the_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "tenants"
    old = os.umask(0o077)
    try:
        atomic_write(target, b"x", 0o644)
    finally:
        os.umask(old)
    assert mode_of(target) == 0o644


def test_with_umask_the_mode_goes_through_it_as_open_does(tmp_path: Path) -> None:
    target = tmp_path / "mps.json"
    old = os.umask(0o027)
    try:
        atomic_write(target, "{}", 0o666, umask=True)
    finally:
        os.umask(old)
    assert mode_of(target) == 0o640


def test_an_existing_file_is_replaced_not_rewritten(tmp_path: Path) -> None:
    """A reader holding the old file keeps the old contents: the new one is a new inode."""
    target = tmp_path / "minutes.json"
    target.write_text("old")
    with target.open() as held:
        atomic_write(target, "new", durable=False, sync_directory=True)
        assert held.read() == "old"
    assert target.read_text() == "new"


def test_a_failed_rename_leaves_the_target_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir()
    (target / "kept").write_text("x")
    with pytest.raises(IsADirectoryError):
        atomic_write(target, "x")
    assert (target / "kept").read_text() == "x"
    assert os.listdir(tmp_path) == ["state"]


def test_the_target_must_be_writable_where_it_is(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "f", "x")


def test_the_temporary_file_is_hidden_beside_the_target(tmp_path: Path) -> None:
    """Same directory (a rename across file systems is not atomic), named `.NAME.*.tmp` so the
    directory cleaners know a leftover: seen by a thread that lists the directory meanwhile."""
    target = tmp_path / "hours-20250101.json"
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(os.listdir(tmp_path))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(200):
            atomic_write(target, "x" * 65536, durable=False)
    finally:
        stop.set()
        watcher.join()
    temporaries = seen - {target.name}
    assert all(n.startswith(".hours-20250101.json.") and n.endswith(".tmp") for n in temporaries)
    assert os.listdir(tmp_path) == [target.name]
