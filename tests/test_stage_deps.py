"""Every DVC stage depends on the code that computes its outputs: for each stage of dvc.yaml and
compare/dvc.yaml, the hargo modules its ``hargo <command>`` imports (read statically, function-
level imports included, transitively) are each covered by one of the stage's ``deps`` (the file,
or a folder above it). A module missing there would let DVC call a stage up to date after the code
that computes its result changed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

#: Modules whose code does not decide what a stage computes, so no stage lists them (they are
#: leaves here: their own imports are not followed).
RESULT_NEUTRAL = {
    "hargo/io.py": "file primitives (atomic writes, JSONL reading): how outputs are written",
    "hargo/tracking.py": "MLflow logging only",
    "hargo/tracking_store.py": "checks and re-roots the MLflow store; logs nothing a stage reads",
    "hargo/tracking_db.py": "checks the MLflow store's SQLite file, as hargo/tracking_store.py",
    "hargo/stage_inputs.py": "notes what a stage read at its start and fails it if that changed; "
                             "changes no result",
    "hargo/code_home.py": "checks that the CLI runs the project's own code",
    "hargo/params.py": "loading and validating params.yaml; the values are the stages' DVC "
                       "params, and the `params` stage re-validates on any change",
    "hargo/param_values.py": "the params checks' error type and number parsing",
    "hargo/config/loading.py": "reading params.yaml (YAML loader, overrides), as hargo/params.py",
    "hargo/config/registries.py": "the typed config's look-ups of the method and task registries "
                                  "(which keys exist); a stage that runs a method or task lists "
                                  "hargo/methods or hargo/tasks itself",
    "hargo/offline.py": "keeps the model hub offline; a hub request fails instead of connecting",
    "hargo/console.py": "how library warnings are shown on the console",
    "hargo/diskspace.py": "the message for a full disk",
}


#: Packages that import every module of their own folder when first queried (a registry that
#: discovers its plug-ins with pkgutil): importing one imports them all.
DISCOVERING = {"hargo.methods": "hargo/methods/__init__.py: one module per method, found by "
                                "pkgutil.iter_modules"}


def _module_file(name: str) -> Path | None:
    p = ROOT.joinpath(*name.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) \
                == "TYPE_CHECKING":
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def _imports(path: Path, type_checking: bool = False) -> set[str]:
    """The hargo modules ``path`` imports when it runs (``if TYPE_CHECKING:`` blocks left out,
    unless ``type_checking``: then those count too)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if type_checking else _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "hargo"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "hargo":
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names
                    if _module_file(f"{node.module}.{a.name}")}
    return out


def _docstring_only(path: Path) -> bool:
    """A package ``__init__`` with nothing but a docstring (and ``__version__``)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
               or isinstance(n, ast.Assign) and [t.id for t in n.targets
                                                 if isinstance(t, ast.Name)] == ["__version__"]
               for n in body)


def code_closure(modules: set[str]) -> set[str]:
    """Repository-relative files of ``modules`` and of every hargo module they import,
    transitively (parent packages included), less :data:`RESULT_NEUTRAL` and docstring-only
    package ``__init__`` files."""
    seen, todo, files = set(), list(modules), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if rel in RESULT_NEUTRAL:
            continue
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(path))
        if name in DISCOVERING:
            todo.extend(f"{name}.{p.stem}" for p in sorted(path.parent.glob("*.py"))
                        if not p.name.startswith("_"))   # as hargo.plugins.discover
        if not (path.name == "__init__.py" and _docstring_only(path)):
            files.add(rel)
    return files


def _command_modules(command: str) -> set[str]:
    """The modules hargo/cli.py's ``command`` imports in its body."""
    cli = (ROOT / "hargo" / "cli.py").read_text(encoding="utf-8")
    tree = ast.parse(cli)
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        names = [d for d in fn.decorator_list if isinstance(d, ast.Call) and d.args]
        cmd = names[0].args[0].value if names else fn.name.replace("_", "-")
        if cmd == command:
            out = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module.startswith("hargo"):
                    out |= {f"{node.module}.{a.name}" if _module_file(f"{node.module}.{a.name}")
                            else node.module for a in node.names}
            return out
    raise AssertionError(f"hargo/cli.py has no command {command!r}")


def _stages():
    for dvc_yaml in ("dvc.yaml", "compare/dvc.yaml", "synthetic/dvc.yaml"):
        for name, spec in yaml.safe_load((ROOT / dvc_yaml).read_text())["stages"].items():
            yield pytest.param(dvc_yaml, name, spec.get("do", spec), id=f"{dvc_yaml}:{name}")


@pytest.mark.parametrize("dvc_yaml, name, spec", list(_stages()))
def test_stage_depends_on_the_code_it_runs(dvc_yaml, name, spec):
    command = re.match(r"hargo ([\w-]+)", spec["cmd"]).group(1)
    modules = _command_modules(command)
    assert modules, f"{dvc_yaml}:{name}: no hargo module found for `hargo {command}`"
    deps = [d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])]
    missing = sorted(f for f in code_closure(modules)
                     if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
    assert not missing, f"{dvc_yaml}:{name} runs code it does not depend on: {missing}"


def test_the_closure_follows_function_level_imports():
    # evaluate imports the judges inside a function; the closure must still reach them
    files = code_closure({"hargo.evaluation.evaluate"})
    assert {"hargo/judges.py", "hargo/metrics.py", "hargo/rewards/plp.py"} <= files
    assert "hargo/io.py" not in files and "hargo/evaluation/__init__.py" not in files


@pytest.mark.parametrize("dvc_yaml, name, spec", list(_stages()))
def test_stage_runs_after_the_params_check(dvc_yaml, name, spec):
    """Every stage but ``params`` itself depends on its stamp, so DVC validates params.yaml
    before it deletes any stage's outputs (tests/test_dvc_stages.py shows why)."""
    from hargo.params import CHECKED_STAMP
    from hargo.resolved_params import METHOD_PARAMS_DIR

    deps = [d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])]
    if name == "params":
        # persist: kept when the check fails; cached (not in git): test below
        assert spec["outs"] == [{CHECKED_STAMP: {"persist": True}},
                                {str(METHOD_PARAMS_DIR): {"persist": True}}]
    else:
        assert CHECKED_STAMP in deps, f"{dvc_yaml}:{name} can run before params.yaml is checked"


def _outputs(spec: dict) -> list[tuple[str, dict]]:
    """A stage's outputs (``outs``, ``metrics``, ``plots``) as ``(path, options)``."""
    found = []
    for key in ("outs", "metrics", "plots"):
        for x in spec.get(key, []):
            path, opts = (x, {}) if isinstance(x, str) else next(iter(x.items()))
            found.append((path, opts or {}))
    return found


@pytest.mark.parametrize("dvc_yaml, name, spec", list(_stages()))
def test_every_output_is_in_git_or_in_the_cache(dvc_yaml, name, spec):
    """Issue 42 item 2: ``dvc exp run --queue -S register.tolerance=0.01`` re-trained both RL
    models and re-evaluated. DVC's temporary workspace is a git checkout plus the DVC cache; an
    output declared ``cache: false`` that .gitignore keeps out of git (checkpoints/rl/<method>,
    reports/validation, reports/eval/*) was missing there, so its stage looked changed. Every
    ``cache: false`` output is one git tracks (not ignored), and so is every output a fresh clone
    has after ``dvc pull``."""
    import subprocess

    wdir = ROOT / Path(dvc_yaml).parent / spec.get("wdir", ".")
    for path, opts in _outputs(spec):
        if opts.get("cache", True):
            continue
        rel = (wdir / path.replace("${item}", "x").replace("${item.method}", "x")
               .replace("${item.seed}", "1")).resolve().relative_to(ROOT)
        ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", str(rel)],
                                 cwd=ROOT, capture_output=True, timeout=60)
        assert ignored.returncode == 1, (
            f"{dvc_yaml}:{name}: {path} is `cache: false` but .gitignore keeps it out of git "
            f"(git check-ignore rc {ignored.returncode}): DVC's temporary workspace lacks it")


def _module_graph(type_checking: bool = False) -> dict[Path, set[Path]]:
    """Every hargo module file -> the hargo module files it imports (function-level imports
    included, and those under ``if TYPE_CHECKING:`` when ``type_checking``; an import of one of
    its own parent packages is not an edge)."""
    graph = {}
    for path in sorted((ROOT / "hargo").rglob("*.py")):
        targets = {_module_file(n) for n in _imports(path, type_checking)}
        # a package is imported before its submodules anyway: a reference back to it is no edge
        ancestors = {q / "__init__.py" for q in path.parents}
        graph[path] = {t for t in targets if t is not None and t != path and t not in ancestors}
    return graph


def _cycle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    """One import cycle of ``graph`` (its files in order), or None."""
    state: dict[Path, int] = {}          # 1: on the current path, 2: done
    stack: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    a, b, c = Path("a.py"), Path("b.py"), Path("c.py")
    assert _cycle({a: {b}, b: {c}, c: set()}) is None
    assert _cycle({a: {b}, b: {c}, c: {a}}) == [a, b, c, a]


def test_no_import_cycle_in_hargo():
    """Lazy (function-level) imports count: a cycle hidden in a function is still a cycle."""
    found = _cycle(_module_graph())
    assert found is None, " -> ".join(str(p.relative_to(ROOT)) for p in found)


def test_no_import_cycle_in_hargo_counting_type_checking_imports():
    """An import under ``if TYPE_CHECKING:`` is an arrow too: a helper that annotates its argument
    with the class that imports it is a method in disguise (the circle grpo.py -> reference.py /
    task_diagnostics.py -> grpo.py that was here). Lazy imports count as above."""
    found = _cycle(_module_graph(type_checking=True))
    assert found is None, " -> ".join(str(p.relative_to(ROOT)) for p in found)


def test_type_checking_imports_are_edges_when_counted(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from hargo.training.grpo import HargoGRPOTrainer\n")
    assert _imports(src) == set()
    assert "hargo.training.grpo" in _imports(src, type_checking=True)


#: Packages/modules that compute (lower) never import those that run stages (higher).
LOWER = ("data", "models", "rewards", "losses", "advantages.py", "metrics.py", "judges.py",
         "evaluation", "vocab.py", "param_values.py", "gate.py", "methods", "method_config.py")
HIGHER = ("training", "compare", "registry.py", "cli.py", "summary.py", "gpu_check")


def test_lower_layers_never_import_the_stages_above_them():
    """e.g. evaluation loads models through hargo.models, not hargo.training."""
    def under(path: Path, names) -> bool:
        rel = path.relative_to(ROOT / "hargo").parts
        return rel[0] in names

    upward = [f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}"
              for src, dsts in _module_graph().items() if under(src, LOWER)
              for dst in dsts if under(dst, HIGHER)]
    assert upward == []
