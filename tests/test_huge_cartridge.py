"""A cartridge with 100,000 unknown keys: ``doctor`` refuses it as ``run`` does, in
about the same time, and both name the first unknown keys and count the rest
(``benchmarks/huge_cartridge.py`` prints the times)."""

from __future__ import annotations

import importlib.util
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import CartridgeError, load_cartridge
from phasegate.tools.doctor import diagnose

from conftest import phasegate_cli

_spec = importlib.util.spec_from_file_location(
    "huge_cartridge", Path(__file__).parents[1] / "benchmarks" / "huge_cartridge.py"
)
assert _spec is not None and _spec.loader is not None
huge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(huge)

KEYS = 100_000


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return huge.write_repository(tmp_path_factory.mktemp("huge") / "repo", KEYS, "limits")


def refusal_lines(message: str) -> list[str]:
    return [line for line in message.splitlines() if "phasegate.toml: " in line]


def test_the_refusal_names_twenty_unknown_keys_and_counts_the_rest(repo: Path) -> None:
    with pytest.raises(CartridgeError) as refused:
        load_cartridge(repo)
    lines = str(refused.value).splitlines()
    assert lines[:2] == [
        f"{repo}/phasegate.toml: limits.unknown_0: unknown key",
        f"{repo}/phasegate.toml: limits.unknown_1: unknown key",
    ]
    assert len(lines) == 21
    assert lines[-1] == (
        f"{repo}/phasegate.toml: … and 99,980 more problems (100,000 unknown keys in all)"
    )


def test_doctor_reads_and_validates_the_cartridge_once_as_run_does(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    loads = tomllib.loads

    def counting(text: str, **kwargs: Any) -> dict[str, Any]:
        parsed.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(tomllib, "loads", counting)
    found = diagnose(repo, offline=True)
    assert not found.ok and found.cartridge["valid"] is False
    assert len(found.cartridge["error"].splitlines()) == 21
    assert [m for m in found.missing if "unknown key" in m] == [
        f"the cartridge is invalid: {found.cartridge['error']}"
    ]
    # The roles still show, read from the one parse (a 2 MB document parsed once, not twice).
    assert [(r.role, r.bound) for r in found.roles] == [(role, True) for role in huge.ROLES]
    assert len(parsed) == 1 and parsed[0] > 2_000_000


def test_doctor_and_run_refuse_it_in_about_the_same_time(repo: Path) -> None:
    started = time.monotonic()
    run = phasegate_cli("run", "--repo", str(repo), "a ticket")
    run_s = time.monotonic() - started
    started = time.monotonic()
    doctor = phasegate_cli("doctor", "--repo", str(repo), "--offline")
    doctor_s = time.monotonic() - started
    assert run.returncode == 2 and doctor.returncode == 1
    for proc in (run, doctor):
        text = proc.stdout + proc.stderr
        assert "limits.unknown_0: unknown key" in " ".join(text.split())
        assert "100,000 unknown keys in all" in " ".join(text.split())
        assert "Traceback" not in text
        assert len(text.splitlines()) < 100  # a screenful, not a line per key
    # Generous: it was 43 s against run's 3.7 s (every key printed, rich's wrapping of a
    # 100,000-line message quadratic); now it is within a small factor.
    assert doctor_s < 3 * run_s + 2, (doctor_s, run_s)
