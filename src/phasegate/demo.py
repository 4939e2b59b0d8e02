"""``phasegate demo``: a sample project, a ticket, scripted agents, the whole lifecycle.

The sample is a tiny Python package with unittest tests (no third-party
dependency, so the checks run wherever phasegate runs). The agents are the
scripted runner: the planner's first plan is sent back once, the builder
writes the change and its test, the reviewer and the verifier approve.
"""

from __future__ import annotations

import shlex
import sys
import tomllib
from pathlib import Path

from phasegate.workspace import git

__all__ = ["DEMO_TICKET", "DEMO_TITLE", "make_sample_project"]

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


def make_sample_project(path: Path) -> Path:
    """Create the sample repository at ``path`` (a git repo on ``main``); return it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "calc").mkdir(exist_ok=True)
    (path / "tests").mkdir(exist_ok=True)
    (path / "calc" / "__init__.py").write_text(_CALC, encoding="utf-8")
    (path / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (path / "tests" / "test_calc.py").write_text(_TESTS, encoding="utf-8")
    (path / "README.md").write_text("# calc\n\nSmall arithmetic helpers.\n", encoding="utf-8")
    (path / "demo-answers.toml").write_text(_answers(), encoding="utf-8")
    tomllib.loads((path / "demo-answers.toml").read_text(encoding="utf-8"))  # fail early
    (path / "phasegate.toml").write_text(_cartridge(shlex.quote(sys.executable)), encoding="utf-8")
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
