#!/usr/bin/env python3
"""Cut GitLab's OpenAPI description to the operations phasegate's GitLab forge uses.

    python3 scripts/cut_gitlab_openapi.py SRC [DEST] --commit SHA [--source-url URL]

SRC is GitLab's ``doc/api/openapi/openapi_v3.yaml`` (or a JSON copy), taken
from its repository at commit SHA; DEST (default
``tests/data/gitlab-openapi-cut.json``) gets the listed operations the file
has, every component they reference, and a header naming the source URL,
the commit and the operations it lacks. The logic and the operation list
live in ``tests/support/gitlab_openapi.py``; commit DEST.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(_TESTS))
    from support import gitlab_openapi

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="openapi_v3.yaml from GitLab's repository")
    parser.add_argument("dest", type=Path, nargs="?", default=gitlab_openapi.CUT_PATH)
    parser.add_argument("--commit", required=True, help="the commit SRC was taken from")
    parser.add_argument("--source-url", default=gitlab_openapi.SOURCE_URL)
    args = parser.parse_args(argv)
    cut = gitlab_openapi.cut_file(
        args.src, args.dest, provenance={"source": args.source_url, "commit": args.commit}
    )
    header = cut["info"]["x-phasegate-cut"]
    print(
        f"{args.dest}: {len(header['operations'])} operations, "
        f"{args.dest.stat().st_size} bytes; missing: {header['missing'] or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
