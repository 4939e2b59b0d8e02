"""The stand-in agent ``phasegate init`` writes when it finds none: a script answering by rule.

The script lives in the repository's ``.phasegate/`` folder, which ``init``
adds to git's ``info/exclude``: it is never committed by accident and never
part of a change an agent makes, so it is no governance path. The cartridge
binds every role to it through the ``command`` runner by its absolute path,
so it runs the same in a workflow's worktree, in the verifier's checkout of
the merge commit and in a dry run's clone. It needs only a POSIX shell,
``sed``, ``grep``, ``awk``, ``tail`` and, in graph mode, ``mktemp`` and
``diff``; it reads what the sandbox leaves readable and writes only its
worktree (in graph mode, only a temporary file).
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["SAMPLE_AGENT_FILE", "SAMPLE_AGENT_NAME", "SCRIPT", "sample_command", "write_sample"]

#: Where the script goes, relative to the repository root.
SAMPLE_AGENT_FILE = ".phasegate/sample-agent.sh"

#: The agent profile (``[agents.NAME]``) the cartridge binds every role to.
SAMPLE_AGENT_NAME = "sample"

#: The script's text: what each role answers (what it is given: docs/runners.md).
SCRIPT = r"""#!/bin/sh
# phasegate's sample agent: a stand-in that answers every role by rule. It calls
# no model and spends nothing. `phasegate init` wrote it into .phasegate/, which
# git ignores, and bound every role to it ([agents.sample] in phasegate.toml).
#
# phasegate runs it with the command runner: in the workflow's worktree (the
# verifier in a checkout of the merge commit), the prompt on stdin and in the
# file $PHASEGATE_PROMPT_FILE, the role in $PHASEGATE_ROLE. What it prints on
# stdout is the answer. What it is given: docs/runners.md, "The command runner".

cat > /dev/null   # the prompt; the same text is in $PHASEGATE_PROMPT_FILE
title=$(sed -n 's/^## Ticket: //p' "$PHASEGATE_PROMPT_FILE" | head -n 1)
# Graph mode's prompts have a section `## Ticket`: its first line is the title.
[ -n "$title" ] || title=$(awk 'seen && NF { print; exit } /^## Ticket$/ { seen = 1 }' \
  "$PHASEGATE_PROMPT_FILE")
title=${title:-the ticket}

# What it was given goes to stderr, which `phasegate events ID` shows.
grep '^## ' "$PHASEGATE_PROMPT_FILE" >&2
env | grep '^PHASEGATE_[A-Z_]*=' | grep -v '^PHASEGATE_PROMPT=' | sort >&2

# NOTES.md ($1) with the line added: on a line of its own, whatever the file's end.
with_line() {
  if [ -s "$1" ]; then
    cat "$1"
    [ -z "$(tail -c 1 "$1")" ] || echo
  fi
  printf '%s\n' "$line"
}

line="- $title (phasegate workflow $PHASEGATE_WORKFLOW_ID)"
case "$PHASEGATE_ROLE" in
  plan)
    printf '%s\n' "1. Add one line to NOTES.md naming the ticket: $title." ;;
  build)
    if [ "$PHASEGATE_READ_ONLY" = 1 ]; then
      # Graph mode: the build writes nothing and answers with a diff phasegate applies.
      new=$(mktemp)
      old=/dev/null; from=/dev/null
      if [ -f NOTES.md ]; then old=NOTES.md; from=a/NOTES.md; fi
      with_line "$old" > "$new"
      echo "Adds a line to NOTES.md."
      echo '```diff'
      diff -u --label "$from" --label b/NOTES.md "$old" "$new"
      echo '```'
      rm -f "$new"
    else
      # The only role that may write: phasegate commits what it changed.
      if [ -s NOTES.md ] && [ -n "$(tail -c 1 NOTES.md)" ]; then echo >> NOTES.md; fi
      printf '%s\n' "$line" >> NOTES.md
      echo "Added a line to NOTES.md."
    fi ;;
  plan_review|review)
    echo "The sample agent approves whatever it is shown."
    echo "VERDICT: approve" ;;
  verification)
    if [ -f NOTES.md ]; then
      echo "NOTES.md is on the merge commit."
      echo "VERDICT: confirmed"
    else
      echo "NOTES.md is not on the merge commit."
      echo "VERDICT: indeterminate"
    fi ;;
  *)
    echo "the sample agent has no answer for the role $PHASEGATE_ROLE" >&2
    exit 1 ;;
esac
"""


def sample_command(root: Path) -> str:
    """The ``command`` that runs the script of the repository at ``root``: ``sh`` and the
    script's absolute path, quoted for the shell (a path with spaces works)."""
    return f"sh {shlex.quote(str(root.resolve() / SAMPLE_AGENT_FILE))}"


def write_sample(root: Path) -> Path:
    """Write the script into ``root``'s ``.phasegate/`` (made if missing), replacing
    one there; returns its path. Raises OSError when it cannot be written."""
    path = root / SAMPLE_AGENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT, encoding="utf-8")
    path.chmod(0o755)
    return path
