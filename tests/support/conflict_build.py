"""What the forge conflict tests share: their build agent, and a merge through a resolution.

The build agent (``build_script``), in a conflict child's checkout (markers
in feature.txt), resolves them to ``BOTH`` lines (with ``allow``: only while
that file exists, else it leaves them); in development it writes the line its
ticket names. ``alpha_and_beta`` starts two workflows that will conflict;
``merged_through_child`` approves a conflicted workflow's merge
and sees it complete through the child that resolved the conflict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store

__all__ = ["BOTH", "alpha_and_beta", "build_script", "merged_through_child"]

#: feature.txt once its conflict is resolved.
BOTH = "alpha\nbeta\n"


def build_script(allow: Path | None = None) -> str:
    """The build agent's shell script (see the module docstring)."""
    resolve = "printf 'alpha\\nbeta\\n' > feature.txt"
    if allow is not None:
        resolve = f'if [ -e "{allow}" ]; then {resolve}; fi'
    return f"""prompt=$(cat)
if grep -q '^<<<<<<< ' feature.txt; then
  {resolve}
  echo resolved
  exit 0
fi
case "$prompt" in
  *"says alpha"*) echo alpha > feature.txt ;;
  *"says beta"*) echo beta > feature.txt ;;
  *) echo other > other.txt ;;
esac
echo built
"""


def alpha_and_beta(engine: Engine) -> tuple[str, str]:
    """Two workflows writing different lines into feature.txt (``alpha``, then
    ``beta``), each run until it waits for its merge."""
    a = engine.start("alpha", "feature.txt says alpha")
    b = engine.start("beta", "feature.txt says beta")
    for wf in (a, b):
        row = engine.advance(wf)
        assert row["status"] == "waiting", row["error"]
    return a, b


def merged_through_child(engine: Engine, store: Store, workflow_id: str) -> tuple[Any, Any]:
    """``workflow_id``'s merge approved and run: it completes, through one child
    workflow that resolved feature.txt's conflict. Its row and the child's."""
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "test"))
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    (child,) = store.child_workflows(workflow_id)
    assert (child["status"], child["state"]["conflicted"]) == ("completed", ["feature.txt"])
    return row, child
