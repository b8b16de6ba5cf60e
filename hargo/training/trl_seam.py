"""The seam between hargo's trainers and TRL / transformers: every *private* upstream method
hargo overrides (:data:`OVERRIDES`) and every private upstream attribute or method it reads,
writes or calls (:data:`PRIVATE_USES`), why no public API serves, and the signature or shape it
was written against.

TRL generates (its transformers or vLLM paths) and runs the optimiser loop; hargo computes every
GRPO-family loss (:mod:`hargo.training.grpo_loss`). The overrides all sit in one module,
:mod:`hargo.training.trl_overrides`, each a short method calling hargo's own step. Where TRL 1.16
or transformers 5.19 has a public hook, hargo uses it instead: ``Trainer.compute_loss`` (the
loss; TRL's own on its eval path through TRL's public ``compute_loss``), ``Trainer.log``
(hargo's metrics beside TRL's), ``Trainer.train`` (restoring ``method_state.json`` on resume),
``TrainerCallback.on_epoch_begin`` (the sampler's epoch), ``Trainer.processing_class`` and
``GRPOConfig.entropy_coef``, so those are not declared here.

A private name may change in any release, so :func:`check_seam` compares each overridden or
called method's upstream signature, and each used attribute's shape (read from TRL's source),
with the one recorded here and fails with a readable message naming it, the old and the new
form; :func:`check_trainer_attributes` checks the attributes on a built trainer. The RL trainer
runs both when it is built and ``tests/test_trl_seam.py`` runs them in the suite, with tests
that the lists are complete (a new override or private use must be declared here, and written
in ``trl_overrides.py``: :func:`private_name_uses` finds any elsewhere) and that a change is
caught.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Override", "OVERRIDES", "PrivateUse", "PRIVATE_USES", "SeamDriftError",
           "check_seam", "check_trainer_attributes", "overridden_private_methods",
           "override_sites", "upstream_private_names", "private_name_uses"]


@dataclass(frozen=True)
class Override:
    """One private upstream method hargo overrides.

    Attributes:
        owner: where it is defined upstream (``trl.GRPOTrainer``, ``transformers.Trainer``).
        name: the method's name.
        params: its parameter names (``self`` excluded), in order, as written against.
        by: the class of :mod:`hargo.training.trl_overrides` that overrides it.
        why: what hargo does there, and why no public API (callback, hook, config field) serves.
    """

    owner: str
    name: str
    params: tuple[str, ...]
    by: str
    why: str


_GRPO = "trl.GRPOTrainer"
_TRAINER = "transformers.Trainer"
_G = "GRPOOverrides"
OVERRIDES: tuple[Override, ...] = (
    Override(_GRPO, "_generate", ("prompts",), _G,
             "times the rollout (timing['generation_s']); TRL's callbacks see no rollout"),
    Override(_GRPO, "_generate_single_turn",
             ("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
             _G,
             "samples under the policy's bf16 autocast and cuts each completion at its task's "
             "budget; GRPOConfig has one max_completion_length for all rows"),
    Override(_GRPO, "_calculate_rewards",
             ("inputs", "prompts", "completions", "completion_ids_list"), _G,
             "keeps the gathered rewards per function, which TRL does not return"),
    Override(_GRPO, "_generate_and_score_completions", ("inputs",), _G,
             "replaces the advantages by the method's estimator over the gathered batch and adds "
             "per-response weights and task ids, dynamic sampling and the reference pass at "
             "two temperatures; TRL offers no advantage hook"),
    Override(_GRPO, "_get_per_token_logps_and_entropies",
             ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
              "compute_entropy", "compute_aux_loss", "pixel_values", "image_grid_thw",
              "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
              "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
             _G,
             "skips TRL's reference pass where hargo runs its own (TRL runs it whenever "
             "beta != 0; no config field turns it off) and keeps the loss forward's log-probs "
             "for the per-task diagnostics (no second forward)"),
    Override(_GRPO, "_get_train_sampler", ("dataset",), _G,
             "the prompt order of the right epoch after a resume, and per-task quotas; "
             "transformers builds the dataloader around it with no sampler argument"),
    Override(_GRPO, "_save_checkpoint", ("model", "trial"), _G,
             "writes method_state.json (EMA baseline, per-step history) into each checkpoint "
             "before trainer_state.json; TrainerCallback.on_save runs after the folder is final "
             "and may be skipped"),
    Override(_TRAINER, "_get_train_sampler", ("train_dataset",), "SFTOverrides",
             "length-bucketed SFT batches (less padding); transformers builds the dataloader "
             "around it with no sampler argument"),
)


@dataclass(frozen=True)
class PrivateUse:
    """A private upstream attribute or method hargo uses without overriding it.

    Attributes:
        owner: where it is defined upstream (as :attr:`Override.owner`).
        name: the attribute's or method's name.
        kind: ``"attribute"`` (set in the owner's ``__init__``) or ``"method"``.
        shape: a method's parameter names (``self`` excluded) as written against; an
            attribute's keys hargo uses (a dict of ``deque`` columns, read by the owner's
            ``log``).
        via: the members of :class:`hargo.training.trl_overrides.GRPOOverrides` that touch it
            (the only code that does).
        why: what hargo does with it, and why no public API serves.
    """

    owner: str
    name: str
    kind: str
    shape: tuple[str, ...]
    via: tuple[str, ...]
    why: str


PRIVATE_USES: tuple[PrivateUse, ...] = (
    PrivateUse(_GRPO, "_logs", "attribute", ("prompt", "completion", "advantages"),
               ("scored_with_logged_texts", "set_logged_texts", "set_logged_advantages"),
               "the columns of TRL's completions table (log_completions), read by "
               "GRPOTrainer.log: hargo reads the texts of each scoring call and sets the "
               "prompt, completion and advantage columns to the groups it trains on (dynamic "
               "sampling) and the advantages its loss uses; TRL offers no public way to read "
               "or set them (a reward function's log_extra adds extra columns only)"),
    PrivateUse(_TRAINER, "_get_output_dir", "method", ("trial",), ("_save_checkpoint",),
               "the run folder transformers saves a checkpoint in (args.output_dir, or a "
               "hyperparameter-search trial's folder), where method_state.json must go; "
               "transformers passes _save_checkpoint the trial, not the folder"),
)


class SeamDriftError(RuntimeError):
    """A private upstream method hargo overrides or calls changed its signature (or vanished),
    or a private upstream attribute it uses changed its shape."""


def _upstream(owner: str):
    """The upstream class named ``owner`` (``transformers.Trainer``, ``trl.<Class>``)."""
    if owner == _TRAINER:
        from transformers import Trainer

        return Trainer
    import trl

    return getattr(trl, owner.split(".", 1)[1])


def _params_of(fn) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def check_seam(overrides: tuple[Override, ...] = OVERRIDES, resolve=_upstream,
               uses: tuple[PrivateUse, ...] = PRIVATE_USES) -> None:
    """Compare every declared override and private use with the installed upstream class.

    Args:
        overrides: the declared overrides (default :data:`OVERRIDES`).
        resolve: ``owner -> class`` (a test passes altered classes).
        uses: the declared private uses (default :data:`PRIVATE_USES`): a method's parameters;
            an attribute as its owner's ``__init__`` sets it and its ``log`` reads it (source).

    Raises:
        SeamDriftError: one line per method that vanished or whose parameters changed, naming
            the owner, the method, the parameters written against and the installed ones, and
            the hargo class to re-read; one per attribute no longer set, or set or read
            otherwise.
    """
    problems = []
    for o in overrides:
        fn = getattr(resolve(o.owner), o.name, None)
        if fn is None:
            problems.append(f"{o.owner}.{o.name} no longer exists (overridden by {o.by}: "
                            f"{o.why})")
            continue
        got = _params_of(fn)
        if got != o.params:
            problems.append(f"{o.owner}.{o.name} changed its parameters: written against "
                            f"({', '.join(o.params)}), installed ({', '.join(got)}); re-read "
                            f"{o.by}.{o.name}")
    for u in uses:
        problems += _use_problems(u, resolve(u.owner))
    if problems:
        raise SeamDriftError("the TRL/transformers private names hargo overrides or uses "
                             "changed (hargo/training/trl_seam.py):\n  " + "\n  ".join(problems))


def _via(u: PrivateUse) -> str:
    return ", ".join(f"GRPOOverrides.{v}" for v in u.via)


def _use_problems(u: PrivateUse, cls) -> list[str]:
    """What no longer holds of private use ``u`` in upstream class ``cls`` (its source)."""
    where = f"{u.owner}.{u.name}"
    if u.kind == "method":
        fn = getattr(cls, u.name, None)
        if fn is None:
            return [f"{where} no longer exists (called by {_via(u)}: {u.why})"]
        got = _params_of(fn)
        if got != u.shape:
            return [f"{where} changed its parameters: written against ({', '.join(u.shape)}), "
                    f"installed ({', '.join(got)}); re-read {_via(u)}"]
        return []
    set_in_init = _dict_assigned(getattr(cls, "__init__", None), u.name)
    if set_in_init is None:
        return [f"{where} is no longer set in {cls.__name__}.__init__ (used by {_via(u)}: "
                f"{u.why})"]
    problems = []
    bad = [k for k in u.shape if set_in_init.get(k) != "deque"]
    if bad:
        problems.append(f"{where} changed its shape: written against a dict of deques with "
                        f"keys ({', '.join(u.shape)}), installed keys "
                        f"({', '.join(f'{k}: {v}' for k, v in set_in_init.items())}); re-read "
                        f"{_via(u)}")
    unread = [k for k in u.shape if k not in _subscripts_read(getattr(cls, "log", None),
                                                               u.name)]
    if unread:
        problems.append(f"{where}: {cls.__name__}.log no longer reads its column(s) "
                        f"{', '.join(unread)} (the completions table hargo sets); re-read "
                        f"{_via(u)}")
    return problems


def _function_ast(fn):
    """The AST of function ``fn``'s source (None without source)."""
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _is_self_attr(node, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _dict_assigned(fn, name: str) -> dict[str, str] | None:
    """``{key: callee of its value}`` of the dict literal ``fn`` assigns to ``self.<name>``
    (``"deque"`` for ``deque(...)``, ``""`` for anything else); None if it assigns none."""
    tree = _function_ast(fn)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and any(_is_self_attr(t, name) for t in node.targets):
            if not isinstance(node.value, ast.Dict):
                return {}
            out = {}
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    f = v.func if isinstance(v, ast.Call) else None
                    out[k.value] = getattr(f, "id", getattr(f, "attr", ""))
            return out
    return None


def _subscripts_read(fn, name: str) -> set[str]:
    """The constant keys ``fn`` reads as ``self.<name>[key]``."""
    tree = _function_ast(fn)
    return {n.slice.value for n in ast.walk(tree) if tree is not None
            and isinstance(n, ast.Subscript) and _is_self_attr(n.value, name)
            and isinstance(n.slice, ast.Constant)} if tree is not None else set()


def check_trainer_attributes(trainer, uses: tuple[PrivateUse, ...] = PRIVATE_USES) -> None:
    """Check the private attributes of :data:`PRIVATE_USES` on a built ``trainer``: each a dict
    holding its keys, each a ``deque``.

    Raises:
        SeamDriftError: one line per attribute missing or of another shape, naming it, what was
            found and the hargo accessors to re-read.
    """
    problems = []
    for u in uses:
        if u.kind != "attribute":
            continue
        value = getattr(trainer, u.name, None)
        if not isinstance(value, Mapping):
            problems.append(f"{u.owner}.{u.name}: the trainer has "
                            f"{'no such attribute' if value is None else type(value).__name__}"
                            f", not a dict of deques (used by {_via(u)}: {u.why})")
            continue
        bad = {k: type(value.get(k)).__name__ for k in u.shape
               if not isinstance(value.get(k), deque)}
        if bad:
            problems.append(f"{u.owner}.{u.name}: key(s) not a deque: "
                            f"{', '.join(f'{k} ({t})' for k, t in bad.items())}; re-read "
                            f"{_via(u)}")
    if problems:
        raise SeamDriftError("the TRL/transformers private attributes hargo uses changed "
                             "(hargo/training/trl_seam.py):\n  " + "\n  ".join(problems))


def _owner(base) -> str:
    if base.__module__.startswith("transformers"):
        return _TRAINER
    return f"trl.{base.__name__}"


def override_sites(cls) -> dict[tuple[str, str], list[str]]:
    """``(owner, name) -> ["module.Class", ...]`` for every private method that hargo classes
    in ``cls``'s MRO define and a TRL or transformers class in it defines too (owner as in
    :attr:`Override.owner`: the first upstream class in the MRO that defines it), listing every
    hargo class that defines it, in MRO order."""
    out: dict[tuple[str, str], list[str]] = {}
    upstream = [b for b in cls.__mro__ if b.__module__.startswith(("trl", "transformers"))]
    for klass in cls.__mro__:
        if not klass.__module__.startswith("hargo"):
            continue
        for attr in vars(klass):
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            for base in upstream:
                if attr in vars(base):
                    out.setdefault((_owner(base), attr), []).append(
                        f"{klass.__module__}.{klass.__name__}")
                    break
    return out


def overridden_private_methods(cls) -> set[tuple[str, str]]:
    """``(owner, name)`` of every private method that a hargo class in ``cls``'s MRO defines
    and a TRL or transformers class in it defines too (owner as in :attr:`Override.owner`):
    what :data:`OVERRIDES` must declare."""
    return set(override_sites(cls))


def upstream_private_names(*classes) -> set[str]:
    """The private names (one leading underscore) of the TRL and transformers classes in the
    MROs of ``classes``: their methods and class attributes, and the instance attributes their
    source assigns (``self._x = ...``)."""
    names: set[str] = set()
    for cls in classes:
        for base in cls.__mro__:
            if not base.__module__.startswith(("trl", "transformers")):
                continue
            names |= {n for n in vars(base) if n.startswith("_") and not n.startswith("__")}
            try:
                src = inspect.getsource(base)
            except (OSError, TypeError):
                continue
            names |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=", src))
    return {n for n in names if not n.startswith("__")}


def private_name_uses(names: set[str], root: str | Path | None = None,
                      exclude: tuple[str, ...] = ("trl_overrides.py",)) -> list[str]:
    """Every attribute access ``<expr>.<name>`` with ``name`` in ``names`` in the hargo
    package's source (``root``: default the installed ``hargo`` folder), outside the files
    named in ``exclude``, as ``"path:line: .name"`` (comments and docstrings do not count)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name in exclude:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in names:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}: .{node.attr}")
    return out
