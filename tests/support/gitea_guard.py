"""Branch protection on push for the fake Gitea: a pre-receive hook in each bare repository.

Gitea checks a push against the branch's protection before it lands
(``routers/private/hook_pre_receive.go``); so does the fake, with a
``pre-receive`` hook ``install`` writes beside the rules it reads
(``fake-gitea-protection.json`` in the bare repository). ``git http-backend``
names the pusher in ``REMOTE_USER``. A protected branch takes no push unless
its rule has ``enable_push`` (and, with ``enable_push_whitelist``, the pusher
is listed), no force push unless ``enable_force_push``, and no deletion; the
refusal is Gitea's message, shown by git as ``remote: …``. The fake's own
merges write refs directly and are not held here: they were checked at merge.
"""

from __future__ import annotations

import json
import sys

from support.gitea_model import Repo

__all__ = ["RULES", "install"]

RULES = "fake-gitea-protection.json"

_HOOK = """#!{python}
import fnmatch, json, os, subprocess, sys

rules = json.load(open({rules!r}))
user = os.environ.get("REMOTE_USER", "")
zero = "0" * 40
refused = []
for line in sys.stdin:
    old, new, ref = line.split()
    if not ref.startswith("refs/heads/"):
        continue
    branch = ref[len("refs/heads/"):]
    exact = [r for r in rules if r["rule_name"] == branch]
    rule = (exact or [r for r in rules if fnmatch.fnmatchcase(branch, r["rule_name"])] or [None])[0]
    if rule is None:
        continue
    if new == zero:
        refused.append(f"branch {{branch}} is protected from deletion")
        continue
    listed = not rule["enable_push_whitelist"] or user in rule["push_whitelist_usernames"]
    if not (rule["enable_push"] and listed):
        refused.append(f"Not allowed to push to protected branch {{branch}}")
        continue
    forced = old != zero and subprocess.run(
        ["git", "merge-base", "--is-ancestor", old, new]).returncode != 0
    if forced and not rule["enable_force_push"]:
        refused.append(f"branch {{branch}} is protected from force push")
for message in refused:
    print(message, file=sys.stderr)
sys.exit(1 if refused else 0)
"""


def install(repo: Repo) -> None:
    """Write ``repo``'s protection rules and the hook that enforces them on push."""
    rules = [
        {
            "rule_name": p.rule_name,
            "enable_push": p.enable_push,
            "enable_push_whitelist": bool(p.options.get("enable_push_whitelist", False)),
            "push_whitelist_usernames": list(p.options.get("push_whitelist_usernames") or []),
            "enable_force_push": bool(p.options.get("enable_force_push", False)),
        }
        for p in repo.protections
    ]
    path = repo.bare.path
    (path / RULES).write_text(json.dumps(rules), encoding="utf-8")
    hook = path / "hooks" / "pre-receive"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(_HOOK.format(python=sys.executable, rules=str(path / RULES)), encoding="utf-8")
    hook.chmod(0o755)
