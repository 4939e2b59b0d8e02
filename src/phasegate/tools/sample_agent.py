"""The stand-in agent ``phasegate init`` binds every role to when it finds none: it answers by rule.

phasegate runs it itself, as ``"$PHASEGATE_PYTHON" -P -m phasegate.tools.sample_agent``
on the ``command`` runner, which sets ``PHASEGATE_PYTHON`` to the Python running
phasegate. The cartridge therefore names no file and no path of one machine: a
clone, another machine, a workflow's worktree, the verifier's checkout of the
merge commit and a dry run's clone all run the same agent, the one installed with
phasegate. ``-P`` keeps the worktree off the import path, so a repository's own
``phasegate`` folder never stands in for it. It reads the prompt file the runner
names and the worktree, and writes only the worktree's ``NOTES.md`` (the build
role, outside graph mode); it calls no model and spends nothing.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "SAMPLE_AGENT_NAME",
    "SAMPLE_COMMAND",
    "answer",
    "is_sample_command",
    "main",
    "stand_in_notes",
]

#: The agent profile (``[agents.NAME]``) the cartridge binds every role to.
SAMPLE_AGENT_NAME = "sample"

#: The ``command`` that runs it: the runner's Python, this module (docs/runners.md).
SAMPLE_COMMAND = '"$PHASEGATE_PYTHON" -P -m phasegate.tools.sample_agent'

_NOTES = "NOTES.md"
# What an older init bound every role to: a script in one checkout's ignored folder.
_OLD_SCRIPT = ".phasegate/sample-agent.sh"


def is_sample_command(command: str | None) -> bool:
    """Whether a ``command`` role's command runs this stand-in (spaces aside)."""
    return command is not None and "-m phasegate.tools.sample_agent" in " ".join(command.split())


def stand_in_notes(
    bindings: Mapping[str, object], root: Path, missing: list[str], warnings: list[str]
) -> None:
    """Doctor's word on the roles (of role name → binding) that run this stand-in (a
    warning), and on those running the script an older ``init`` wrote into one
    checkout's ignored ``.phasegate/``: missing when ``root`` lacks it (a clone), a
    warning when it is there. A binding without ``command`` runs neither."""
    commands = {n: str(getattr(b, "command", None) or "") for n, b in bindings.items()}
    roles = [n for n, command in commands.items() if is_sample_command(command)]
    if roles:
        warnings.append(
            f"{', '.join(roles)}: bound to the stand-in sample agent (it answers by rule and "
            f"calls no model); bind a real agent in [agents.{SAMPLE_AGENT_NAME}] or "
            "[roles.NAME] (docs/runners.md)"
        )
    old = [n for n, command in commands.items() if _OLD_SCRIPT in command]
    if old:
        said = "a file no clone has" + ("" if (root / _OLD_SCRIPT).is_file() else ", nor this one")
        (warnings if (root / _OLD_SCRIPT).is_file() else missing).append(
            f"{', '.join(old)}: the command runs an older init's {_OLD_SCRIPT}, {said}: set "
            f"command = '{SAMPLE_COMMAND}' in [agents.{SAMPLE_AGENT_NAME}]"
        )


def _title(prompt: str) -> str:
    """The ticket's title: a ``## Ticket: TITLE`` line, else graph mode's ``## Ticket``
    section's first non-blank line, else "the ticket"."""
    found = re.search(r"^## Ticket: (.*)$", prompt, re.MULTILINE)
    if found and found.group(1).strip():
        return found.group(1).strip()
    section = re.search(r"^## Ticket[ \t]*\n(?:[ \t]*\n)*([^\n]*\S[^\n]*)", prompt, re.MULTILINE)
    return section.group(1).strip() if section else "the ticket"


def _with_line(old: str, line: str) -> str:
    """``old`` with ``line`` added on a line of its own, whatever the text's end."""
    if old and not old.endswith("\n"):
        old += "\n"
    return f"{old}{line}\n"


def _diff(old: str | None, new: str) -> str:
    """A unified diff from ``old`` (None: no file) to ``new``, as ``diff -u`` writes it,
    its "no newline at end of file" marker included."""
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        new.splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{_NOTES}",
        f"b/{_NOTES}",
    )
    # A last line without its newline gets one and git's marker saying so.
    return "".join(
        text if text.endswith("\n") else f"{text}\n\\ No newline at end of file\n" for text in lines
    )


def answer(role: str, prompt: str, workflow_id: str, read_only: bool, cwd: Path) -> str:
    """What the stand-in answers ``role`` given ``prompt``, in the worktree ``cwd``: a
    one-line plan, a line added to NOTES.md (a diff of it when ``read_only``),
    approvals, a verification confirmed when NOTES.md is there. The build role,
    outside ``read_only``, writes NOTES.md. Raises ValueError for a role it has no
    answer for, OSError when NOTES.md cannot be read or written."""
    title = _title(prompt)
    line = f"- {title} (phasegate workflow {workflow_id})"
    notes = cwd / _NOTES
    if role == "plan":
        return f"1. Add one line to {_NOTES} naming the ticket: {title}.\n"
    if role == "build" and read_only:
        # Graph mode: the build writes nothing and answers with a diff phasegate applies.
        old = notes.read_text(encoding="utf-8", errors="replace") if notes.is_file() else None
        diff = _diff(old, _with_line(old or "", line))
        return f"Adds a line to {_NOTES}.\n```diff\n{diff}```\n"
    if role == "build":
        # The only role that may write: phasegate commits what it changed.
        old_bytes = notes.read_bytes() if notes.is_file() else b""
        gap = b"\n" if old_bytes and not old_bytes.endswith(b"\n") else b""
        notes.write_bytes(old_bytes + gap + f"{line}\n".encode())
        return f"Added a line to {_NOTES}.\n"
    if role in ("plan_review", "review"):
        return "The sample agent approves whatever it is shown.\nVERDICT: approve\n"
    if role == "verification":
        if notes.is_file():
            return f"{_NOTES} is on the merge commit.\nVERDICT: confirmed\n"
        return f"{_NOTES} is not on the merge commit.\nVERDICT: indeterminate\n"
    raise ValueError(f"the sample agent has no answer for the role {role}")


def main() -> int:
    """Answer the role in ``PHASEGATE_ROLE`` on stdout; what it was given goes to stderr,
    which ``phasegate events ID`` shows. Exit code 1 for a role it has no answer for."""
    sys.stdin.read()  # the prompt; the same text is in PHASEGATE_PROMPT_FILE
    prompt = Path(os.environ["PHASEGATE_PROMPT_FILE"]).read_text(encoding="utf-8")
    for heading in re.findall(r"^## .*$", prompt, re.MULTILINE):
        print(heading, file=sys.stderr)
    for name in sorted(os.environ):
        if name.startswith("PHASEGATE_") and name != "PHASEGATE_PROMPT":
            print(f"{name}={os.environ[name]}", file=sys.stderr)
    try:
        text = answer(
            os.environ.get("PHASEGATE_ROLE", ""),
            prompt,
            os.environ.get("PHASEGATE_WORKFLOW_ID", ""),
            os.environ.get("PHASEGATE_READ_ONLY") == "1",
            Path.cwd(),
        )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
