"""The seam to TRL (hargo/training/trl_seam.py): every private upstream method hargo's trainers
override is declared and written in hargo/training/trl_overrides.py (one module), each declared
signature is the installed one, and a changed upstream signature fails with a message naming the
method and both parameter lists."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def _trainer_classes():
    from hargo.training.grpo import HargoGRPOTrainer
    from hargo.training.ppo import HargoPPOTrainer
    from hargo.training.sft import _bucketed_trainer_class

    return HargoGRPOTrainer, HargoPPOTrainer, _bucketed_trainer_class()


def test_every_private_override_is_declared_and_sits_in_trl_overrides():
    from hargo.training.trl_seam import OVERRIDES, override_sites

    by = {(o.owner, o.name): o.by for o in OVERRIDES}
    declared = set(by)
    found = set()
    for cls in _trainer_classes():
        sites = override_sites(cls)
        mixins = {k.__name__ for k in cls.__mro__}
        assert set(sites) == {k for k, b in by.items() if b in mixins}, cls.__name__
        for key, where in sites.items():   # written once, in trl_overrides.py
            assert where == [f"hargo.training.trl_overrides.{by[key]}"], (cls.__name__, key)
        found |= set(sites)
    assert found == declared
    assert len(OVERRIDES) == len(declared) == 8 and all(o.why for o in OVERRIDES)


def test_the_installed_trl_matches_the_declared_signatures():
    from hargo.training.trl_seam import check_seam

    check_seam()


def test_a_changed_upstream_signature_is_a_readable_error():
    """A planted change: TRL's ``_calculate_rewards`` gains a parameter and ``_generate``
    vanishes."""
    from trl import GRPOTrainer

    from hargo.training.trl_seam import SeamDriftError, check_seam

    class Altered(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list,
                               reward_kwargs):   # noqa: D401
            raise NotImplementedError

        _generate = None

    resolve = lambda owner: Altered  # noqa: E731  (every owner: the altered class)
    from hargo.training.trl_seam import OVERRIDES

    grpo_only = tuple(o for o in OVERRIDES if o.owner == "trl.GRPOTrainer")
    with pytest.raises(SeamDriftError) as err:
        check_seam(grpo_only, resolve)
    msg = str(err.value)
    assert ("trl.GRPOTrainer._calculate_rewards changed its parameters: written against (inputs, "
            "prompts, completions, completion_ids_list), installed (inputs, prompts, completions, "
            "completion_ids_list, reward_kwargs); re-read GRPOOverrides._calculate_rewards") in msg
    assert "trl.GRPOTrainer._generate no longer exists (overridden by GRPOOverrides" in msg
    assert msg.count("\n  ") == 2        # exactly the two planted changes


def test_the_public_hooks_replace_the_dropped_overrides():
    """The loss, the resume's method state and the sampler's epoch go through public hooks
    (``compute_loss``, ``train``, ``on_epoch_begin``), not TRL's private ``_compute_loss``,
    ``_load_optimizer_and_scheduler`` or transformers' ``_run_epoch``."""
    from hargo.training.resume import SamplerEpochCallback

    for cls in _trainer_classes()[:2]:
        for name in ("_compute_loss", "_load_optimizer_and_scheduler", "_run_epoch"):
            assert not any(name in vars(k) for k in cls.__mro__
                           if k.__module__.startswith("hargo")), (cls.__name__, name)
    assert "on_epoch_begin" in vars(SamplerEpochCallback)
