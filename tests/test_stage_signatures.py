"""One config object (issue 41, item 4): every stage that hargo/cli.py's commands run takes the
typed :class:`hargo.config.Config`, never the params mapping. Read statically (AST, no import of
the stages, no torch): each command's ``_run(<stage>, <the config>, ...)`` is resolved through
the command's own imports to the function's definition, whose first parameter must be annotated
``Config`` and none of whose parameters may be annotated as a mapping or a dict. Below the
stages, no function of hargo/ or flows/ takes the config *or* a mapping (``Config | Mapping``,
``Train | dict``, ...) but the converters of hargo/config/__init__.py, the one place a params
mapping becomes the typed config."""
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

#: The only functions of hargo/ and flows/ that take ``Config | Mapping``: the converters, where a
#: params mapping becomes the typed config or a section of it, and the one door back to the
#: mapping for logging and digests (``params_dict``); see docs/parameters.md "The typed config".
#: Every other helper takes the typed config or one of its sections.
CONVERTERS = {"hargo/config/__init__.py as_config", "hargo/config/__init__.py as_section",
              "hargo/config/__init__.py _section", "hargo/config/__init__.py params_dict"}


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


#: Annotation names of a mapping or a dict (``typing.Dict``, ``MutableMapping`` included).
MAPPING_NAMES = {"Mapping", "MutableMapping", "dict", "Dict"}


def _config_classes() -> set[str]:
    """``Config`` and the classes of its sections (``Train``, ``RL``, ``Synthetic`` ...), read
    from the annotations of ``class Config`` in hargo/config/__init__.py."""
    tree = ast.parse((ROOT / "hargo" / "config" / "__init__.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    names = {"Config"}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and not stmt.target.id.startswith("_"):
            names |= _names(stmt.annotation)
    return names - {"None", "int"}


def _names(annotation: ast.expr | str) -> set[str]:
    """The names an annotation mentions (``"Config | Mapping"`` -> {Config, Mapping};
    ``typing.Mapping[str, SyntheticConfig]`` -> {typing, Mapping, str, SyntheticConfig}), a
    string annotation parsed (``from __future__ import annotations`` or a quoted one)."""
    if isinstance(annotation, str):
        try:
            annotation = ast.parse(annotation, mode="eval").body
        except SyntaxError:
            return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _names(annotation.value)
    out = set()
    for n in ast.walk(annotation):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out |= _names(n.value)
    return out


def _takes_config_or_mapping(arg: ast.arg, config_names: set[str]) -> bool:
    """``arg`` is annotated with the config (or a section) and a mapping at once, by exact name
    (``Mapping[str, SyntheticConfig]`` is a mapping of something else, not the config)."""
    if arg.annotation is None:
        return False
    names = _names(arg.annotation)
    return bool(names & config_names) and bool(names & MAPPING_NAMES)


def _mapping_signatures() -> list[str]:
    """``path function`` of each function of hargo/ and flows/ (methods and nested functions
    included) with a parameter that takes the config or a mapping."""
    config_names = _config_classes()
    out = []
    for path in sorted([*(ROOT / "hargo").rglob("*.py"), *(ROOT / "flows").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                every = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                         *(a for a in (args.vararg, args.kwarg) if a is not None)]
                if any(_takes_config_or_mapping(a, config_names) for a in every):
                    out.append(f"{path.relative_to(ROOT)} {node.name}")
    return out


def test_only_the_converters_take_config_or_mapping():
    """Helpers take the typed config or a section; a mapping becomes a Config only in the
    converters, which must still be there (a renamed one would leave this exemption stale)."""
    found = set(_mapping_signatures())
    others = sorted(found - CONVERTERS)
    assert not others, ("these take `Config | Mapping`; take the typed config or one of its "
                        "sections (a caller with a params mapping converts it once, "
                        "hargo.config.as_config):\n" + "\n".join(others))
    assert CONVERTERS <= found, f"converters not found: {sorted(CONVERTERS - found)}"


def test_the_reader_sees_a_planted_mapping():
    """The check is not vacuous: a stage annotated with a mapping is reported."""
    src = ("def run(params: 'Config | Mapping', records: list[dict], root='.'):\n    pass\n")
    fn = ast.parse(src).body[0]
    params, records = fn.args.args[:2]
    assert _annotation(params) == "Config | Mapping" and _mapping(_annotation(params))
    assert _params_like(params) and not _params_like(records)   # records of dicts: not params
    assert _stage_calls()["prepare"] == ("hargo.data.prepare", "run")
    assert _stage_calls()["synthetic-report"] == ("hargo.compare.synthetic_report", "report")


def test_the_signature_reader_counts_config_or_mapping_by_name():
    """What the converters' exemption is checked against: every spelling of "the config or a
    mapping" is seen (quoted, unquoted, ``Union``, a typed section, ``*args``), and a mapping of
    something else whose name merely contains "Config" is not."""
    config_names = _config_classes()
    assert {"Config", "Train", "RL", "Data", "Synthetic", "Compare"} <= config_names
    src = ("def f(a: 'Config | Mapping', b: Config | dict, c: Union[Config, Dict[str, Any]],\n"
           "      d: 'Train | Mapping | None', *e: 'typing.Mapping | Config',\n"
           "      g: Mapping[str, SyntheticConfig], h: 'Config', i: 'Train', j: dict,\n"
           "      k: 'Config | Train', **m: Mapping): pass\n")
    fn = ast.parse(src).body[0]
    every = [*fn.args.args, fn.args.vararg, *fn.args.kwonlyargs, fn.args.kwarg]
    seen = {a.arg for a in every if _takes_config_or_mapping(a, config_names)}
    assert seen == {"a", "b", "c", "d", "e"}
