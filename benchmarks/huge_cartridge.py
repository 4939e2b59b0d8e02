"""A cartridge with 100,000 unknown keys: ``phasegate doctor`` and ``phasegate run``
both refuse it, and how long each takes.

    python benchmarks/huge_cartridge.py [--keys 100000] [--table limits] [--repeat 3]

Writes a repository whose committed cartridge binds every role and carries
``--keys`` unknown keys in ``[--table]`` (``top`` puts them at the top level),
then times the real console scripts ``phasegate run`` and ``phasegate doctor
--offline`` on it (the best of ``--repeat``), checks each refused it naming
unknown keys, and prints both times and doctor's over run's. Exit 1 when
either accepted the cartridge or doctor took more than 3 times run's time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROLES = ("plan", "plan_review", "build", "review", "verification")


def write_repository(where: Path, keys: int, table: str) -> Path:
    """A git repository at ``where`` with a cartridge of ``keys`` unknown keys."""
    where.mkdir(parents=True)
    junk = "".join(f"unknown_{i} = {i}\n" for i in range(keys))
    parts = [junk if table == "top" else "", '[workflow]\nbase_branch = "main"\n']
    parts.append(f"[{table}]\n{junk}" if table != "top" else "")
    parts += [f'[roles.{role}]\nrunner = "command"\ncommand = "true"\n' for role in ROLES]
    (where / "phasegate.toml").write_text("\n".join(parts))
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "cartridge"],
    ):
        subprocess.run(["git", *args], cwd=where, check=True)
    return where


def timed(args: list[str], repeat: int) -> tuple[float, subprocess.CompletedProcess[str]]:
    """The best of ``repeat`` wall times (seconds) of ``phasegate args``, and its run."""
    exe = Path(sys.executable).parent / "phasegate"
    best, proc = float("inf"), None
    for _ in range(repeat):
        started = time.monotonic()
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=900)
        best = min(best, time.monotonic() - started)
    assert proc is not None
    return best, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--table", default="limits", help="the table, or 'top'")
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="huge-cartridge-") as tmp:
        repo = write_repository(Path(tmp) / "repo", opts.keys, opts.table)
        size = (repo / "phasegate.toml").stat().st_size
        print(f"cartridge: {opts.keys:,} unknown keys in [{opts.table}], {size:,} bytes")
        run_s, run = timed(["run", "--repo", str(repo), "a ticket"], opts.repeat)
        doctor_s, doctor = timed(["doctor", "--repo", str(repo), "--offline"], opts.repeat)
    ok = True
    for name, proc, seconds in (("run", run, run_s), ("doctor", doctor, doctor_s)):
        text = proc.stdout + proc.stderr
        refused = proc.returncode != 0 and "unknown key" in text
        ok = ok and refused
        lines = len(text.splitlines())
        print(
            f"{name:>6}: {seconds:6.2f} s, exit {proc.returncode}, {lines} lines of output"
            + ("" if refused else "  (DID NOT REFUSE IT)")
        )
    ratio = doctor_s / run_s
    print(f" ratio: doctor takes {ratio:.2f}x run's time")
    return 0 if ok and ratio <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
