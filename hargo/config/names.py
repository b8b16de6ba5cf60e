"""Names that hargo hands to MLflow and DVC, checked at the params stage against those
libraries' own rules, so that a name a library will refuse fails ``hargo check-params`` (naming
the key and the rule) instead of the last stage that uses it (``register.model_name=team/x``
used to pass every check and fail only in ``register``, after the whole pipeline had run).

Which names come from params.yaml, and whose rule holds each:

* ``register.model_name`` (and ``<it>-base``, the registered model of an adapter version's base
  model, :data:`DERIVED_MODEL_SUFFIXES`): an MLflow registered model name. MLflow 3's rule is
  two functions, both applied here, since the project's store may be a SQL one (SQLite, a
  tracking server) or a file one: ``mlflow.utils.validation._validate_model_name`` (not empty,
  no ``/`` or ``:``, not a name that resolves to another as a path: ``.``, ``a/../b``, ``..x``)
  and ``mlflow.store.model_registry.file_store._validate_model_name`` (no path separator, no
  ``%``); plus the SQL store's column width (``registered_models.name``: 256 characters); plus
  what the ``models:/<name>@<alias>`` and ``models:/<name>/<version>`` URIs need, which MLflow
  registers without checking: ``mlflow.store.artifact.utils.models._parse_model_uri`` must give
  the name back, so no ``?`` (urllib takes the rest for a query), no tab, CR or LF (urllib
  drops them), and hargo adds ``#`` (a fragment to any parser that allows one) and every other
  control character (issue 42: ``register.model_name='a?b'`` was registered, then
  ``hargo.registry.ask`` could not load ``models:/a?b@candidate``).
* ``mlflow.experiment``: ``mlflow.utils.validation._validate_experiment_name`` (a non-empty
  string of at most 500 characters) and the SQL store's column (``experiments.name``: 256).
* every params key as MLflow logs it (``rl.hargo.beta``; :func:`hargo.tracking.flatten`):
  ``mlflow.utils.validation._validate_param_name`` (alphanumerics, ``_ - . / : ``, space; not
  path-like) and at most 250 characters. The keys are the typed config's, so only a plug-in
  task's or method's name can break this.
* the DVC stage names made from params: ``rl@<method>`` (``rl.methods``) and
  ``compare_train@<method>-<seed>`` (``compare.methods``): ``dvc.stage.utils.is_valid_name``
  (no punctuation but ``_`` and ``-``; ``@`` would split the name at the wrong place, ``:`` is
  the separator of ``dvc.yaml:stage`` targets).

The registry's aliases (``champion``, ``candidate``: constants of :mod:`hargo.champion`) and
the Prefect names (flows, deployments, work pools, artifact keys: constants in ``flows/`` and
``prefect.yaml``) are not params; tests/test_library_names.py checks those against the
libraries' rules. Prefect constrains no name hargo derives from params (task and flow run names
are free text).

The rules are copied here (importing MLflow costs ~1.4 s, and the params stage runs before
every stage); tests/test_library_names.py checks each copy against the library's own function
on the same names, so a library upgrade that changes a rule fails the suite. Imports only
:mod:`hargo.param_values`.
"""
from __future__ import annotations

import os
import posixpath
import re
import string
import unicodedata
from typing import Any, Mapping

from hargo.param_values import ParamsError

__all__ = ["DERIVED_MODEL_SUFFIXES", "SQL_NAME_WIDTH", "model_name_problem", "uri_name_problem",
           "experiment_name_problem", "param_key_problem", "dvc_stage_key_problem",
           "check_model_name", "check_experiment_name", "check_param_keys", "check_stage_keys"]

#: Suffixes hargo appends to ``register.model_name`` for models it registers beside it
#: (:data:`hargo.registered_models.BASE_SUFFIX`; a test ties the two).
DERIVED_MODEL_SUFFIXES = ("-base",)
#: The SQL store's column width for experiment and registered model names
#: (``mlflow.store.tracking.dbmodels.models.SqlExperiment.name``,
#: ``mlflow.store.model_registry.dbmodels.models.SqlRegisteredModel.name``).
SQL_NAME_WIDTH = 256
_EXPERIMENT_NAME_MAX = 500                     # mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH
_PARAM_KEY_MAX = 250                           # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_PARAM_KEY = re.compile(r"^[/\w.\- :]*$")      # validate_param_and_metric_name (not Windows)
_DVC_BAD = frozenset(string.punctuation) - {"_", "-"}   # dvc.stage.INVALID_STAGENAME_CHARS


def _path_like(name: str) -> bool:
    """MLflow's ``path_not_unique``: the name would resolve to another as a path."""
    norm = posixpath.normpath(name)
    return norm != name or norm == "." or norm.startswith("..") or norm.startswith("/")


def model_name_problem(name: Any) -> str | None:
    """Why MLflow's model registry refuses ``name`` as a registered model name (None: it
    accepts it, in a SQL store and in a file store alike)."""
    if not isinstance(name, str) or not name.strip():
        return "MLflow needs a non-empty registered model name"
    if "/" in name or ":" in name:
        return "MLflow registered model names cannot contain '/' or ':'"
    if _path_like(name):
        return (f"MLflow refuses a registered model name that resolves to another as a path "
                f"({posixpath.normpath(name)!r})")
    if any(sep in name for sep in (os.path.sep, os.path.altsep) if sep):
        return "MLflow's file store refuses a path separator in a registered model name"
    if "%" in name:
        return "MLflow's file store refuses '%' in a registered model name"
    if len(name) > SQL_NAME_WIDTH:
        return f"MLflow's SQL store keeps registered model names of at most {SQL_NAME_WIDTH} characters"
    return uri_name_problem(name)


#: Characters a ``models:/`` URI cannot carry in its name: ``?`` starts a query, ``#`` a
#: fragment (urllib.parse), beside the control characters (:func:`uri_name_problem`).
_URI_SPECIAL = ("?", "#")


def uri_name_problem(name: str) -> str | None:
    """Why ``name`` cannot stand in a ``models:/<name>@<alias>`` or ``models:/<name>/<n>`` URI
    (MLflow's ``_parse_model_uri`` would not give it back; None: it can). A ``/`` is MLflow's
    own rule (:func:`model_name_problem`)."""
    bad = sorted({c for c in name if c in _URI_SPECIAL or unicodedata.category(c) == "Cc"})
    if bad:
        return (f"the models:/{{name}}@{{alias}} URI that loads it cannot carry "
                f"{' '.join(repr(c) for c in bad)} (urllib reads '?' as a query, '#' as a "
                f"fragment and drops tab, CR and LF; no control characters)")
    return None


def experiment_name_problem(name: Any) -> str | None:
    """Why MLflow refuses ``name`` as an experiment name (None: it accepts it)."""
    if not isinstance(name, str) or name == "":
        return "MLflow needs a non-empty experiment name"
    if len(name) > _EXPERIMENT_NAME_MAX:
        return f"MLflow experiment names have at most {_EXPERIMENT_NAME_MAX} characters"
    if len(name) > SQL_NAME_WIDTH:
        return f"MLflow's SQL store keeps experiment names of at most {SQL_NAME_WIDTH} characters"
    return None


def param_key_problem(key: str) -> str | None:
    """Why MLflow refuses ``key`` as a run parameter's name (None: it accepts it)."""
    if not _PARAM_KEY.match(key):
        return ("MLflow parameter names may only contain alphanumerics, underscores, dashes, "
                "periods, spaces, colons and slashes")
    if _path_like(key):
        return "MLflow refuses a parameter name that resolves to another as a path"
    if len(key) > _PARAM_KEY_MAX:
        return f"MLflow parameter names have at most {_PARAM_KEY_MAX} characters"
    return None


def dvc_stage_key_problem(key: str) -> str | None:
    """Why DVC refuses ``key`` in a stage name (None: it accepts it)."""
    bad = sorted(set(str(key)) & _DVC_BAD)
    if not str(key):
        return "DVC needs a non-empty stage name"
    if bad:
        return (f"DVC stage names may contain no punctuation but '_' and '-' (here "
                f"{' '.join(repr(c) for c in bad)})")
    return None


def check_model_name(key: str, name: Any) -> None:
    """``name`` (and each of its :data:`DERIVED_MODEL_SUFFIXES` forms) is a registered model
    name MLflow accepts.

    Raises:
        ParamsError: ``<key>: <name> cannot name an MLflow registered model: <the rule>``."""
    for n in (name, *(f"{name}{s}" for s in DERIVED_MODEL_SUFFIXES if isinstance(name, str))):
        why = model_name_problem(n)
        if why:
            what = "" if n == name else f" (hargo also registers {n!r})"
            raise ParamsError(f"{key}: {name!r} cannot name an MLflow registered model{what}: "
                              f"{why}")


def check_experiment_name(key: str, name: Any) -> None:
    """``name`` is an experiment name MLflow accepts.

    Raises:
        ParamsError: ``<key>: <name> cannot name an MLflow experiment: <the rule>``."""
    why = experiment_name_problem(name)
    if why:
        raise ParamsError(f"{key}: {name!r} cannot name an MLflow experiment: {why}")


def check_param_keys(params: Mapping, prefix: str = "") -> None:
    """Every key of ``params``, flattened as MLflow logs it (``rl.hargo.beta``), is a parameter
    name MLflow accepts.

    Raises:
        ParamsError: ``<key>: MLflow cannot log this parameter: <the rule>``."""
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            check_param_keys(v, key + ".")
            continue
        why = param_key_problem(key)
        if why:
            raise ParamsError(f"{key}: MLflow cannot log this parameter: {why}")


def check_stage_keys(key: str, stage: str, names) -> None:
    """Each of ``names`` is a key DVC accepts in the stage name ``<stage>@<name>``.

    Raises:
        ParamsError: ``<key>: <name> cannot name the DVC stage <stage>@<name>: <the rule>``."""
    for n in names:
        why = dvc_stage_key_problem(str(n))
        if why:
            raise ParamsError(f"{key}: {n!r} cannot name the DVC stage {stage}@{n}: {why}")
