"""The :class:`Method` object: what hargo needs to know about one method, in one place.

Pure Python (no torch): the advantage estimator, policy loss and KL estimator are named by their
keys in :data:`hargo.advantages.ESTIMATORS`, :data:`hargo.losses.POLICY_LOSSES` and
:data:`hargo.losses.KL_ESTIMATORS`; the trainers look them up there by name (an unknown name is
an error that lists the valid ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from hargo.method_config import read_block

__all__ = ["Method", "FAMILIES", "RL_FAMILIES", "LOSSES", "DEFAULT_TRL_SETTINGS"]

#: Method families, in listing order; the family decides which trainer runs a method:
#: ``grpo_family`` -> ``hargo.training.grpo.HargoGRPOTrainer``, ``value`` ->
#: ``hargo.training.ppo.HargoPPOTrainer`` (both through the ``rl`` stage), ``preference`` ->
#: ``hargo.training.preference_trainers`` (TRL's DPO/KTO/CPO), ``sft`` -> ``hargo.training.sft``.
FAMILIES: tuple[str, ...] = ("grpo_family", "value", "preference", "sft")
#: The families of online RL, which the ``rl`` stage runs (``rl@<method>``).
RL_FAMILIES: tuple[str, ...] = ("grpo_family", "value")
#: How an RL method's loss is computed: ``weighted`` -- the GRPO family's one loss, hargo's
#: (``hargo.losses.group_weighted_aggregate`` of the policy loss plus beta x the KL estimator,
#: with the advantages and weights of :attr:`Method.estimator` and the aggregation and std
#: convention of the method's params block; docs/method.md); ``ppo`` -- the value-head PPO loss
#: of ``hargo.training.ppo`` (the KL estimator in the reward).
LOSSES: tuple[str, ...] = ("weighted", "ppo")
#: The losses each RL family's trainer implements.
FAMILY_LOSSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"grpo_family": ("weighted",), "value": ("ppo",)})
#: The ``trl.GRPOConfig`` loss fields every RL method gets unless it names its own: hargo
#: computes the advantages and the loss, so these only shape what TRL itself logs.
DEFAULT_TRL_SETTINGS: Mapping[str, str] = MappingProxyType(
    {"loss_type": "grpo", "scale_rewards": "group"})


@dataclass(frozen=True, eq=False)
class Method:
    """One method of hargo (registered with :func:`hargo.methods.register_method`).

    Attributes:
        name: the method's name (``--method``, ``rl.methods``, ``compare.methods``, file names).
        label: its display name in reports and plots (``hargo_b1`` -> ``HARGO-B1``).
        description: one line for ``hargo rl --help`` and the docs.
        family: one of :data:`FAMILIES` (which trainer runs it).
        rank: position among its family's methods in listings (help, error messages, tables);
            ties are broken by name.
        needs_reference: its advantage estimator reads the reference model's length-normalised
            log-probs ``l`` (HARGO's confidence): the trainer runs its own reference pass, also
            at beta 0 (must agree with :func:`hargo.advantages.needs_reference`, checked when the
            trainer is built; ``loss="weighted"`` only). PPO's and the other methods' KL terms
            use TRL's reference pass instead.
        estimator: key in :data:`hargo.advantages.ESTIMATORS` of its group advantages and
            response weights (GRPO family).
        loss: how its loss is computed, one of :data:`LOSSES` (RL methods).
        policy_loss: key in :data:`hargo.losses.POLICY_LOSSES` of its per-token policy loss
            (required by ``loss="weighted"``).
        kl: key in :data:`hargo.losses.KL_ESTIMATORS` of its KL(pi_theta || pi_ref) estimate
            (``k3`` in the GRPO family's loss, as TRL; ``k1`` in PPO's reward).
        trl_settings: ``trl.GRPOConfig`` fields of its own over :data:`DEFAULT_TRL_SETTINGS`
            (hargo computes every RL method's loss; these shape only what TRL logs).
        params_class: the frozen dataclass of its params block (:attr:`params_block`; each
            field a :func:`hargo.config.fields.knob`): an RL method's ``rl.<name>`` block
            (``hargo.method_config`` style, read by :meth:`read_params`), a compared method's
            ``compare.<name>`` block (:mod:`hargo.config.compare`'s ``PreferenceParams`` ...,
            built by the typed config); None for a method without knobs.

    Raises:
        ValueError: at construction, an inconsistent method (unknown family or loss, an RL method
            without loss, KL estimator, TRL settings or params dataclass, a weighted loss without
            estimator or policy loss, ``needs_reference`` without a weighted loss, an empty name,
            label or description).
    """

    name: str
    label: str
    description: str
    family: str
    rank: int = 100
    needs_reference: bool = False
    estimator: str | None = None
    loss: str | None = None
    policy_loss: str | None = None
    kl: str | None = None
    trl_settings: Mapping[str, str] = field(default_factory=dict)
    params_class: type | None = None

    def __post_init__(self):
        object.__setattr__(self, "trl_settings", MappingProxyType(dict(self.trl_settings)))
        for attr in ("name", "label", "description"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr).strip():
                raise ValueError(f"Method {self.name!r}: {attr} must be a non-empty string")
        problems = []
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} (valid: {', '.join(FAMILIES)})")
        elif self.is_rl:
            if self.loss not in FAMILY_LOSSES[self.family]:
                problems.append(f"loss {self.loss!r} (the {self.family} trainer implements "
                                f"{', '.join(FAMILY_LOSSES[self.family])})")
            if not self.kl:
                problems.append("no KL estimator (kl)")
            if self.params_class is None:
                problems.append("no params_class (its rl.<name> block)")
            if self.loss == "weighted" and not (self.estimator and self.policy_loss):
                problems.append("a weighted loss needs an estimator and a policy_loss")
        elif self.loss is not None:
            problems.append(f"loss is for RL methods, not family {self.family!r}")
        if self.needs_reference and self.loss != "weighted":
            problems.append("needs_reference is for a weighted loss (its estimator reads l)")
        if problems:
            raise ValueError(f"Method {self.name!r}: {'; '.join(problems)}")

    @property
    def is_rl(self) -> bool:
        """Online RL (:data:`RL_FAMILIES`): run by the ``rl`` stage."""
        return self.family in RL_FAMILIES

    @property
    def params_block(self) -> str:
        """The dotted params.yaml key of its knobs: ``rl.<name>`` for RL methods, else
        ``compare.<name>``."""
        return f"{'rl' if self.is_rl else 'compare'}.{self.name}"

    def read_params(self, params: Mapping):
        """Its validated params dataclass, read from :attr:`params_block` of ``params``
        (:func:`hargo.method_config.read_block`).

        Raises:
            ParamsError: no params dataclass; a missing block or key, an unknown key, a value of
                the wrong type or out of range (named ``rl.<name>.<field>``).
        """
        from hargo.param_values import ParamsError

        if self.params_class is None:
            raise ParamsError(f"method {self.name}: has no {self.params_block} params dataclass")
        return read_block(params, self.params_block, self.params_class)

    def __repr__(self) -> str:
        return f"Method({self.name!r}, family={self.family!r}, loss={self.loss!r})"
