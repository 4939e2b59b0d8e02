"""The build agent the forge conflict tests script: feature.txt's conflict resolved to both lines.

In a conflict child's checkout (markers in feature.txt) it resolves them to
``BOTH`` lines (with ``allow``: only while that file exists, else it leaves
them); in development it writes the line its ticket names.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BOTH", "build_script"]

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
