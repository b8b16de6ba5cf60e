"""The ``register`` stage: evaluated RL models into the MLflow model registry, with a gate that
decides whether the ``champion`` alias moves.

For each method of ``rl.methods`` (in that order) the model folder ``rl.out_dir/<method>`` is
logged to the stage's MLflow run as a transformers model (task ``text-generation``, explicit
``pip_requirements`` so MLflow skips its ~9 s requirement inference): a LoRA run's adapter with a
reference to its base, the SFT model, which is stored once as a version of
``<register.model_name>-base`` and reused while its digest stays the same
(:mod:`hargo.registered_models`); a full fine-tuning run's full weights. With the method's eval
metrics linked to the logged model (listed on the model's page), the params, and the common run
tags; it is registered as a new version of ``register.model_name`` with tags (``hargo.method``,
``hargo.seed``, ``hargo.data_version``, ``hargo.git_commit``, ``hargo.gate``, and an adapter's
``hargo.base_model``) and the gate's reason as its description, and gets the alias ``candidate``
(the last method's, with several).

The gate (:func:`hargo.gate.gate`, which states the rule) pairs each candidate's per-prompt
evaluation rows (``data/eval/<method>.jsonl``) with a reference's and decides on a paired
bootstrap interval per ``register.gate_metrics`` metric (``register.resamples``,
``register.confidence``, seeded by ``seed``): the candidate must be better on one with the
interval above zero and worse on none beyond ``register.tolerance``. The reference is the
current ``champion`` (its rows are an artifact of the run that registered it,
:data:`hargo.champion.ROWS_ARTIFACT`), compared only when its evaluation identity equals this one; with no
champion yet, SFT's rows from the same evaluation (SFT's ``win`` against itself is a tie).
Candidates are judged in ``rl.methods`` order, and a candidate that passes becomes the reference
for the next: the champion ends on the last one that beat the reference at its turn. The decision is
each version's ``hargo.gate`` tag, the reason (with the intervals) its description; all of it is
on the run and in ``metrics/register.json``.

Failure handling: every check (metrics present for SFT and each method, gate metrics known and
numeric, model folders complete, each with a training record that says it did not diverge
(:func:`hargo.training.divergence.check_training_record`, against ``train.divergence``), adapters
trained on the SFT model there and giving the merged folder's logits on it
(:func:`hargo.registered_models.check_adapter_agrees`), per-prompt rows matching the metrics,
the store usable) runs before anything is registered. If logging, registering or moving an alias fails midway,
the champion and candidate aliases are put back and the versions created by this run are
deleted (and the registered models too when this run created them): nothing partial stays
registered.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from hargo.champion import (CANDIDATE, CHAMPION, IDENTITY_TAG, ROWS_ARTIFACT, champion_reference,
                            version_by_alias)
from hargo.evaluation.identity import read_eval_identity, read_eval_rows
from hargo.config import Config, params_dict
from hargo.gate import check_rows_match_metrics, gate
from hargo.io import HargoInputError, atomic_write_json, require_complete_dir
from hargo.model_card import base_record, local_model_card
from hargo.registered_models import (BASE_TAG, adapter_dir, check_adapter_agrees,
                                     check_adapter_base, ensure_registered_model,
                                     log_adapter_model, pip_requirements, store_base_version)
from hargo.registered_models import ask, load_registered  # noqa: F401 (public: docs/tracking.md)

__all__ = ["REGISTER_FILE", "CANDIDATE", "CHAMPION", "IDENTITY_TAG", "read_eval_metrics", "run",
           "load_registered", "ask"]

REGISTER_FILE = "metrics/register.json"
EVAL_FILE = "metrics/eval.json"
#: the common run tags a registered version also carries (beside hargo.method and hargo.gate)
VERSION_TAGS = ("hargo.seed", "hargo.data_version", "hargo.git_commit")

SFT = "sft"
SFT_WIN_RATE = 0.5  # SFT against itself: all ties


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_eval_metrics(path: str | Path, models: Sequence[str], gate_metrics: Sequence[str]) -> dict:
    """The eval metrics of ``models`` from ``metrics/eval.json``, checked.

    Returns ``{model: {metric: value}}`` (SFT gets ``win_rate`` 0.5 when absent).

    Raises:
        FileNotFoundError: no eval metrics (run the evaluate stage).
        HargoInputError: not JSON, a model missing, or a gate metric missing or not a number for
            a model (names the file and ``<model>.<metric>``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the evaluate stage first (hargo evaluate)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise HargoInputError(path, f"not valid JSON: {e}") from None
    out = {}
    for m in models:
        entry = doc.get(m) if isinstance(doc, dict) else None
        if not isinstance(entry, dict):
            raise HargoInputError(path, f"no metrics for model {m!r} (models present: "
                                  f"{sorted(k for k in doc if k != 'run')}); re-run hargo "
                                  "evaluate with the same rl.methods", field=m)
        entry = dict(entry)
        if m == SFT:
            entry.setdefault("win_rate", SFT_WIN_RATE)
        for g in gate_metrics:
            if not _numeric(entry.get(g)):
                raise HargoInputError(path, f"model {m!r} has no numeric gate metric {g!r} "
                                      f"(got {entry.get(g)!r})", field=f"{m}.{g}")
        out[m] = entry
    return out


def run(params: Config, root: str | Path = ".") -> dict:
    """Run the register stage (see the module docstring).

    Args:
        params: the typed config (:class:`hargo.config.Config`; ``register``, ``rl.methods``,
            ``rl.out_dir``, ``sft.out_dir``, ``mlflow``, ``seed``).
        root: the repository root that relative paths start from.

    Returns:
        The ``metrics/register.json`` document: ``model_name``, ``gate_metrics``, ``tolerance``,
        ``resamples``, ``confidence``, ``previous_champion``, ``versions`` (per method: version,
        gate, reason, reference, metrics, intervals, stored: ``adapter`` or ``full``), ``base``
        (the base version adapters refer to: name, version, sha256, reused; None without one),
        ``candidate``, ``champion`` (``moved``), ``decision``, ``run_id``.

    Raises:
        ValueError: bad ``register`` params (unknown gate metric, ...).
        FileNotFoundError: no ``metrics/eval.json`` or ``data/eval/<model>.jsonl``, or a model
            folder missing/half-written.
        HargoInputError: metrics missing for a model or gate metric, the per-prompt rows do
            not give ``metrics/eval.json``'s gate metrics, or an adapter was trained on another
            SFT model than ``sft.out_dir``'s.
        RuntimeError: the MLflow store cannot be used or written (nothing stays registered and
            no alias moves), or the champion's per-prompt rows are there but cannot be read or
            paired with this evaluation's.

    The whole stage runs in Hugging Face hub offline mode (:func:`hargo.offline.hub_offline`):
    MLflow's transformers flavour would otherwise ask the hub for a model card and license of
    each local model folder it logs.
    """
    from hargo.offline import hub_offline

    with hub_offline():
        return _register(params, root)


@dataclass
class _Inputs:
    """What :func:`_checked_inputs` read and checked before anything is registered: each model's
    eval ``metrics``, the evaluation ``identity``, the per-prompt ``rows``, the RL model folders
    ``dirs`` and their LoRA ``adapters`` (None: full weights), and, with an adapter, the SFT
    model ``base_dir`` they were trained on and its ``digest``."""

    metrics: dict
    identity: dict
    rows: dict
    dirs: dict
    adapters: dict
    base_dir: Path | None = None
    digest: str | None = None


@dataclass
class _Undo:
    """What a registration has done so far, for :func:`_rollback`: the versions ``created``
    (``(method, version)``; method None: the base), the registered models ``made``, the aliases
    moved."""

    created: list = field(default_factory=list)
    made: list = field(default_factory=list)
    moved_champion: bool = False
    moved_candidate: bool = False


def _register(cfg: Config, root: str | Path) -> dict:
    """:func:`run`'s body: every check (:func:`_checked_inputs`, :func:`_open_store`), then, in
    the stage's MLflow run, the versions (:func:`_log_versions`), the gate
    (:func:`_judge_candidates`), the aliases (:func:`_move_aliases`) and the document; undone on
    any failure (:func:`_rollback`)."""
    from mlflow.tracking import MlflowClient

    from hargo import stage_inputs, tracking

    root = Path(root)
    gp = cfg.register               # checked by the gate's own rule (hargo.gate.check_gate_params)
    name, gates = gp.model_name, list(gp.gate_metrics)
    methods = list(cfg.rl.methods)
    inp = _checked_inputs(cfg, root, methods, gates)
    uri = _open_store(cfg, root)
    client = MlflowClient()
    old, ref_label, reference, not_comparable = champion_reference(
        client, name, inp.identity, inp.rows[methods[0]], gates)
    if old is None:
        reference, ref_label = inp.rows[SFT], SFT
    old_candidate = version_by_alias(client, name, CANDIDATE)
    common = tracking.common_tags(cfg, root)
    base = base_record(root / cfg.model.out_dir)    # where the base model came from: the cards
    judge = _eval_judge(root / EVAL_FILE)

    with tracking.stage_run("register", cfg, root) as mlrun:
        stage_inputs.check()   # params/deps edited so far: fail before the first registry write
        undo = _Undo()
        try:
            base_doc = _log_versions(client, name, methods, inp, cfg, common, base, undo)
            candidates = [(m, mv) for m, mv in undo.created if m is not None]   # None: the base
            versions, new_champ = _judge_candidates(client, cfg, candidates, inp, reference,
                                                    ref_label, not_comparable)
            decision = _move_aliases(client, name, candidates, new_champ, old, ref_label, undo)
            stage_inputs.check()   # edited while the versions were logged: undone (below)
            doc = _register_doc(gp, mlrun.info.run_id, judge, inp.identity, old, versions,
                                base_doc, candidates[-1], new_champ, decision)
            _write_doc(doc, root)
        except Exception as e:
            _rollback(client, name, undo.created, undo.made, old, undo.moved_champion,
                      old_candidate if undo.moved_candidate else False)
            raise RuntimeError(f"registering {name} in the MLflow store {uri} failed, so "
                               "nothing was registered and no alias moved: "
                               f"{type(e).__name__}: {e}") from e
        except BaseException:  # KeyboardInterrupt and the like: undo, then let it through
            _rollback(client, name, undo.created, undo.made, old, undo.moved_champion,
                      old_candidate if undo.moved_candidate else False)
            raise
    print(f"[register] {name}: " + "; ".join(
        f"v{v['version']} ({v['method']}) gate {v['gate']}" for v in versions)
        + f"; {decision}", flush=True)
    return doc


def _checked_inputs(cfg: Config, root: Path, methods: Sequence[str],
                    gates: Sequence[str]) -> _Inputs:
    """Every check that runs before anything is registered: metrics present for SFT and each
    method, per-prompt rows matching them, model folders complete and not diverged, adapters
    trained on ``sft.out_dir``'s model and giving the merged folder's logits on it."""
    metrics = read_eval_metrics(root / EVAL_FILE, [SFT, *methods], gates)
    identity = read_eval_identity(root)
    rows = read_eval_rows(root, [SFT, *methods])
    check_rows_match_metrics(rows, metrics, gates, root / EVAL_FILE)
    dirs = {m: require_complete_dir(root / cfg.rl.out_dir / m, f"model folder of '{m}'")
            for m in methods}
    from hargo.training.divergence import DivergenceBounds, check_training_record

    bounds = DivergenceBounds.of(cfg.train.divergence)
    for m in methods:     # a model whose training diverged is never registered
        check_training_record(dirs[m], bounds, f"model folder of '{m}'")
    inp = _Inputs(metrics, identity, rows, dirs, {m: adapter_dir(dirs[m]) for m in methods})
    if any(inp.adapters.values()):  # LoRA runs: their base is the SFT model they were trained on
        from hargo.models.loading import model_digest

        inp.base_dir = require_complete_dir(root / cfg.sft.out_dir, "SFT model folder")
        inp.digest = model_digest(inp.base_dir)
        for m, a in inp.adapters.items():
            if a is not None:
                check_adapter_base(a, inp.base_dir, inp.digest)
                check_adapter_agrees(dirs[m], a, inp.base_dir,  # merged == base + adapter
                                     trust_remote_code=bool(cfg.model.trust_remote_code))
    return inp


def _open_store(cfg: Config, root: Path) -> str:
    """The tracking URI, once the store took its first write (a read-only store fails here).

    Raises:
        RuntimeError: the store cannot be used (names the URI)."""
    from hargo import tracking

    uri = tracking.tracking_uri(root)
    try:
        tracking.setup(cfg, root)
        tracking.parent_run_id(cfg, root)  # the first write: fails here on a read-only store
    except Exception as e:  # e.g. the store's folder cannot be created
        if isinstance(e, RuntimeError):
            raise
        raise RuntimeError(f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}") from e
    return uri


def _log_versions(client, name: str, methods: Sequence[str], inp: _Inputs, cfg: Config,
                  common: Mapping, base, undo: _Undo) -> dict | None:
    """Log each method's model to the active run and register it as a version of ``name`` (an
    adapter's base once, as a version of ``<name>-base``); each version lands in
    ``undo.created``; the versions' params are ``cfg``'s as params.yaml has them
    (:func:`hargo.config.params_dict`). Returns the base's record (None: no adapter)."""
    import mlflow

    from hargo import tracking

    pd = params_dict(cfg)
    version_tags = {k: common[k] for k in VERSION_TAGS if k in common}
    if ensure_registered_model(client, name, "hargo: RL post-trained models on the "
                               "HPC-GPT tasks; @champion passed the register gate, "
                               "@candidate is the newest version"):
        undo.made.append(name)
    base_doc = base_local = None
    if inp.digest is not None:
        base_doc, base_local = store_base_version(
            client, name, inp.base_dir, inp.digest, version_tags, common, undo.created,
            undo.made, model_card=local_model_card(inp.base_dir, base, "the SFT model (LoRA base)"))
    logged_params = {k: str(v)[:500] for k, v in tracking.flatten(
        {"seed": pd.get("seed"), "rl": pd["rl"], "sft": pd.get("sft", {}),
         "evaluate": pd.get("evaluate", {}), "rewards": pd.get("rewards", {})}).items()}
    for m in methods:
        adapter = inp.adapters[m]
        kw = {"pip_requirements": pip_requirements(peft=adapter is not None),
              "params": logged_params, "tags": {"hargo.method": m, **common}}
        if adapter is not None:     # the adapter and a reference to its base
            info = log_adapter_model(inp.dirs[m], adapter, inp.base_dir, base_local,
                                     f"model-{m}", **kw)
        else:                           # full fine-tuning: the full weights
            info = mlflow.transformers.log_model(
                transformers_model=str(inp.dirs[m]), name=f"model-{m}",
                task="text-generation", **kw,
                model_card=local_model_card(inp.dirs[m], base, f"RL model ({m})"))
        mlflow.log_metrics({k: float(v) for k, v in inp.metrics[m].items() if _numeric(v)},
                           model_id=info.model_id)
        # a handful of tags; the metrics are linked to the logged model (above), the
        # run id, pipeline key, judge and door are on the version's run
        tags = {"hargo.method": m, **version_tags,
                IDENTITY_TAG: json.dumps(inp.identity, sort_keys=True)}
        if adapter is not None:
            tags[BASE_TAG] = f"models:/{base_doc['name']}/{base_doc['version']}"
        # the per-prompt rows: a later register pairs its candidates with them
        mlflow.log_dict({"rows": inp.rows[m]}, ROWS_ARTIFACT.format(method=m))
        mv = mlflow.register_model(info.model_uri, name, tags=tags)
        undo.created.append((m, mv))
    return base_doc


def _judge_candidates(client, cfg: Config, candidates, inp: _Inputs, reference, ref_label: str,
                      not_comparable) -> tuple[list[dict], tuple | None]:
    """The gate for each candidate in ``rl.methods`` order against the reference (a candidate
    that passes becomes the next one's); each version gets its ``hargo.gate`` tag and the reason
    as its description. Returns (the versions' records, the new champion's ``(method,
    version)`` or None)."""
    gp = cfg.register
    name, gates = gp.model_name, list(gp.gate_metrics)
    versions, ref, new_champ, ref_now = [], reference, None, ref_label
    for m, mv in candidates:
        if not_comparable and new_champ is None:    # the reference is the champion
            passed, intervals, reason = False, {}, (
                f"not comparable with {ref_label}'s evaluation, so the gate cannot "
                f"decide ({'; '.join(not_comparable)}); evaluate the candidates as the "
                "champion was, or move the alias by hand")
        else:
            passed, reason, intervals = gate(inp.rows[m], ref, gates, gp.tolerance,
                                             gp.resamples, gp.confidence, cfg.seed)
        versions.append({"method": m, "version": str(mv.version),
                         "gate": "passed" if passed else "failed",
                         "reference": ref_now, "reason": reason,
                         "metrics": {g: inp.metrics[m][g] for g in gates},
                         "intervals": intervals,
                         "stored": "adapter" if inp.adapters[m] is not None else "full"})
        client.set_model_version_tag(name, mv.version, "hargo.gate",
                                     "passed" if passed else "failed")
        client.update_model_version(
            name, mv.version, description=f"gate {'passed' if passed else 'failed'} "
            f"against {ref_now}: {reason}")
        if passed:
            ref, new_champ = inp.rows[m], (m, mv)
            ref_now = f"candidate v{mv.version} ({m})"
    return versions, new_champ


def _move_aliases(client, name: str, candidates, new_champ, old, ref_label: str,
                  undo: _Undo) -> str:
    """``candidate`` onto each candidate in turn (it ends on the last), ``champion`` onto the new
    champion if any (recorded in ``undo``). Returns the decision's sentence."""
    for m, mv in candidates:
        undo.moved_candidate = True
        client.set_registered_model_alias(name, CANDIDATE, mv.version)
    if new_champ is not None:
        undo.moved_champion = True
        client.set_registered_model_alias(name, CHAMPION, new_champ[1].version)
        return (f"{CHAMPION} moved to v{new_champ[1].version} ({new_champ[0]}) "
                f"from {ref_label}")
    return (f"{CHAMPION} stays "
            + (f"v{old.version} ({old.tags.get('hargo.method', '?')})"
               if old is not None else "unset (no candidate beat sft)"))


def _register_doc(gp, run_id: str, judge: str, identity, old, versions, base_doc, last,
                  new_champ, decision: str) -> dict:
    """The ``metrics/register.json`` document (:func:`run`'s return value); ``last``: the last
    candidate's ``(method, version)``, which holds the ``candidate`` alias."""
    last_m, last_mv = last
    return {
        "model_name": gp.model_name, "gate_metrics": list(gp.gate_metrics),
        "tolerance": gp.tolerance, "resamples": gp.resamples, "confidence": gp.confidence,
        "run_id": run_id, "judge": judge, "eval_identity": identity,
        "previous_champion": None if old is None else
        {"version": str(old.version), "method": old.tags.get("hargo.method")},
        "versions": versions, "base": base_doc,
        "candidate": {"version": str(last_mv.version), "method": last_m},
        "champion": ({"version": str(new_champ[1].version), "method": new_champ[0],
                      "moved": True} if new_champ else
                     ({"version": str(old.version), "method": old.tags.get("hargo.method"),
                       "moved": False} if old is not None else None)),
        "decision": decision,
    }


def _write_doc(doc: dict, root: Path) -> None:
    """The decision's tags and the document on the active run, then ``metrics/register.json``."""
    import mlflow

    mlflow.set_tags({"hargo.register_decision": doc["decision"],
                     "hargo.champion_version": doc["champion"]["version"]
                     if doc["champion"] else "none"})
    mlflow.log_dict(doc, "register/register.json")
    atomic_write_json(root / REGISTER_FILE, doc)


def _rollback(client, name: str, created, made: Sequence[str], old, moved_champion: bool,
              old_candidate=False) -> None:
    """Undo a failed registration: champion (and candidate) aliases back, created versions
    (and the registered models in ``made``) deleted.

    ``old``: the champion version before the run (None: there was none); ``old_candidate``: the
    candidate version before the run (None: there was none), or False when the candidate alias
    was not touched. Aliases are put back before the versions are deleted.
    """
    errors = []
    restores = [(CHAMPION, old)] if moved_champion else []
    if old_candidate is not False:
        restores.append((CANDIDATE, old_candidate))
    for alias, prev in restores:
        try:
            if prev is not None:
                client.set_registered_model_alias(name, alias, prev.version)
            else:
                client.delete_registered_model_alias(name, alias)
        except Exception as e:  # keep rolling back the rest
            errors.append(f"restore {alias}: {e}")
    for _, mv in reversed(created):
        try:
            client.delete_model_version(mv.name, mv.version)
        except Exception as e:
            errors.append(f"delete version {mv.name} v{mv.version}: {e}")
    for made_name in made:
        try:
            client.delete_registered_model(made_name)
        except Exception as e:
            errors.append(f"delete registered model {made_name}: {e}")
    if errors:
        print(f"[register] rollback incomplete: {'; '.join(errors)}", flush=True)


def _eval_judge(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["run"]["judge"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"
