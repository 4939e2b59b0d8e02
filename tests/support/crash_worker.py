"""``python -m support.crash_worker --repo R --crash-after METHOD``: one worker pass that dies
(``os._exit``, like SIGKILL) right after the named Forge method succeeds."""

from __future__ import annotations

import argparse
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.forge import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.testing import CrashingForge


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m support.crash_worker")
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--crash-after", required=True, help="a Forge method name")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    workspace = Workspace()
    forge = CrashingForge(LocalForge(store, repo, workspace), args.crash_after)
    Engine(repo, cartridge, store, forge=forge, workspace=workspace).run_worker(once=True)


if __name__ == "__main__":
    main()
