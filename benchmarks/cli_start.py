"""Benchmark: how fast the command line starts, next to a bare typer program.

    .venv/bin/python benchmarks/cli_start.py [--runs 10] [--json]

Three commands, each run ``--runs`` times as a new process: ``python -c "import
typer, rich"`` (the floor any typer command line stands on), ``phasegate --help``
and ``phasegate status`` in the sample project of ``phasegate demo`` holding three
workflows filed through the engine (none advanced). Both phasegate commands are
the ``phasegate`` program of this interpreter's environment. Printed per command:
the median wall time in seconds and its ratio to the typer and rich baseline.
The figures are printed, not judged; the exit code is 1 only when a command
failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.tools.demo import make_sample_project

TICKETS = (
    "Add multiply() to calc",
    "Add subtract() to calc",
    "Document divide() in the README",
)


def _sample_repository(where: Path) -> Path:
    """The demo's sample project with ``TICKETS`` filed as workflows in preparation."""
    repo = make_sample_project(where / "calc")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        for ticket in TICKETS:
            engine.start(ticket, ticket)
    finally:
        store.close()
    return repo


def _median_seconds(command: list[str], cwd: Path, runs: int) -> float:
    """The median wall time of ``command`` over ``runs`` runs; raises CalledProcessError."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="Runs of each command.")
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    args = parser.parse_args()
    phasegate = str(Path(sys.executable).parent / "phasegate")
    with tempfile.TemporaryDirectory(prefix="phasegate-cli-start-") as tmp:
        repo = _sample_repository(Path(tmp))
        commands = {
            "typer+rich": [sys.executable, "-c", "import typer, rich"],
            "--help": [phasegate, "--help"],
            "status": [phasegate, "status"],
        }
        try:
            medians = {
                name: _median_seconds(cmd, repo, args.runs) for name, cmd in commands.items()
            }
        except (subprocess.CalledProcessError, OSError) as exc:
            stderr = getattr(exc, "stderr", b"") or b""
            print(f"error: {exc}\n{stderr.decode(errors='replace')}", file=sys.stderr)
            return 1
    baseline = medians["typer+rich"]
    rows = [
        {"command": name, "median_s": round(seconds, 4), "ratio": round(seconds / baseline, 2)}
        for name, seconds in medians.items()
    ]
    if args.json:
        print(json.dumps({"runs": args.runs, "results": rows}))
        return 0
    print(f"cli start, median of {args.runs} runs each ({phasegate})")
    for row in rows:
        print(f"  {row['command']:<12} {row['median_s']:8.3f} s  {row['ratio']:6.2f}x typer+rich")
    return 0


if __name__ == "__main__":
    sys.exit(main())
