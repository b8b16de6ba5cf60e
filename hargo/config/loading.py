"""Reading params.yaml: the YAML loader (YAML 1.2 floats), dotted-key access and per-run
overrides (``"rl.hargo.beta=0.04"``, as ``dvc exp run -S``; any field the typed config
declares, :func:`declared`). No value checks here: those are the typed config's
(:mod:`hargo.config`). Re-exported by :mod:`hargo.params`."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from hargo.param_values import ParamsError

__all__ = ["ParamsLoader", "get", "apply_overrides", "read_params_file", "declared"]


class _UniqueKeys:
    """A loader mixin: a key given twice in one mapping is a :class:`ParamsError`."""

    def construct_document(self, node):
        """Refuse duplicate keys anywhere in the document, then construct it as PyYAML does."""
        _refuse_duplicate_keys(node, "", getattr(self, "name", "<params>"), set())
        return super().construct_document(node)


class ParamsLoader(_UniqueKeys, yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's float syntax: PyYAML follows YAML 1.1, which reads
    ``1e-5`` and ``1e-05`` (what ``dvc exp run -S`` writes) as *strings*; here every float
    spelling YAML 1.2 allows (``1e-5``, ``1E-5``, ``1e-05``, ``.5``, ``5.0e-5``, ``+1.5``,
    ``.inf``, ``.nan``) is a float.

    A key given twice in one mapping is refused (:class:`ParamsError` naming the file, the line
    and the dotted key): PyYAML keeps the last one silently, while DVC's parser (ruamel.yaml)
    refuses the file, so the stages would run with a value ``dvc exp show`` never records.
    Merge keys (``<<: *anchor``) and the keys they bring in are not duplicates."""


_MERGE = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(node, path: str, where: str, seen: set) -> None:
    """Walk the composed YAML ``node``; raise at the first mapping that gives a key twice."""
    if id(node) in seen:                          # an alias met again
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                _refuse_duplicate_keys(value_node, path, where, seen)
                continue
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            dotted = f"{path}{name}"
            tag_name = (key_node.tag, name)
            if tag_name in first:
                at = "" if where.startswith("<") else \
                    f"{where}, line {key_node.start_mark.line + 1}: "     # a file, not a -S value
                raise ParamsError(
                    f"{at}duplicate key '{dotted}' (first on line {first[tag_name] + 1}); PyYAML "
                    "would keep the last one, DVC refuses it: keep one")
            first[tag_name] = key_node.start_mark.line
            _refuse_duplicate_keys(value_node, f"{dotted}.", where, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{path}{i}.", where, seen)


ParamsLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))

class _OverrideLoader(ParamsLoader):
    """The file's loader (:class:`ParamsLoader`: YAML 1.2 floats, a key given twice refused, as
    in ``-S 'rl.max_new_tokens={plp: 40, plp: 80}'``) for ``-S`` values, so that a value reads
    the same on the command line as in params.yaml (issue 42: ``-S register.resamples=2e3``
    was the string ``'2e3'`` under PyYAML's YAML 1.1, the number 2000.0 in the file)."""


def get(params: Mapping, dotted: str) -> Any:
    """Return ``params["a"]["b"]`` for ``dotted == "a.b"``.

    Raises:
        ParamsError: a key on the path is missing.
    """
    cur: Any = params
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(cur, Mapping) or key not in cur:
            raise ParamsError(f"{dotted}: missing (no key '{'.'.join(dotted.split('.')[:i + 1])}')")
        cur = cur[key]
    return cur


def apply_overrides(params: dict, overrides: Mapping[str, Any] | Iterable[str] | None) -> dict:
    """Return a copy of ``params`` with overrides applied.

    ``overrides`` is a mapping ``{"rl.method": "hargo"}`` or strings ``"rl.steps=8"`` whose values
    are parsed as YAML (so ``8`` is an int, ``[grpo, hargo]`` a list). A key may be one
    ``params`` has or any field the typed config declares (:func:`declared`: a knob left at its
    default, a method's block left out; the blocks on its path are added), so a typo fails
    instead of being silently ignored.

    Raises:
        ParamsError: an override names a key that params.yaml does not have and the config does
            not declare, or is malformed.
    """
    out = copy.deepcopy(params)
    if not overrides:
        return out
    if not isinstance(overrides, Mapping):
        parsed = {}
        for item in overrides:
            if "=" not in item:
                raise ParamsError(f"override '{item}': expected KEY=VALUE")
            k, v = item.split("=", 1)
            try:
                parsed[k.strip()] = yaml.load(v, Loader=_OverrideLoader)
            except ParamsError as e:
                raise ParamsError(f"override '{item}': {e}") from None
        overrides = parsed
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = out
        for i, key in enumerate(keys[:-1]):
            if not isinstance(cur.get(key), dict):
                if cur.get(key) is not None or not declared(keys[:i + 1]):
                    raise ParamsError(f"{dotted}: unknown parameter (no section "
                                      f"'{'.'.join(keys[:i + 1])}' in params.yaml)")
                cur[key] = {}             # a declared block params.yaml leaves out (or null)
            cur = cur[key]
        if keys[-1] not in cur and not declared(keys):
            raise ParamsError(f"{dotted}: unknown parameter (not in params.yaml)")
        cur[keys[-1]] = value
    return out


def declared(keys: str | list[str]) -> bool:
    """Whether the dotted key (``"rl.hargo.alpha"`` or its parts) names what the typed config
    declares: a section, a nested block or a knob of one (:class:`hargo.config.Config`'s
    dataclasses), a registered method's block or knob (``rl.<method>``, ``compare.<method>``),
    an entry of a per-task map (``rl.max_new_tokens.plp``: a task of either universe)."""
    import dataclasses

    from hargo.config import Config, registries

    parts = keys.split(".") if isinstance(keys, str) else list(keys)
    cls: Any = Config
    for i, key in enumerate(parts):
        if cls is None:
            return False
        f = next((f for f in dataclasses.fields(cls) if f.name == key
                  and f.metadata.get("kind") not in ("private", "method_blocks")), None)
        if f is None:                                 # a method's block of rl / compare
            m = (cls._dynamic({}) if hasattr(cls, "_dynamic") else {}).get(key)
            if m is None:
                return False
            cls = m.params_class
            continue
        meta = f.metadata
        if meta.get("kind") == "node":
            cls = meta["node"]
            continue
        rest = parts[i + 1:]
        if not rest:
            return True
        per_task = meta.get("kind") in ("task_map", "budget") or meta.get("item") is not None
        return per_task and len(rest) == 1 and rest[0] in (
            registries.task_names(False) + registries.task_names(True))
    return cls is not None


def read_params_file(path: str | Path = "params.yaml") -> dict:
    """``path`` read with :class:`ParamsLoader` (YAML 1.2 floats, no duplicate keys), not yet
    checked.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParamsError: a key given twice (file, line, dotted key), text that is not YAML (file,
            line and column of the first fault, 1-based) or not UTF-8, an empty file, or a top
            level that is not a mapping of sections.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    try:
        with path.open(encoding="utf-8") as f:
            params = yaml.load(f, Loader=ParamsLoader)
    except UnicodeDecodeError as e:
        raise ParamsError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(x) for x in (getattr(e, "context", None),
                                         getattr(e, "problem", None)) if x) or str(e)
        raise ParamsError(f"{path}{where}: not valid YAML ({what})") from None
    if params is None:
        raise ParamsError(f"{path}: empty (no sections; the committed params.yaml lists every "
                          "one)")
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level, got "
                          f"{type(params).__name__} {params!r:.80}")
    return params
