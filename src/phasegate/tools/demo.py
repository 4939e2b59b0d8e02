"""``phasegate demo``: a sample project, a ticket, scripted agents, the whole lifecycle.

The sample is a tiny Python package with unittest tests (no third-party
dependency, so the checks run wherever phasegate runs). The agents are the
scripted runner: the planner's first plan is sent back once, the builder
writes the change and its test, the reviewer and the verifier approve.

With ``graph=True`` (``phasegate demo --graph``) the cartridge turns the
development graph on (``[graph] enabled = true``) and binds its optional
roles plan_alternative, plan_arbitrate, plan_adversary, review_adversary and
arbitrate (``[graph.review_tiers] default = 1``: the arbitrator decides when the
reviewer and the adversary disagree; here they agree), and the scripted answers play the
graph: two competing plans, the arbiter picking the first and naming its
price, the plan adversary sending it back once (the planner revises it), a
build answering with a unified diff (every graph role is read-only), the
reviewer approving and the adversary agreeing. The auto profile lets the
apply arm land the draft PR's patch once its checks passed in a scratch
worktree.
"""

from __future__ import annotations

import difflib
import shlex
import sys
import tomllib
from pathlib import Path

from phasegate.git.workspace import git

__all__ = ["DEMO_TICKET", "DEMO_TITLE", "build_patch", "make_sample_project"]

DEMO_TITLE = "Add multiply() to calc"
DEMO_TICKET = """calc has add() but no multiply(). Add `multiply(a, b)` returning the product
of its arguments, export it from the package, and cover it with a unit test.

Acceptance: `calc.multiply(6, 7) == 42` and the test suite passes."""

_CALC = '''"""calc: small arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    return a + b
'''

_CALC_AFTER = '''"""calc: small arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    return a + b


def multiply(a, b):
    """Return a * b."""
    return a * b
'''

_TESTS = """import unittest

import calc


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
"""

_TESTS_AFTER = _TESTS.replace(
    "\n\nif __name__",
    """

class MultiplyTest(unittest.TestCase):
    def test_multiply(self):
        self.assertEqual(calc.multiply(6, 7), 42)

    def test_multiply_by_zero(self):
        self.assertEqual(calc.multiply(5, 0), 0)


if __name__""",
)

_PLAN_1 = """1. Add `multiply(a, b)` to calc/__init__.py."""
_PLAN_2 = """1. Add `multiply(a, b)` to calc/__init__.py, next to add(), returning a * b.
2. Add MultiplyTest to tests/test_calc.py: 6 * 7 == 42 and a zero case.
3. Run the unittest suite."""


def _answers() -> str:
    def block(role: str, text: str, **extra: str) -> str:
        out = f"[[{role}]]\ntext = {_toml_str(text)}\ninput_tokens = 1200\noutput_tokens = 300\n"
        out += "cost_usd = 0.0042\n"
        if extra:
            out += f"[{role}.files]\n"
            out += "".join(f"{_toml_str(k)} = {_toml_str(v)}\n" for k, v in extra.items())
        return out + "\n"

    return "".join(
        [
            "# Scripted answers for `phasegate demo`: role -> answers in call order.\n\n",
            block("plan", _PLAN_1),
            block("plan", _PLAN_2),
            block(
                "plan_review", "The plan does not say how multiply() is tested.\nVERDICT: revise"
            ),
            block("plan_review", "Covers the function and its tests.\nVERDICT: approve"),
            block(
                "build",
                "Added multiply() and two tests.",
                **{"calc/__init__.py": _CALC_AFTER, "tests/test_calc.py": _TESTS_AFTER},
            ),
            block("review", "multiply() is correct and tested.\nVERDICT: approve"),
            block(
                "verification", "calc.multiply(6, 7) returns 42; tests pass.\nVERDICT: confirmed"
            ),
        ]
    )


def build_patch() -> str:
    """The demo's change as a unified diff (``a/``/``b/`` paths from the repository root),
    made from the sample's files before and after, so it always applies to them."""
    parts: list[str] = []
    for path, before, after in (
        ("calc/__init__.py", _CALC, _CALC_AFTER),
        ("tests/test_calc.py", _TESTS, _TESTS_AFTER),
    ):
        parts.extend(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )
    return "".join(parts)


_GRAPH_PLAN_ALTERNATIVE = """1. Add a variadic `product(*numbers)` to calc/__init__.py
   (functools.reduce over operator.mul, 1 for no argument) and define
   `multiply(a, b)` as `product(a, b)`.
2. Add ProductTest to tests/test_calc.py: product(), product(3), product(2, 3, 4)
   and multiply(6, 7) == 42.
3. Run the unittest suite."""

_GRAPH_ARBITER = """The first plan is the smallest change that meets the ticket; the second adds a
variadic product() the ticket does not ask for, and an API to keep.
CHOICE: first
PRICE: no product() of many numbers; a caller multiplying more than two loops over multiply()"""

_GRAPH_PLAN_ATTACK = """OBJECTION: step 1 adds multiply() but no step tests it; the ticket needs one
OBJECTION: no step says how the change is checked
VERDICT: revise"""


def _graph_answers() -> str:
    """The scripted answers of ``phasegate demo --graph``: every graph role, in call order."""

    def block(role: str, text: str) -> str:
        return (
            f"[[{role}]]\ntext = {_toml_str(text)}\ninput_tokens = 1200\noutput_tokens = 300\n"
            "cost_usd = 0.0042\n\n"
        )

    build = (
        "Added multiply(a, b) to calc next to add(), returning a * b, and MultiplyTest in\n"
        "tests/test_calc.py: 6 * 7 == 42 and a zero case. The unittest suite covers it.\n\n"
        f"```diff\n{build_patch()}```\n"
    )
    return "".join(
        [
            "# Scripted answers for `phasegate demo --graph`: role -> answers in call order.\n",
            "# Every graph role is read-only: the build answers with a unified diff.\n\n",
            block("plan", _PLAN_1),
            block("plan_alternative", _GRAPH_PLAN_ALTERNATIVE),
            block("plan_arbitrate", _GRAPH_ARBITER),
            block("plan_adversary", _GRAPH_PLAN_ATTACK),
            block("plan", _PLAN_2),  # the revision the plan adversary asked for
            block("build", build),
            block("review", "multiply() is correct, exported and tested.\nVERDICT: approve"),
            block(
                "review_adversary",
                "I looked for what the review missed: the zero case is tested, add() is\n"
                "untouched and nothing else changed. No objection stands.\nVERDICT: approve",
            ),
            block(
                "verification", "calc.multiply(6, 7) returns 42; tests pass.\nVERDICT: confirmed"
            ),
        ]
    )


def _toml_str(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _cartridge(python: str) -> str:
    roles = "".join(
        f'[roles.{role}]\nrunner = "scripted"\nscript = "demo-answers.toml"\ntimeout = 60\n\n'
        for role in ("plan", "plan_review", "build", "review", "verification")
    )
    return f"""# phasegate cartridge for the demo project.

[workflow]
base_branch = "main"
profile = "auto"            # merges without a person; `phasegate demo --profile review` waits
content_language = "en"

[landing_areas]
checks = [{_toml_str(f"{python} -m unittest discover -s tests -v")}]
check_timeout = 120

{roles}"""


#: The roles ``phasegate demo --graph`` binds: the graph's required ones, verification,
#: and the optional ones it plays (plan_review is not used in graph mode).
GRAPH_DEMO_ROLES = (
    "plan",
    "build",
    "review",
    "verification",
    "plan_alternative",
    "plan_arbitrate",
    "plan_adversary",
    "review_adversary",
    "arbitrate",
)


def _graph_cartridge(python: str) -> str:
    roles = "".join(
        f'[roles.{role}]\nrunner = "scripted"\nscript = "demo-answers.toml"\ntimeout = 60\n\n'
        for role in GRAPH_DEMO_ROLES
    )
    return f"""# phasegate cartridge for the demo project, in graph mode.

[workflow]
base_branch = "main"
profile = "auto"            # the apply arm lands the draft PR, merged without a person;
                            # `phasegate demo --graph --profile review` waits for approve
content_language = "en"

[landing_areas]
checks = [{_toml_str(f"{python} -m unittest discover -s tests -v")}]
check_timeout = 120

# planning, development and pr_review follow the development graph: competing
# plans, a plan adversary, a build that answers with a diff, review and adversary.
[graph]
enabled = true

[graph.review_tiers]
default = 1                 # every change: the reviewer, then the review adversary

{roles}"""


def make_sample_project(path: Path, *, graph: bool = False) -> Path:
    """Create the sample repository at ``path`` (a git repo on ``main``); return it.

    ``graph``: the cartridge runs the development graph, with scripted answers for it.
    """
    path.mkdir(parents=True, exist_ok=True)
    (path / "calc").mkdir(exist_ok=True)
    (path / "tests").mkdir(exist_ok=True)
    (path / "calc" / "__init__.py").write_text(_CALC, encoding="utf-8")
    (path / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (path / "tests" / "test_calc.py").write_text(_TESTS, encoding="utf-8")
    (path / "README.md").write_text("# calc\n\nSmall arithmetic helpers.\n", encoding="utf-8")
    answers, cartridge = (_graph_answers, _graph_cartridge) if graph else (_answers, _cartridge)
    (path / "demo-answers.toml").write_text(answers(), encoding="utf-8")
    tomllib.loads((path / "demo-answers.toml").read_text(encoding="utf-8"))  # fail early
    (path / "phasegate.toml").write_text(cartridge(shlex.quote(sys.executable)), encoding="utf-8")
    (path / ".gitignore").write_text(".phasegate/\n__pycache__/\n", encoding="utf-8")
    git(["init", "-q", "-b", "main"], path)
    git(["add", "-A"], path)
    git(
        [
            "-c",
            "user.name=phasegate demo",
            "-c",
            "user.email=demo@localhost",
            "commit",
            "-q",
            "-m",
            "calc: add()",
        ],
        path,
    )
    return path
