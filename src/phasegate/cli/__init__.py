"""The ``phasegate`` command line (typer).

Exit codes: 0 done (completed, or waiting for a person: a merge approval in
wait, a proposal's approval in awaiting_approval); 1 the workflow
failed or paused; 2 bad input (cartridge, unknown workflow, illegal request);
130 stopped by Ctrl-C, SIGTERM or SIGHUP (the workflow stays resumable).
"""

import logging
import sys
from importlib import import_module

from phasegate.cli._app import app, json_error
from phasegate.core.terminal import visible

# Each group registers its commands on import; this order is --help's order. The
# groups' modules keep their annotations as objects (no `from __future__ import
# annotations`): typer reads every command's parameters at each start, and strings
# it would have to evaluate one by one.
for _group in (
    "setup",
    "workflows",
    "cleanup",
    "diff",
    "github",
    "proposals",
    "web",
    "users",
    "spending",
    "maintenance",
    "demo",
):
    import_module(f"phasegate.cli.{_group}")

__all__ = ["app", "log_handler", "main"]


class _VisibleFormatter(logging.Formatter):
    """Log lines quote agents and git: their control characters are shown, not sent."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def _not_utf8(argv: list[str]) -> str | None:
    """The first argument that is not UTF-8 text (Python carries its bytes as lone
    surrogates, which no store, prompt or forge can take), named, else None."""
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"argument {number} is not UTF-8 text (character {exc.start + 1})"
    return None


class _StderrHandler(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record comes."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def log_handler() -> logging.Handler:
    """The handler the console script logs through: ``LEVEL: message`` on standard
    error, control characters shown."""
    handler = _StderrHandler()
    handler.setFormatter(_VisibleFormatter("%(levelname)s: %(message)s"))
    return handler


def main() -> None:
    bad = _not_utf8(sys.argv[1:])
    if bad is not None:
        print(f"error: {bad}", file=sys.stderr)
        if "--json" in sys.argv[1:]:
            json_error(bad, "UsageError")
        raise SystemExit(2)
    logging.basicConfig(level=logging.WARNING, handlers=[log_handler()])
    app()
