"""The rules of params.yaml that relate a section to others (or to the task registry), run by
every door that builds a section: the whole config (:meth:`hargo.config.Config.from_params`)
and a section built alone (:func:`hargo.config.as_section`, for the public functions that tests
call with only the sections they read). A section built alone used to skip them
(``as_section(params, "rewards")`` took a ``rewards.answer.max_chars`` that the budgets beside
it in the same mapping made degenerate); now it gets every rule whose other sections the
mapping has.

* :func:`answer_budgets`: each task's ``rewards.answer.max_chars`` leaves room for what its
  completion budgets (``rl.max_new_tokens``, ``evaluate.max_new_tokens``,
  ``compare.evaluate.max_new_tokens``) can produce. Run for ``rewards`` and for each budget's
  section when the mapping has a ``rewards`` section.
* :func:`tuned_max_chars`: ``rewards.answer.max_chars`` names every task without a default of
  its own.
* the names MLflow logs (:func:`hargo.config.names.check_param_keys`), for the section's keys.

Not here: ``validate.task_counts`` naming every raw-file task stays the whole config's rule (a
test builds the ``validate`` section for a subset of the raw files).
"""
from __future__ import annotations

from typing import Any, Mapping

from hargo.param_values import ParamsError

__all__ = ["CHARS_PER_TOKEN_BOUND", "BUDGET_KEYS", "answer_budgets", "tuned_max_chars",
           "whole", "section_alone"]

#: characters a generated token may take, at most, for the degenerate-answer budget check
#: (SmolLM2's BPE averages ~4 characters a token on the HPC-GPT answers).
CHARS_PER_TOKEN_BOUND = 8
#: The completion budgets ``rewards.answer.max_chars`` must leave room for.
BUDGET_KEYS = ("rl.max_new_tokens", "evaluate.max_new_tokens", "compare.evaluate.max_new_tokens")


def _raw(params: Mapping, dotted: str) -> Any:
    cur: Any = params
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


def answer_budgets(max_chars: Mapping[str, int], synthetic: bool, params: Mapping) -> None:
    """Each task's ``rewards.answer.max_chars`` (``max_chars``, typed) must leave room for what
    its generation budgets in ``params`` can produce (:data:`CHARS_PER_TOKEN_BOUND` characters a
    token), so that no honest completion is degenerate by length (``hargo.rewards.text``). The
    budgets are read by their dotted keys (:data:`BUDGET_KEYS`; absent ones skipped) and
    checked as their fields check them; ``synthetic``: the task universe.

    Raises:
        ParamsError: ``rewards.answer.max_chars.<task>: N characters is less than <key>
            allows ...``, or a budget's own error by its key."""
    from hargo.config.build import _check_budget
    from hargo.config.registries import task_budget, task_names, tuned_tasks

    tuned = tuned_tasks(synthetic)
    for task in (t for t in task_names(synthetic) if t in tuned or t in max_chars):
        have = max_chars[task]
        for key in BUDGET_KEYS:
            raw = _raw(params, key)
            if raw is None:
                continue
            tokens = task_budget(_check_budget(key, raw, None, None, synthetic), task, key)
            need = CHARS_PER_TOKEN_BOUND * tokens
            if have < need:
                raise ParamsError(
                    f"rewards.answer.max_chars.{task}: {have} characters is less than {key} "
                    f"allows ({tokens} tokens x {CHARS_PER_TOKEN_BOUND}); "
                    f"raise it to >= {need}, or an honest long answer would count as degenerate")


def tuned_max_chars(max_chars: Mapping[str, int], synthetic: bool) -> None:
    """``rewards.answer.max_chars`` names every task of the universe that has no budget
    defaults of its own (tuned in params.yaml).

    Raises:
        ParamsError: ``rewards.answer.max_chars.<task>: missing ...``."""
    from hargo.config.registries import tuned_tasks

    for t in tuned_tasks(synthetic):
        if t not in max_chars:
            raise ParamsError(f"rewards.answer.max_chars.{t}: missing (no key "
                              f"'rewards.answer.max_chars.{t}')")


def whole(cfg, params: Mapping) -> None:
    """The rules above for a whole config ``cfg`` built from the normalised ``params``."""
    from hargo.config import names

    max_chars = cfg.rewards.answer.max_chars
    tuned_max_chars(max_chars, cfg.synthetic_tasks)
    answer_budgets(max_chars, cfg.synthetic_tasks, params)
    names.check_param_keys(params)          # every key as MLflow logs it (hargo.tracking)


def section_alone(name: str, value: Any, raw: Any, params: Mapping, synthetic: bool) -> None:
    """The rules above that involve section ``name`` (built alone as ``value`` from ``raw``,
    its normalised block), with what ``params`` has of the other sections.

    Raises:
        ParamsError: as the whole config would, by the same dotted key."""
    from hargo.config import _section, names

    if name == "rewards":
        tuned_max_chars(value.answer.max_chars, synthetic)
        answer_budgets(value.answer.max_chars, synthetic, {**params, name: raw})
    elif name in {k.split(".")[0] for k in BUDGET_KEYS} and value is not None \
            and isinstance(params.get("rewards"), Mapping):
        _section(params, "rewards", synthetic)      # checks its max_chars against these budgets
    if isinstance(raw, Mapping):
        names.check_param_keys(raw, f"{name}.")
