"""The ``phasegate`` command line (typer).

Exit codes: 0 done (completed, or waiting for a person: a merge approval in
wait, a proposal's approval in awaiting_approval); 1 the workflow
failed or paused; 2 bad input (cartridge, unknown workflow, illegal request);
130 stopped by Ctrl-C or SIGTERM (the workflow stays resumable).
"""

from importlib import import_module

from phasegate.cli._app import app

# Each group registers its commands on import; this order is --help's order.
for _group in ("setup", "workflows", "proposals", "demo"):
    import_module(f"phasegate.cli.{_group}")

__all__ = ["app", "main"]


def main() -> None:
    app()
