"""One config object (issue 41, item 4): every stage that hargo/cli.py's commands run takes the
typed :class:`hargo.config.Config`, never the params mapping. Read statically (AST, no import of
the stages, no torch): each command's ``_run(<stage>, <the config>, ...)`` is resolved through
the command's own imports to the function's definition, whose first parameter must be annotated
``Config`` and none of whose parameters may be annotated as a mapping or a dict. A ratchet keeps
the helpers that still take ``Config | Mapping`` from growing in number."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "hargo" / "cli.py"

#: The stages the CLI must be found to run (a command renamed or dropped fails the test, so
#: the reader below cannot silently stop seeing a stage).
STAGES = {"prepare", "validate", "base-model", "sft", "rl", "evaluate", "register",
          "preferences", "compare-train", "compare-eval", "report", "summary",
          "synthetic-data", "synthetic-sft", "synthetic-rl", "synthetic-report"}

#: Signatures of hargo/ and flows/ that still take ``Config | Mapping`` (helpers below the
#: stages; see docs/parameters.md "The typed config"): the number may only go down.
MAPPING_SIGNATURES_AT_MOST = 21


def _command_name(fn: ast.FunctionDef) -> str | None:
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) \
                and d.func.attr == "command":
            if d.args and isinstance(d.args[0], ast.Constant):
                return d.args[0].value
            return fn.name
    return None


def _imports(fn: ast.FunctionDef) -> dict[str, tuple[str, str | None]]:
    """local name -> (module, attribute or None for a module) of the imports in ``fn``."""
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                out[a.asname or a.name] = (node.module, a.name)
    return out


def _config_names(fn: ast.FunctionDef) -> set[str]:
    """The local names bound to the command's config (``p = _params(params, set_)``)."""
    return {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "_params"
            for t in node.targets if isinstance(t, ast.Name)}


def _is_config(arg: ast.expr, names: set[str]) -> bool:
    return (isinstance(arg, ast.Call) and getattr(arg.func, "id", "") == "_params") or \
        (isinstance(arg, ast.Name) and arg.id in names)


def _stage_calls() -> dict[str, tuple[str, str]]:
    """command -> (module, function) of each ``_run(stage, <config>, ...)`` in hargo/cli.py."""
    out = {}
    for fn in ast.parse(CLI.read_text()).body:
        if not isinstance(fn, ast.FunctionDef) or _command_name(fn) is None:
            continue
        imports, names = _imports(fn), _config_names(fn)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_run"
                    and len(node.args) >= 2 and _is_config(node.args[1], names)):
                continue
            target = node.args[0]
            if isinstance(target, ast.Attribute):          # stage.run: a module imported as
                module, attr = imports[target.value.id]      # `from pkg import mod as stage`
                out[_command_name(fn)] = (f"{module}.{attr}", target.attr)
            else:                                          # a function imported by name
                module, attr = imports[target.id]
                out[_command_name(fn)] = (module, attr)
    return out


def _definition(module: str, name: str) -> ast.FunctionDef:
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{module}.{name}: no such function in {path}")


def _annotation(arg: ast.arg) -> str:
    a = arg.annotation
    if a is None:
        return ""
    return a.value if isinstance(a, ast.Constant) else ast.unparse(a)


def _mapping(text: str) -> bool:
    return any(w in text for w in ("Mapping", "dict", "Dict"))


def _params_like(arg: ast.arg) -> bool:
    """A parameter that carries the params: so named, or annotated with the config."""
    return arg.arg in ("params", "cfg", "config", "p") or "Config" in _annotation(arg)


def test_every_stage_entry_point_takes_the_typed_config():
    calls = _stage_calls()
    assert set(calls) >= STAGES, f"stages not found in hargo/cli.py: {STAGES - set(calls)}"
    bad = []
    for command, (module, name) in sorted(calls.items()):
        fn = _definition(module, name)
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        first = _annotation(args[0]) if args else ""
        if first != "Config":
            bad.append(f"{command}: {module}.{name}({args[0].arg if args else ''}: "
                       f"{first or 'no annotation'}) -- expected Config")
        bad += [f"{command}: {module}.{name}({a.arg}: {_annotation(a)}) -- a params mapping"
                for a in args if _params_like(a) and _mapping(_annotation(a))]
    assert not bad, "\n".join(bad)


def _mapping_signatures() -> list[str]:
    out = []
    for path in sorted([*(ROOT / "hargo").rglob("*.py"), *(ROOT / "flows").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                    text = _annotation(a).replace(" ", "")
                    if "Config" in text and ("Mapping" in text or "dict" in text):
                        out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return out


def test_helpers_taking_config_or_mapping_only_get_fewer():
    found = _mapping_signatures()
    assert len(found) <= MAPPING_SIGNATURES_AT_MOST, (
        f"{len(found)} signatures take `Config | Mapping` (at most {MAPPING_SIGNATURES_AT_MOST}):"
        " a new function takes the typed config or one of its sections\n" + "\n".join(found))


def test_the_reader_sees_a_planted_mapping():
    """The check is not vacuous: a stage annotated with a mapping is reported."""
    src = ("def run(params: 'Config | Mapping', records: list[dict], root='.'):\n    pass\n")
    fn = ast.parse(src).body[0]
    params, records = fn.args.args[:2]
    assert _annotation(params) == "Config | Mapping" and _mapping(_annotation(params))
    assert _params_like(params) and not _params_like(records)   # records of dicts: not params
    assert _stage_calls()["prepare"] == ("hargo.data.prepare", "run")
    assert _stage_calls()["synthetic-report"] == ("hargo.compare.synthetic_report", "report")
