"""Start the fake GitHub for a person: try phasegate's GitHub mode on this machine.

    python tests/support/fake_github.py [--port 8123] [--repo-dir D] [--repo OWNER/NAME]
    (or, from tests/: python -m support.fake_github ...)

It serves the REST API and git over HTTP on 127.0.0.1 (``GitHubServer``), holds
one repository seeded from the checkout ``--repo-dir`` (its branches and tags;
without it, a first commit with a README), owned by a maintainer (admin), with
``phasegate-bot`` as the collaborator phasegate acts as (write). It prints the
API URL, both tokens and the ``[forge]`` table that points phasegate at it, then
serves until Ctrl-C; everything is forgotten then. docs/github-offline.md walks
through a workflow with it. Needs the environment phasegate's tests run in
(FastAPI, uvicorn, git).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

if __package__ in (None, ""):  # run as a file: ``support`` is a package of tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.github_server import GitHubServer  # noqa: E402  (after the path above)

__all__ = ["BOT", "DEFAULT_PORT", "forge_table", "main"]

#: The port a person's cartridge can name before the server starts.
DEFAULT_PORT = 8123
#: The login phasegate acts as (its token goes in GITHUB_TOKEN).
BOT = "phasegate-bot"


def forge_table(url: str, repository: str) -> str:
    """The cartridge's ``[forge]`` table for phasegate on the fake at ``url``."""
    return (
        "[forge]\n"
        'kind = "github"\n'
        f'repository = "{repository}"\n'
        f'base_url = "{url}"\n'
        'token_env = "GITHUB_TOKEN"\n'
        "poll_s = 2\n"
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fake_github", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="Port on 127.0.0.1 (0: a free one)."
    )
    parser.add_argument(
        "--repo-dir", type=Path, help="A git checkout whose branches seed the repository."
    )
    parser.add_argument(
        "--repo", help="OWNER/NAME (default: maya/ and the --repo-dir's name, else maya/app)."
    )
    parser.add_argument(
        "--root", type=Path, help="Where the bare repositories live (default: a temp dir)."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    repo_dir = args.repo_dir.resolve() if args.repo_dir else None
    if repo_dir is not None and not (repo_dir / ".git").exists():
        print(f"error: {repo_dir} is not a git checkout", file=sys.stderr)
        return 2
    repository = args.repo or f"maya/{repo_dir.name if repo_dir else 'app'}"
    owner, _, name = repository.partition("/")
    if not owner or not name or "/" in name:
        print(f"error: --repo {repository!r} is not OWNER/NAME", file=sys.stderr)
        return 2
    gh = GitHubServer(root=args.root.resolve() if args.root else None)
    try:
        url = gh.start(args.port)
    except OSError as exc:
        print(f"error: cannot serve on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        maintainer = gh.add_user(owner)
        bot = gh.add_user(BOT)
        gh.create_repo(owner, name, from_path=repo_dir, auto_init=repo_dir is None)
        gh.grant(repository, BOT, "write")
        _say(url, repository, maintainer.token, bot.token)
        stop.wait()
    finally:
        gh.stop()
    return 0


def _say(url: str, repository: str, maintainer_token: str, bot_token: str) -> None:
    owner = repository.partition("/")[0]
    print(
        f"fake GitHub serving at {url} (Ctrl-C stops it and forgets everything)\n"
        f"\n"
        f"repository  {repository}  (git: {url}/git/{repository}.git)\n"
        f"maintainer  {owner} (admin), token {maintainer_token}\n"
        f"phasegate   {BOT} (write), token {bot_token}\n"
        f"\n"
        f"In phasegate.toml (committed):\n\n{forge_table(url, repository)}\n"
        f"In the shell that runs phasegate, and for curl as {owner}:\n\n"
        f"export GITHUB_TOKEN={bot_token}\n"
        f"export MAINTAINER_TOKEN={maintainer_token}\n"
        f"export API={url}/repos/{repository}\n",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
