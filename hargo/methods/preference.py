"""The offline preference methods ``dpo``, ``kto``, ``simpo``: TRL's trainers on the ranked SFT
pairs of the comparison's ``preferences`` stage (``hargo.training.preference_trainers``), each
with its ``compare.<name>`` block (checked key by key by ``hargo.params``)."""
from __future__ import annotations

from hargo.methods import Method, register_method

_POSITIVE = {"lo": 0, "lo_open": True}
_RULES = (("beta", _POSITIVE), ("learning_rate", _POSITIVE))

DPO = register_method(Method(
    name="dpo", label="DPO", description="DPO on ranked SFT pairs (TRL)", family="preference",
    rank=50, param_rules=_RULES))
KTO = register_method(Method(
    name="kto", label="KTO", description="KTO on ranked SFT pairs (TRL)", family="preference",
    rank=51, param_rules=_RULES))
SIMPO = register_method(Method(
    name="simpo", label="SimPO", description="SimPO on ranked SFT pairs (TRL CPO, loss_type=simpo)",
    family="preference", rank=52, param_rules=_RULES + (("gamma", {"lo": 0}),)))
