#!/usr/bin/env python3
"""Cut GitHub's OpenAPI description to the operations phasegate uses.

    python3 scripts/cut_openapi.py SRC DEST

SRC is ``@octokit/openapi``'s ``generated/api.github.com.json`` (``.ci/run``
installs it under ``.ci/node/node_modules``); DEST gets the listed operations
and every component they reference, transitively (Prism starts on the cut in
1.6 s, on the whole in 11-13 s). The logic and the operation list live in
``tests/support/github_openapi.py`` (standard library only), loaded
here by path, so this runs from a clean clone with nothing but Python.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_MODULE = Path(__file__).resolve().parent.parent / "tests" / "support" / "github_openapi.py"


def _cut_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_phasegate_github_openapi", _MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="api.github.com.json from @octokit/openapi")
    parser.add_argument("dest", type=Path, help="where to write the cut description")
    args = parser.parse_args(argv)
    cut = _cut_module()
    cut.cut_file(args.src, args.dest)
    print(f"{args.dest}: {len(cut.OPERATIONS)} operations, {args.dest.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
