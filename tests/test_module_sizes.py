"""The house stays readable (issue 41, item 5): no module of hargo/ or flows/ over 450 lines and
no function over 80 (``end_lineno - lineno + 1`` of its ``def``, docstring and decorators'
lines after the ``def`` included). A module or function that grows past them is split along
what it does, not given an exception here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for pkg in ("hargo", "flows") for p in (ROOT / pkg).rglob("*.py"))


def sizes(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """The module's line count and ``(qualified name, lines)`` of each function in it."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child.end_lineno - child.lineno + 1))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(text, filename=str(path)), "")
    return len(text.splitlines()), found


@pytest.mark.fast
def test_sizes_measures_modules_and_nested_functions(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("class A:\n    def f(self):\n        def g():\n            return 1\n"
                 "        return g\n\n\ndef h():\n    pass\n")
    assert sizes(p) == (9, [("A.f", 4), ("A.f.g", 2), ("h", 2)])


@pytest.mark.fast
def test_no_module_over_450_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for path in _sources():
        n, fns = sizes(path)
        rel = path.relative_to(ROOT)
        if n > MAX_MODULE_LINES:
            long_modules.append(f"{rel}: {n} lines")
        long_functions += [f"{rel}::{name}: {k} lines" for name, k in fns
                           if k > MAX_FUNCTION_LINES]
    assert not long_modules and not long_functions, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function (split "
        "along what it does):\n" + "\n".join(long_modules + long_functions))
