"""The seam between hargo's trainers and TRL / transformers: every *private* upstream method
hargo overrides, why no public API serves, and the signature it was written against.

TRL generates (its transformers or vLLM paths) and runs the optimiser loop; hargo computes every
GRPO-family loss (:mod:`hargo.training.grpo_loss`). The overrides all sit in one module,
:mod:`hargo.training.trl_overrides`, each a short method calling hargo's own step. Where TRL 1.16
or transformers 5.19 has a public hook, hargo uses it instead: ``Trainer.compute_loss`` (the
loss), ``Trainer.train`` (restoring ``method_state.json`` on resume) and
``TrainerCallback.on_epoch_begin`` (the sampler's epoch), so those are not declared here.

A private method may change in any release, so :func:`check_seam` compares each one's upstream
signature with the one recorded here and fails with a readable message naming the method, the
old and the new parameters; the RL trainer runs it when it is built and
``tests/test_trl_seam.py`` runs it in the suite, with a test that the list is complete (a new
override must be declared here, and written in ``trl_overrides.py``) and one that a changed
signature is caught.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

__all__ = ["Override", "OVERRIDES", "SeamDriftError", "check_seam", "overridden_private_methods",
           "override_sites"]


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


class SeamDriftError(RuntimeError):
    """An overridden private upstream method changed its signature (or vanished)."""


def _upstream(owner: str):
    """The upstream class named ``owner`` (``transformers.Trainer``, ``trl.<Class>``)."""
    if owner == _TRAINER:
        from transformers import Trainer

        return Trainer
    import trl

    return getattr(trl, owner.split(".", 1)[1])


def _params_of(fn) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def check_seam(overrides: tuple[Override, ...] = OVERRIDES, resolve=_upstream) -> None:
    """Compare every declared override with the installed upstream method.

    Args:
        overrides: the declarations (default :data:`OVERRIDES`).
        resolve: ``owner -> class`` (a test passes altered classes).

    Raises:
        SeamDriftError: one line per method that vanished or whose parameters changed, naming
            the owner, the method, the parameters written against and the installed ones, and
            the hargo class to re-read.
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
    if problems:
        raise SeamDriftError("the TRL/transformers private methods hargo overrides changed "
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
