"""hargo's one typed config: params.yaml as a frozen tree of dataclasses, built and validated
once (:func:`load_config`, :meth:`Config.from_params`).

Every section and nested block of params.yaml is a frozen dataclass (below); every field is a
:func:`~hargo.config.fields.knob` carrying its type, default (``required`` when params.yaml must
give it), help text, range and source, the way TRL's ``GRPOConfig`` documents itself
(:func:`~hargo.config.fields.field_info` reads them; ``hargo check-params --explain`` and
docs/parameters.md are generated from them). Two kinds of block are dynamic:

* per-task maps (``validate.task_counts``, ``rl.max_new_tokens``, ``rewards.answer.max_chars``
  ...) are read-only mappings whose keys must be tasks of the :mod:`hargo.tasks` registry;
* ``rl.<method>`` and ``compare.<method>`` blocks are the knob dataclasses of the
  :mod:`hargo.methods` registry (``Method.params_class``, :mod:`hargo.method_config`), reached
  with :meth:`RL.method` / :meth:`Compare.method`.

Refused, by the dotted key's name: an unknown key at any depth
(``rl.hargo.alpah``, ``data.split.stratgy: unknown key (known: ...)``), a value of the wrong type,
out of range or not a choice (with the range), a missing required key. The checks
``hargo.params.validate_params`` made by hand are the fields' own now (its messages are kept);
the few that relate several keys are the sections' ``_check`` hooks.

The ``synthetic`` section's blocks are :mod:`hargo.config.synthetic`'s (the synthetic test bed's
own dataclasses: its generator, tiny policy and plan read them), and ``register`` is checked by
the promotion gate's rule, :mod:`hargo.config.gate_rule` (:mod:`hargo.gate` imports it from
there).

The rules that relate a section to others (the answer budgets, ``rewards.answer.max_chars``
naming every tuned task) are :mod:`hargo.config.cross`'s, run for the whole config and for a
section built alone (:func:`as_section`); the names MLflow and DVC constrain
(``register.model_name``, ``mlflow.experiment``, the params keys, the stage names made from
``rl.methods`` / ``compare.methods``) are checked against those libraries' rules by
:mod:`hargo.config.names`.

The sections live in one module each (or one for a few related ones), imported here:
:mod:`~hargo.config.data` (``data``, ``validate``), :mod:`~hargo.config.train` (``model``,
``train``, ``sft``), :mod:`~hargo.config.rl`, :mod:`~hargo.config.rewards`,
:mod:`~hargo.config.evaluate` (``evaluate``, ``register``, ``mlflow``) and
:mod:`~hargo.config.compare` (``compare``, ``synthetic``), declared with
:mod:`~hargo.config.knobs`' shorthands and built from a mapping by :mod:`~hargo.config.build`;
this module holds the root :class:`Config` and the doors (:func:`load_config`,
:func:`as_config`, :func:`as_section`, :func:`explain` ...).

Imports: :mod:`hargo.param_values`, the config's own modules (:mod:`~hargo.config.fields`,
:mod:`~hargo.config.loading`, :mod:`~hargo.config.synthetic`, :mod:`~hargo.config.gate_rule`,
:mod:`~hargo.config.cross`, :mod:`~hargo.config.names` and the section modules above) and
(lazily, when a config is built) the method and task registries and
:mod:`hargo.generation_budget`. Nothing of training, evaluation, comparison, data, models or
the gate is imported, and no torch (``python -X importtime -c "import hargo.config"``;
tests/test_config_layers.py).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import MISSING
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from hargo.config.loading import apply_overrides, read_params_file
from hargo.config.fields import REQUIRED, check_value, describe_range, field_info, knob, node
from hargo.config import cross, names  # noqa: F401 (hargo.config.names, as before)
from hargo.config.cross import CHARS_PER_TOKEN_BOUND
from hargo.config.knobs import _int, section
from hargo.config.build import _build, _check_budget  # noqa: F401 (importable here, as before)
# the sections, each in its module, importable from here as before
from hargo.config.data import Data, Split, Validate  # noqa: F401
from hargo.config.train import SFT, Divergence, Lora, Model, RLLora, Train  # noqa: F401
from hargo.config.rl import (GENERATION_BACKENDS, RL, SERVER_KEYS,  # noqa: F401
                             DynamicSampling, VLLMServer)
from hargo.config.rewards import AnswerRule, MLPerfReward, PLPReward, Rewards  # noqa: F401
from hargo.config.evaluate import Evaluate, Mlflow, Register
from hargo.config.compare import (Compare, CompareEvaluate, CompareReport,  # noqa: F401
                                  Preferences, Synthetic)
from hargo.config.gate_rule import check_gate_params  # noqa: F401 (importable here, as before)
from hargo.config.synthetic import (SyntheticBootstrap, SyntheticData,  # noqa: F401
                                    SyntheticEvaluate, SyntheticPolicy, SyntheticRL, SyntheticSFT,
                                    check_synthetic, check_synthetic_keys)
from hargo.param_values import ParamsError

__all__ = ["Config", "load_config", "as_config", "as_section", "params_dict", "knob", "node", "field_info", "describe_range",
           "ParamsError", "explain", "to_plain", "SECTIONS", "GENERATION_BACKENDS", "SERVER_KEYS",
           "CHARS_PER_TOKEN_BOUND"]


# -------------------------------------------------------------------------------------- root
@section
class Config:
    """params.yaml, typed: built and validated once (:func:`load_config`,
    :meth:`from_params`); every stage reads this, never the dict."""

    seed: int = _int(REQUIRED, "the pipeline's seed", 0)
    data: Data = node(Data, "prepare's input and split")
    validate: Validate = node(Validate, "the data checks")
    model: Model = node(Model, "the base model")
    train: Train = node(Train, "what SFT and RL share")
    sft: SFT = node(SFT, "supervised fine-tuning")
    rl: RL = node(RL, "online RL")
    rewards: Rewards = node(Rewards, "the task rewards")
    evaluate: Evaluate = node(Evaluate, "evaluation")
    register: Register = node(Register, "registry and promotion gate")
    compare: Compare | None = node(Compare, "the nine-method comparison", default=None)
    mlflow: Mlflow = node(Mlflow, "tracking", default=Mlflow())
    synthetic: Synthetic | None = node(Synthetic, "the synthetic test bed", default=None)
    _params: Mapping = dataclasses.field(default_factory=dict, repr=False, compare=False,
                                         metadata={"kind": "private"})
    _synthetic: bool = dataclasses.field(default=False, repr=False,
                                         metadata={"kind": "private"})

    @property
    def synthetic_tasks(self) -> bool:
        """The task universe this config was built for: True when its per-task maps name the
        synthetic test bed's tasks (``Config.from_params(params, synthetic=True)``), False when
        they name the HPC-GPT ones (:mod:`hargo.tasks`, ``Task.synthetic``)."""
        return self._synthetic

    @classmethod
    def from_params(cls, params: Mapping, synthetic: bool = False) -> "Config":
        """The typed config of ``params`` (a params.yaml mapping; not changed).

        ``synthetic``: the task universe its per-task maps (``rl.max_new_tokens``,
        ``validate.task_counts``, ``rewards.answer.max_chars`` ...) are checked against: the
        HPC-GPT tasks (False, params.yaml) or the synthetic test bed's (True,
        :func:`hargo.compare.synthetic.stage_params`); recorded as :attr:`synthetic_tasks`.

        Raises:
            ParamsError: ``params`` is not a mapping (None included); the first unknown,
                missing, mistyped or out-of-range key, named by its dotted path
                (``rl.num_generations: must be >= 2, got 1``), or a per-task map naming a task
                outside the universe (``rl.max_new_tokens.race_c: unknown task``)."""
        if not isinstance(params, Mapping):             # None, a list, a path: not a TypeError
            raise ParamsError(f"params: expected a mapping of sections, got {params!r}")
        return _build_root(copy.deepcopy(dict(params)), synthetic=bool(synthetic))

    def to_dict(self) -> dict:
        """The params mapping this config was built from, normalised (numbers as numbers): only
        for logging the run's parameters and for the digests of a run (:func:`params_dict`);
        code reads the typed fields."""
        return copy.deepcopy(dict(self._params))

    def with_values(self, values: Mapping[str, Any], synthetic: bool | None = None
                    ) -> "Config":
        """This config with each dotted key of ``values`` set (``{"seed": 3, "rl.steps": 8}``:
        any declared field, :func:`~hargo.config.loading.apply_overrides`), built and checked
        again: how a stage derives the config of one run, whose :meth:`to_dict` is then that
        run's own params. ``synthetic``: the task universe of the result (None: this one's).

        Raises:
            ParamsError: an undeclared key or a bad value, by its dotted name."""
        universe = self._synthetic if synthetic is None else bool(synthetic)
        return Config.from_params(apply_overrides(self.to_dict(), values), synthetic=universe)

    def get(self, dotted: str) -> Any:
        """The value of the dotted key (``"rl.hargo.alpha"``), typed."""
        cur: Any = self
        for part in dotted.split("."):
            if isinstance(cur, Mapping):
                cur = cur[part]
            elif isinstance(cur, RL) and part in cur.blocks:
                cur = cur.blocks[part]
            elif isinstance(cur, Compare) and part in cur.blocks:
                cur = cur.blocks[part]
            else:
                cur = getattr(cur, part)
        return cur


#: the sections of params.yaml, in order
SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if not f.name.startswith("_"))
_SECTION_FIELDS = {f.name: f for f in dataclasses.fields(Config) if not f.name.startswith("_")}


def _build_root(params: dict, synthetic: bool = False) -> Config:
    """:class:`Config` of ``params``, whose values are normalised in place; its per-task maps
    checked against the task universe ``synthetic`` (:meth:`Config.from_params`)."""
    from hargo.config.registries import raw_file_tasks

    if not isinstance(params, Mapping):
        raise ParamsError(f"params: expected a mapping of sections, got {params!r}")
    cfg = _build(Config, params, "", params, synthetic)
    object.__setattr__(cfg, "_synthetic", synthetic)
    for t in raw_file_tasks(synthetic):   # params.yaml bounds every task of the raw files (a
        if t not in cfg.validate.task_counts:     # section built alone may bound fewer)
            raise ParamsError(f"validate.task_counts.{t}: missing (no key "
                              f"'validate.task_counts.{t}')")
    cross.whole(cfg, params)              # the answer budgets, max_chars, MLflow's key rule
    object.__setattr__(cfg, "_params", MappingProxyType(copy.deepcopy(params)))
    return cfg


def _check_universe(cfg: Config, synthetic: bool | None) -> Config:
    if synthetic is not None and cfg.synthetic_tasks != bool(synthetic):
        have, want = (("synthetic" if s else "HPC-GPT") for s in (cfg.synthetic_tasks, synthetic))
        raise ParamsError(f"params: a config of the {have} tasks where one of the {want} tasks "
                          f"is needed")
    return cfg


def as_config(params: "Config | Mapping", synthetic: bool | None = None) -> Config:
    """``params`` as a :class:`Config`: a Config as it is, a params mapping built
    (:meth:`Config.from_params`). For public functions that take either.

    ``synthetic``: the task universe (:meth:`Config.from_params`). None: a Config of either
    universe, a mapping of the HPC-GPT tasks; True / False: that universe, for a Config too.

    Raises:
        ParamsError: see :meth:`Config.from_params`; or a Config of the other universe."""
    if isinstance(params, Config):
        return _check_universe(params, synthetic)
    return Config.from_params(params, synthetic=bool(synthetic))


def as_section(params: "Config | Mapping", name: str, synthetic: bool | None = None,
               required: bool = False):
    """Section ``name`` (``"data"``, ``"rl"``, ``"seed"`` ...) of ``params`` typed: a
    :class:`Config`'s own node, or that section of a params mapping built and checked alone (for
    public functions that tests call with only the sections they read); ``synthetic``: the task
    universe of its per-task maps, as :func:`as_config`'s; ``required``: an optional section
    (``compare``, ``synthetic``) that the caller needs is refused when absent or null. A
    section built alone gets the rules that relate it to the sections the mapping has
    (:func:`hargo.config.cross.section_alone`: the answer budgets of ``rewards``, ``rl``,
    ``evaluate``, ``compare``), as the whole config does.

    Raises:
        ParamsError: ``params`` neither a Config nor a mapping, no such section, the section's
            first bad key (by its dotted name) or cross-section rule, a Config of the other
            universe, or (``required``) ``<name>: missing (no key ...)``."""
    value = _section(params, name, synthetic)
    if required and value is None:
        raise ParamsError(f"{name}: missing (no key '{name}')")
    return value


def _section(params: "Config | Mapping", name: str, synthetic: bool | None):
    if isinstance(params, Config):
        return getattr(_check_universe(params, synthetic), name)
    if not isinstance(params, Mapping):
        raise ParamsError(f"params: expected a Config or a mapping of sections, got {params!r}")
    f = _SECTION_FIELDS.get(name)
    if f is None:
        raise ParamsError(f"{name}: unknown section (known: {', '.join(SECTIONS)})")
    if name not in params:
        if f.default is not MISSING:
            return f.default
        raise ParamsError(f"{name}: missing (no key '{name}')")
    raw = copy.deepcopy(params[name])
    if f.metadata.get("kind") == "node":
        if raw is None and f.metadata["nullable"]:
            return None
        value = _build(f.metadata["node"], raw, name, params, bool(synthetic))
        cross.section_alone(name, value, raw, params, bool(synthetic))   # the rules it shares
        return value
    return check_value(name, raw, f.metadata)


def params_dict(params: "Config | Mapping") -> Mapping:
    """The plain params mapping of ``params`` (:meth:`Config.to_dict`, or the mapping itself):
    for MLflow logging and run fingerprints, which record the parameters as params.yaml has
    them."""
    return params.to_dict() if isinstance(params, Config) else params


def to_plain(value: Any) -> Any:
    """A typed config value as the plain value its params.yaml entry reads as: a section or
    block (dataclass) as a dict of its fields in order, a read-only map as a dict, a tuple as a
    list, recursively; anything else as it is. For the helpers that take an engine-settings
    mapping (the generation and scoring helpers take the ``evaluate`` block so), not for
    reading: read the typed fields.

    >>> to_plain(Config.from_params(params).evaluate)["max_new_tokens"]   # doctest: +SKIP
    {'race_c': 8, ...}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.metadata.get("kind") not in ("private", "method_blocks")}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [to_plain(v) for v in value]
    return value


def load_config(path: str | Path = "params.yaml",
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Config:
    """params.yaml at ``path`` with ``overrides`` (``"rl.steps=8"`` or a mapping; only existing
    keys) applied, as a validated :class:`Config`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParamsError: see :meth:`Config.from_params`.
    """
    return Config.from_params(apply_overrides(read_params_file(path), overrides))


def explain(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per field of ``cls`` and its nested blocks, for help texts and docs:
    ``rl.steps (int, required, >= 1): optimizer steps``."""
    out = []
    for name, info in field_info(cls).items():
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if f.metadata.get("kind") == "private":
            continue
        key = f"{prefix}{name}"
        if f.metadata.get("kind") == "node":
            out.append(f"{key}: {info['help']}")
            out.extend(explain(f.metadata["node"], key + "."))
            continue
        if f.metadata.get("kind") == "method_blocks":
            from hargo.config import registries

            out.append(f"{prefix}<method>: {info['help']}")
            if cls is RL:
                for name, m in registries.rl_methods().items():
                    out.append(f"{prefix}{name}: {m.description} ({m.params_class.__name__})")
                    out.extend(explain(m.params_class, f"{prefix}{name}."))
            else:
                for name, m in registries.compare_methods().items():
                    out.append(f"{prefix}{name}: {m.description} ({m.params_class.__name__})")
                    out.extend(explain(m.params_class, f"{prefix}{name}."))
            continue
        default = info["default"]
        bits = [info["type"], "required" if default == "required" else f"default {default!r}"]
        if info["range"]:
            bits.append(info["range"])
        out.append(f"{key} ({', '.join(bits)}): {info['help']}")
    return out
