"""The offline preference methods ``dpo``, ``kto``, ``simpo``: TRL's trainers on the ranked SFT
pairs of the comparison's ``preferences`` stage (``hargo.training.preference_trainers``), each
with its ``compare.<name>`` block (:class:`hargo.config.compare.PreferenceParams`,
:class:`~hargo.config.compare.SimPOParams`)."""
from __future__ import annotations

from hargo.config.compare import PreferenceParams, SimPOParams
from hargo.methods import Method, register_method

DPO = register_method(Method(
    name="dpo", label="DPO", description="DPO on ranked SFT pairs (TRL)", family="preference",
    rank=50, params_class=PreferenceParams))
KTO = register_method(Method(
    name="kto", label="KTO", description="KTO on ranked SFT pairs (TRL)", family="preference",
    rank=51, params_class=PreferenceParams))
SIMPO = register_method(Method(
    name="simpo", label="SimPO", description="SimPO on ranked SFT pairs (TRL CPO, loss_type=simpo)",
    family="preference", rank=52, params_class=SimPOParams))
