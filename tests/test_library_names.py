"""Names that MLflow, DVC and Prefect constrain are checked at the params stage against the
libraries' own rules (hargo/config/names.py), not found out by the last stage that uses them.

The reported case: ``register.model_name=team/hargo-hpc`` passed ``hargo check-params`` and
failed only in ``register``, after the whole pipeline had run. The rules are copies (MLflow
costs ~1.4 s to import, the params stage runs before every stage); the property tests here hold
each copy to the library's own function on the same names.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hargo.config import names
from hargo.params import ParamsError, apply_overrides, load_params, validate_params

ROOT = Path(__file__).resolve().parents[1]

#: characters that matter to one rule or another, plus plain ones
_ALPHABET = st.sampled_from(list("abZ09_-. /\\:%@!#$&'\"*+,;<=>?[]^`{|}~\t\n") + ["é", "ü"])
_NAMES = st.text(_ALPHABET, max_size=12)


@pytest.mark.parametrize("override, message", [
    ("register.model_name=team/hargo-hpc",
     "register.model_name: 'team/hargo-hpc' cannot name an MLflow registered model: MLflow "
     "registered model names cannot contain '/' or ':'"),
    ("register.model_name=hargo:hpc", "cannot contain '/' or ':'"),
    ("register.model_name=hargo%hpc", "MLflow's file store refuses '%'"),
    ("register.model_name=..", "resolves to another as a path ('..')"),
    ("register.model_name=..hpc", "resolves to another as a path"),
    ("register.model_name=" + "m" * 252,
     "(hargo also registers '" + "m" * 252 + "-base'): MLflow's SQL store keeps registered "
     "model names of at most 256 characters"),
    ("mlflow.experiment=''",
     "mlflow.experiment: '' cannot name an MLflow experiment: MLflow needs a non-empty "
     "experiment name"),
    ("mlflow.experiment=" + "e" * 257, "at most 256 characters"),
])
def test_a_name_mlflow_refuses_is_refused_at_the_params_stage(committed_params, override,
                                                              message):
    with pytest.raises(ParamsError) as e:
        validate_params(apply_overrides(committed_params, [override]))
    assert message in str(e.value)
    assert str(e.value).startswith(override.split("=")[0] + ":")


def test_check_params_refuses_the_reported_model_name_and_writes_nothing(tmp_path,
                                                                         monkeypatch):
    """The reported command, through the CLI: exit 2, one line naming the key and MLflow's
    rule; a name MLflow takes still passes."""
    from typer.testing import CliRunner

    from hargo.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    bad = CliRunner().invoke(app, ["check-params", "-S", "register.model_name=team/hargo-hpc"])
    assert bad.exit_code == 2
    assert "error: register.model_name: 'team/hargo-hpc' cannot name an MLflow registered " \
           "model" in bad.output
    ok = CliRunner().invoke(app, ["check-params", "-S", "register.model_name=team_hargo-hpc.v2"])
    assert ok.exit_code == 0, ok.output
    assert not (tmp_path / "reports").exists()


def _mlflow_takes_model_name(name: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.store.model_registry.file_store import _validate_model_name as file_rule
    from mlflow.utils.validation import _validate_model_name as sql_rule

    try:
        sql_rule(name)
        file_rule(name)
    except MlflowException:
        return False
    return True


def _mlflow_parses_model_uris_of(name: str) -> bool:
    """MLflow's own parser gives ``name`` back from ``models:/<name>@a`` and
    ``models:/<name>/1`` (the URIs hargo.registry and hargo.registered_models load by)."""
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.utils.models import _parse_model_uri

    try:
        return all(_parse_model_uri(uri).name == name
                   for uri in (f"models:/{name}@a", f"models:/{name}/1"))
    except MlflowException:
        return False


def _hargo_also_refuses(name: str) -> bool:
    """hargo's own caution beyond MLflow's parser: '#' (a fragment to a parser that allows
    one) and any control character."""
    import unicodedata

    return "#" in name or any(unicodedata.category(c) == "Cc" for c in name)


@settings(max_examples=400, deadline=None)
@given(_NAMES)
def test_the_model_name_rule_is_mlflows(name):
    """Below the SQL column's width, hargo's verdict on a registered model name is MLflow's own
    (the SQL store's rule and the file store's, both), and the ``models:/`` URIs that load the
    model give the name back through MLflow's own parser (issue 42: ``a?b`` was taken)."""
    takes = _mlflow_takes_model_name(name) and _mlflow_parses_model_uris_of(name) \
        and not _hargo_also_refuses(name)
    assert (names.model_name_problem(name) is None) == takes, name


def test_every_character_mlflows_uri_parser_mangles_is_refused():
    """Issue 42: ``register.model_name`` values whose ``models:/`` URI MLflow cannot parse back
    (``a?b``: '?' starts a query; tab, CR, LF: urllib drops them) passed check-params, were
    registered, and then ``hargo.registry.ask('x', model_name='a?b', alias='candidate')``
    failed. Every character up to U+07FF and the odd ones beyond (line and paragraph
    separators, ideographic space, BOM; all 1.1M code points were checked once, 4 s, the same
    five), put inside a name, is refused by hargo whenever MLflow's parser would not give the
    name back."""
    mangled = [c for c in [*map(chr, range(0x800)), "\u2028", "\u2029", "\u3000", "\ufeff"]
               if not _mlflow_parses_model_uris_of(f"a{c}b")]
    assert mangled == ["\t", "\n", "\r", "/", "?"]   # what MLflow 3's parser loses today
    for c in mangled:
        assert names.model_name_problem(f"a{c}b") is not None, repr(c)
    assert "'?'" in names.model_name_problem("a?b") and "query" in names.model_name_problem("a?b")
    for c in "#\x00\x1f\x7f\x85":
        assert names.model_name_problem(f"a{c}b") is not None, repr(c)
    for ok in ("hargo-hpc", "a@b", "a b", "a;b", "a[b]", "é"):
        assert names.model_name_problem(ok) is None, ok
        assert _mlflow_parses_model_uris_of(ok), ok


@pytest.mark.parametrize("value", ["'a?b'", "'a#b'", "'a\tb'", "\"a\\rb\"", "\"a\\nb\""])
def test_a_model_name_no_models_uri_can_reach_is_refused_at_the_params_stage(committed_params,
                                                                               value):
    with pytest.raises(ParamsError, match=r"^register\.model_name: .* cannot name an MLflow "
                                          r"registered model: the models:/\{name\}@\{alias\} "
                                          r"URI that loads it cannot carry"):
        validate_params(apply_overrides(committed_params, [f"register.model_name={value}"]))


@settings(max_examples=200, deadline=None)
@given(st.one_of(_NAMES, st.text(min_size=250, max_size=600)))
def test_the_experiment_name_rule_is_mlflows(name):
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_experiment_name

    try:
        _validate_experiment_name(name)
        takes = len(name) <= names.SQL_NAME_WIDTH
    except MlflowException:
        takes = False
    assert (names.experiment_name_problem(name) is None) == takes


@settings(max_examples=400, deadline=None)
@given(st.one_of(_NAMES, st.text(st.sampled_from("ab._/"), min_size=245, max_size=260)))
def test_the_param_key_rule_is_mlflows(key):
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_param

    try:
        _validate_param(key, "1")
        takes = True
    except MlflowException:
        takes = False
    assert (names.param_key_problem(key) is None) == takes, key


@settings(max_examples=300, deadline=None)
@given(_NAMES.filter(bool))
def test_the_stage_name_rule_is_dvcs(key):
    from dvc.stage.utils import is_valid_name

    assert (names.dvc_stage_key_problem(key) is None) == is_valid_name(key), key


def test_the_copied_limits_are_the_libraries():
    """The SQL store's column widths, MLflow's length limits and the suffix hargo registers
    beside ``register.model_name`` are what the libraries and hargo.registered_models say."""
    from mlflow.store.model_registry.dbmodels.models import SqlRegisteredModel
    from mlflow.store.tracking.dbmodels.models import SqlExperiment
    from mlflow.utils import validation as v

    from hargo.registered_models import BASE_SUFFIX

    assert SqlExperiment.name.type.length == SqlRegisteredModel.name.type.length \
        == names.SQL_NAME_WIDTH == 256
    assert (v.MAX_EXPERIMENT_NAME_LENGTH, v.MAX_ENTITY_KEY_LENGTH) == (500, 250)
    assert names.DERIVED_MODEL_SUFFIXES == (BASE_SUFFIX,)


def test_a_method_dvc_cannot_name_a_stage_after_is_refused(committed_params, monkeypatch):
    """``rl.methods`` and ``compare.methods`` name DVC stages (``rl@<m>``,
    ``compare_train@<m>-<seed>``): a registered method whose name DVC refuses (a plug-in's
    ``my.method``) fails the params stage naming the stage."""
    from hargo.config import registries

    monkeypatch.setattr(registries, "check_method", lambda *a, **k: None)
    with pytest.raises(ParamsError, match=r"^rl\.methods: 'my\.method' cannot name the DVC "
                                          r"stage rl@my\.method: DVC stage names may contain no "
                                          r"punctuation but '_' and '-' \(here '\.'\)"):
        validate_params(apply_overrides(committed_params, ["rl.methods=[hargo, my.method]"]))
    with pytest.raises(ParamsError, match=r"^compare\.methods: 'a:b' cannot name the DVC stage "
                                          r"compare_train@a:b"):
        validate_params(apply_overrides(committed_params, ["compare.methods=[hargo, 'a:b']"]))


def test_every_params_key_is_held_to_mlflows_param_rule(committed_params, monkeypatch):
    """Every key is logged to MLflow as a run parameter (``rl.hargo.beta``,
    ``validate.task_counts.<task>``): the params stage holds each flattened key to
    :func:`names.param_key_problem` (MLflow's rule, above), so a plug-in task or method whose
    name MLflow refuses in a key fails there, by key."""
    assert names.param_key_problem("validate.task_counts.odd@task").startswith(
        "MLflow parameter names may only contain")
    seen = []

    def spy(key):
        seen.append(key)
        return "refused here" if key == "rl.hargo.beta" else None

    monkeypatch.setattr(names, "param_key_problem", spy)
    with pytest.raises(ParamsError, match=r"^rl\.hargo\.beta: MLflow cannot log this parameter: "
                                          r"refused here$"):
        validate_params(copy.deepcopy(committed_params))
    assert "validate.task_counts.race_c" in seen and "sft.lora.r" in seen


def test_the_registry_aliases_are_ones_mlflow_takes():
    """``champion`` and ``candidate`` (hargo.champion) pass MLflow's alias rules, the reserved
    names included."""
    from mlflow.utils.validation import (_validate_model_alias_name,
                                         _validate_model_alias_name_reserved)

    from hargo.champion import CANDIDATE, CHAMPION

    for alias in (CHAMPION, CANDIDATE):
        _validate_model_alias_name(alias)
        _validate_model_alias_name_reserved(alias)


def test_prefect_names_are_ones_prefect_takes():
    """prefect.yaml's deployments and work pools, and the flows' artifact keys, pass Prefect's
    own rules (``prefect.types.names``): no name hargo derives from params reaches Prefect."""
    import re

    from prefect.types.names import (WITHOUT_BANNED_CHARACTERS,
                                     raise_on_name_alphanumeric_dashes_only)

    raw = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    found = [d["name"] for d in raw["deployments"]]
    found += [p["name"] for p in raw["definitions"]["work_pools"].values()]
    assert found and all(re.match(WITHOUT_BANNED_CHARACTERS, n) for n in found), found
    keys = re.findall(r'^REPORT_KEY = "([^"]+)"', "\n".join(
        (ROOT / "flows" / f).read_text() for f in ("compare.py", "publish.py")), re.M)
    assert len(keys) == 2
    for k in keys:
        raise_on_name_alphanumeric_dashes_only(k, "Artifact key")


def test_the_committed_params_pass():
    load_params(ROOT / "params.yaml")
