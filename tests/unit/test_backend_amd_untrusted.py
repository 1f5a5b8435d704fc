"""The AMD backend does not take what the library says on trust (docs/backends.md, "What the
library says"): text that is not UTF-8 is decoded with replacement characters, amdsmi's "not
supported" sentinels are NotAvailable, and figures no GPU can have are NotAvailable too, never shown
as figures. Through the plugin installed by pip and AMD's real `amdsmi` binding over the fake
libamd_smi.so, with `gpuops discover --local --backend amd` (tests/fakes/fake_amdsmi)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import amdsmi_fake as fake

from tests.unit.test_backend_amd import discover, installed  # noqa: F401  (the fixture, by name)

NO_SUCH_PID = 4_194_303  # above any pid_max: /proc has no command line, so amdsmi's name is shown
NOT_UTF8 = "\udcff\udcfe"  # the bytes 0xFF 0xFE in the node file (written with surrogateescape)


def test_a_process_name_that_is_not_utf8_is_shown_with_replacement_characters(
    installed: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Before: `error: 'utf-8' codec can't decode byte 0xff...`, exit 1, no GPU shown."""
    node = {
        "gpus": [
            fake.gpu(0, procs=[(NO_SUCH_PID, 2 * fake.GiB, NOT_UTF8 + "python")]),
            fake.gpu(1, activity=(61, 20, 0)),
        ]
    }
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    g0, g1 = json.loads(done.stdout)["gpus"]
    (proc,) = g0["processes"]
    assert proc["pid"] == NO_SUCH_PID and proc["command"] == "\ufffd\ufffdpython"
    assert proc["used_memory_bytes"] == 2 * fake.GiB
    assert g0["processes_error"] == ""
    assert g1["sample"]["utilization_gpu_percent"] == 61.0  # the other GPU is there too

    table = discover(node, tmp_path, installed)
    assert table.returncode == 0, table.stderr
    assert "AMD Instinct MI300X" in table.stdout


def test_a_driver_version_that_is_not_utf8_does_not_stop_the_backend(
    installed: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = {"driver_version": "6.10.5-" + NOT_UTF8, "gpus": [fake.gpu(0)]}
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["driver_version"] == "6.10.5-\ufffd\ufffd"
    assert doc["gpus"][0]["sample"]["utilization_gpu_percent"] == 37.0


U16, U32, U64 = 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
NA = {"na": "NOT_SUPPORTED"}  # amdsmi's sentinel: the library has no figure
BAD = {"na": "UNEXPECTED_DATA"}  # a figure no GPU can have (AMDSMI_STATUS_UNEXPECTED_DATA's name)


@pytest.mark.parametrize(
    ("overrides", "field", "expected"),
    [
        ({"activity": (U32, 12, 0)}, "utilization_gpu_percent", NA),
        ({"activity": (37, U16, 0)}, "utilization_memory_percent", NA),
        ({"activity": (150, 12, 0)}, "utilization_gpu_percent", BAD),
        ({"power": -312}, "power_watts", BAD),  # the library's uint32 holds 4294966984
        ({"power": U16}, "power_watts", NA),
        ({"temperature": (-1, 2**31 - 1)}, "temperature_celsius", NA),
        ({"temperature": (-1, 1000)}, "temperature_celsius", BAD),
        ({"vram_used": U64}, "memory_used_bytes", NA),
        ({"vram_used": 200 * 1024 * fake.MiB}, "memory_used_bytes", BAD),  # more than the 192 GiB
        ({"clocks": (U32 - 1, 1300)}, "sm_clock_mhz", BAD),
    ],
)
def test_sentinels_and_impossible_figures_are_not_available(
    installed: Path,  # noqa: F811
    tmp_path: Path,
    overrides: dict[str, object],
    field: str,
    expected: dict[str, str],
) -> None:
    node = {"gpus": [fake.gpu(0, **overrides)]}
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    (g,) = json.loads(done.stdout)["gpus"]
    assert g["sample"][field] == expected, g["sample"]
    others = {k: v for k, v in g["sample"].items() if k != field and isinstance(v, dict)}
    assert not others, others  # only that figure is left out

    table = discover(node, tmp_path, installed)
    assert table.returncode == 0, table.stderr
    for shown in ("4294967295", "4294966984", "2147483647", "18446744073709551615", "150%"):
        assert shown not in table.stdout, table.stdout


def test_a_process_memory_sentinel_or_beyond_the_gpu_is_not_available(
    installed: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = {"gpus": [fake.gpu(0, procs=[(NO_SUCH_PID, U64, "a"), (NO_SUCH_PID - 1, 300 * fake.GiB, "b")])]}
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    (g,) = json.loads(done.stdout)["gpus"]
    assert [p["used_memory_bytes"] for p in g["processes"]] == [NA, BAD]
