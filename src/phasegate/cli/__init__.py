"""The ``phasegate`` command line (typer).

Exit codes: 0 done (completed, or waiting for a person: a merge approval in
wait, a proposal's approval in awaiting_approval); 1 the workflow
failed or paused; 2 bad input (cartridge, unknown workflow, illegal request);
130 stopped by Ctrl-C or SIGTERM (the workflow stays resumable).
"""

import logging
from importlib import import_module

from phasegate._terminal import visible
from phasegate.cli._app import app

# Each group registers its commands on import; this order is --help's order.
for _group in ("setup", "workflows", "proposals", "demo"):
    import_module(f"phasegate.cli.{_group}")

__all__ = ["app", "main"]


class _VisibleFormatter(logging.Formatter):
    """Log lines quote agents and git: their control characters are shown, not sent."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def main() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    app()
