"""The path knobs of ``params.yaml`` against the paths the DVC pipelines declare.

A stage reads and writes where its params say; DVC tracks, caches, locks and deletes the paths
its ``dvc.yaml`` names. The two must agree: ``dvc exp run -S data.out_dir=data/prepared_v2``
used to pass ``check-params``, let ``prepare`` write the new folder, then fail because
``dvc.yaml`` declares ``data/prepared/...``, leaving an emptied ``data/prepared``, a stray new
folder and a changed ``dvc.lock`` (issue 42, item 7). The pipeline files are not templated from
these knobs (DVC would then track the interpolated values as params of every stage, and the
committed ``dvc.lock`` would go stale), so the ``params`` stage refuses a path knob whose value
differs from what its pipeline file declares, before any stage runs: :func:`check_pipeline_paths`.
To move an output, change the path in the pipeline file and in ``params.yaml`` together.

:data:`PATH_KNOBS` lists every path knob of the typed config (``tests/test_dvc_paths.py`` fails
on one that is missing) with the stage that declares it. ``model.source`` is not one: a hub id or
an input folder outside the pipeline, not a path DVC writes.
"""
from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from hargo.param_values import ParamsError

if TYPE_CHECKING:
    from hargo.config import Config

__all__ = ["PathKnob", "PATH_KNOBS", "check_pipeline_paths"]


class PathKnob(NamedTuple):
    """A path knob (its dotted ``key``) and where a pipeline file declares it: the ``stage`` of
    ``dvc_file`` lists ``form`` (the knob's value for ``{}``; DVC's own ``${...}`` left as
    written) among its ``deps`` or ``outs`` (``field``)."""
    key: str
    dvc_file: str
    stage: str
    field: str
    form: str


PATH_KNOBS: tuple[PathKnob, ...] = (
    PathKnob("data.raw_dir", "dvc.yaml", "prepare", "deps", "{}"),
    PathKnob("data.out_dir", "dvc.yaml", "prepare", "outs", "{}/train.jsonl"),
    PathKnob("validate.report_dir", "dvc.yaml", "validate", "outs", "{}"),
    PathKnob("validate.metrics_file", "dvc.yaml", "validate", "outs", "{}"),
    PathKnob("model.out_dir", "dvc.yaml", "base_model", "outs", "{}"),
    PathKnob("sft.out_dir", "dvc.yaml", "sft", "outs", "{}"),
    PathKnob("rl.out_dir", "dvc.yaml", "rl", "outs", "{}/${item}"),
    PathKnob("compare.out_dir", "compare/dvc.yaml", "compare_train", "outs",
             "{}/${item.method}-s${item.seed}"),
    PathKnob("compare.preferences.out_dir", "compare/dvc.yaml", "preferences", "outs", "{}"),
)


def _value(cfg: Any, key: str) -> Any:
    """The typed config's value at ``key`` (its default where params.yaml leaves it out); None
    under an absent optional section."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _declared(stage: Mapping, field: str) -> list[str]:
    """The paths a dvc.yaml stage lists under ``field`` (a ``foreach`` stage's ``do`` block)."""
    body = stage.get("do", stage) if isinstance(stage, Mapping) else {}
    out = []
    for entry in (body.get(field) or []) if isinstance(body, Mapping) else []:
        path = next(iter(entry), None) if isinstance(entry, Mapping) else entry
        if isinstance(path, str):
            out.append(posixpath.normpath(path))
    return out


def _candidates(knob: PathKnob, declared: list[str]) -> list[str]:
    """The declared paths ``knob`` could mean (for the message): of its form's shape, not the
    stage's code or the params stamp, a file with the extension of a ``*_file`` knob's value, a
    folder (no extension) for a ``*_dir`` knob."""
    suffix = knob.form.replace("{}", "")
    out = []
    for d in declared:
        if not d.endswith(suffix) or d.startswith(("hargo/", "flows/")) \
                or d == "reports/params-valid.txt":
            continue
        path = d[:len(d) - len(suffix)]
        if knob.key.endswith("_file") != bool(posixpath.splitext(path)[1]):
            continue
        out.append(path)
    return out


def _normal(value: str, root: Path) -> str:
    """``value`` as dvc.yaml spells a path: relative to the project root, POSIX, normalised."""
    p = Path(value)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(root.resolve())
        except ValueError:
            return str(p)
    return posixpath.normpath(p.as_posix())


def check_pipeline_paths(params: "Config", root: str | os.PathLike = ".") -> None:
    """Refuse a path knob (:data:`PATH_KNOBS`) whose value is not the path its pipeline file
    under ``root`` declares, unless that file templates the path from the knob itself
    (``${data.out_dir}/train.jsonl``: DVC then follows the value). A pipeline file that is
    absent (not a DVC project, or no comparison pipeline) or a stage it does not have is not
    checked; nor is a knob whose section ``params`` does not have (``compare`` is optional).

    Args:
        params: the typed config (:class:`hargo.config.Config`; a knob params.yaml leaves out
            is checked at its default, a knob under an absent optional section not at all).
        root: the project folder holding ``dvc.yaml`` and ``compare/dvc.yaml``.

    Raises:
        ParamsError: names the knob, its value, the pipeline file and stage, the path that
            file declares, and the fix.
    """
    import yaml

    root = Path(root)
    files: dict[str, Mapping] = {}
    for knob in PATH_KNOBS:
        value = _value(params, knob.key)
        if not isinstance(value, str):
            continue
        if knob.dvc_file not in files:
            try:
                doc = yaml.safe_load((root / knob.dvc_file).read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                doc = None     # no pipeline here, or one DVC itself will refuse
            stages = doc.get("stages") if isinstance(doc, Mapping) else None
            files[knob.dvc_file] = stages if isinstance(stages, Mapping) else {}
        stage = files[knob.dvc_file].get(knob.stage)
        if stage is None:
            continue
        declared = _declared(stage, knob.field)
        if any("${" + knob.key + "}" in d for d in declared):
            continue          # templated from params.yaml: the knob flows into the pipeline
        want = posixpath.normpath(knob.form.replace("{}", _normal(value, root)))
        if want in declared:
            continue
        there = _candidates(knob, declared) or declared
        why = ("DVC tracks, caches and deletes the declared path, so the run would fail after "
               "changing the workspace" if knob.field == "outs" else
               "DVC hashes the declared path, so the stage would read files DVC does not track")
        raise ParamsError(
            f"{knob.key}: {value!r} is not where {knob.dvc_file} stage '{knob.stage}' "
            f"{'writes' if knob.field == 'outs' else 'reads'} it ({' | '.join(there)}); {why}. "
            f"Keep {there[0]!r}, or change the path in {knob.dvc_file} (every stage that names "
            f"it) and in params.yaml together")
