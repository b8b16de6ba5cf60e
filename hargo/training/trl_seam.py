"""The seam between hargo's trainers and TRL / transformers: every *private* upstream method
hargo overrides, why no public API serves, and the signature it was written against.

TRL generates (its transformers or vLLM paths) and runs the optimiser loop; hargo computes every
GRPO-family loss (:mod:`hargo.training.grpo`). A private method may change in any release, so
:func:`check_seam` compares each one's upstream signature with the one recorded here and fails
with a readable message naming the method, the old and the new parameters; the trainer runs it
when it is built and ``tests/test_trl_seam.py`` runs it in the suite, with a test that the list
is complete (a new override must be declared here) and one that a changed signature is caught.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

__all__ = ["Override", "OVERRIDES", "SeamDriftError", "check_seam", "overridden_private_methods"]


@dataclass(frozen=True)
class Override:
    """One private upstream method hargo overrides.

    Attributes:
        owner: where it is defined upstream (``trl.GRPOTrainer``, ``transformers.Trainer``).
        name: the method's name.
        params: its parameter names (``self`` excluded), in order, as written against.
        by: the hargo class that overrides it.
        why: what hargo does there, and why no public API (callback, hook, config field) serves.
    """

    owner: str
    name: str
    params: tuple[str, ...]
    by: str
    why: str


_GRPO = "trl.GRPOTrainer"
OVERRIDES: tuple[Override, ...] = (
    Override(_GRPO, "_generate", ("prompts",), "HargoGRPOTrainer",
             "times the rollout (timing['generation_s']); TRL's callbacks see no rollout"),
    Override(_GRPO, "_generate_single_turn",
             ("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
             "HargoGRPOTrainer",
             "samples under the policy's bf16 autocast and cuts each completion at its task's "
             "budget; GRPOConfig has one max_completion_length for all rows"),
    Override(_GRPO, "_calculate_rewards",
             ("inputs", "prompts", "completions", "completion_ids_list"), "HargoGRPOTrainer",
             "keeps the gathered rewards per function, which TRL does not return"),
    Override(_GRPO, "_generate_and_score_completions", ("inputs",), "HargoGRPOTrainer",
             "replaces the advantages by the method's estimator over the gathered batch and adds "
             "per-response weights and task ids, dynamic sampling and the reference pass at "
             "two temperatures; TRL offers no advantage hook"),
    Override(_GRPO, "_get_per_token_logps_and_entropies",
             ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
              "compute_entropy", "compute_aux_loss", "pixel_values", "image_grid_thw",
              "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
              "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
             "HargoGRPOTrainer",
             "keeps the loss forward's log-probs for the per-task diagnostics (no second "
             "forward)"),
    Override(_GRPO, "_compute_loss", ("model", "inputs"), "HargoGRPOTrainer",
             "the GRPO family's one loss (hargo.losses.group_weighted_aggregate); TRL's loss "
             "types take no per-response weights"),
    Override(_GRPO, "_get_train_sampler", ("dataset",), "ResumeMixin",
             "the prompt order of the right epoch after a resume, and per-task quotas"),
    Override("transformers.Trainer", "_run_epoch",
             ("model", "epoch", "train_dataloader", "steps_in_epoch",
              "num_update_steps_per_epoch", "trial", "ignore_keys_for_eval", "start_time",
              "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"),
             "ResumeMixin", "sets the sampler's epoch itself for an exact resume"),
    Override(_GRPO, "_save_checkpoint", ("model", "trial"), "ResumeMixin",
             "writes method_state.json (EMA baseline, per-step history) into each checkpoint; "
             "TrainerCallback.on_save runs after the folder is final and may be skipped"),
    Override(_GRPO, "_load_optimizer_and_scheduler", ("checkpoint",), "ResumeMixin",
             "restores method_state.json with the optimizer, before the first step"),
)


class SeamDriftError(RuntimeError):
    """An overridden private upstream method changed its signature (or vanished)."""


def _upstream(owner: str):
    if owner == "transformers.Trainer":
        from transformers import Trainer

        return Trainer
    from trl import GRPOTrainer

    return GRPOTrainer


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


def overridden_private_methods(cls) -> set[tuple[str, str]]:
    """``(owner, name)`` of every private method that a hargo class in ``cls``'s MRO defines
    and a TRL or transformers class in it defines too (owner as in :attr:`Override.owner`):
    what :data:`OVERRIDES` must declare."""
    out = set()
    upstream = [b for b in cls.__mro__ if b.__module__.startswith(("trl", "transformers"))]
    for klass in cls.__mro__:
        if not klass.__module__.startswith("hargo"):
            continue
        for attr in vars(klass):
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            for base in upstream:
                if attr in vars(base):
                    out.add(("transformers.Trainer" if base.__module__.startswith("transformers")
                             else _GRPO, attr))
                    break
    return out
