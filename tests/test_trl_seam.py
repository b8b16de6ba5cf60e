"""The seam to TRL (hargo/training/trl_seam.py): every private upstream method hargo's trainers
override is declared, each declared signature is the installed one, and a changed upstream
signature fails with a message naming the method and both parameter lists."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def test_every_private_override_is_declared():
    from hargo.training.grpo import HargoGRPOTrainer
    from hargo.training.ppo import HargoPPOTrainer
    from hargo.training.trl_seam import OVERRIDES, overridden_private_methods

    declared = {(o.owner, o.name) for o in OVERRIDES}
    for cls in (HargoGRPOTrainer, HargoPPOTrainer):
        assert overridden_private_methods(cls) == declared, cls.__name__
    assert len(declared) == 10 and all(o.why for o in OVERRIDES)


def test_the_installed_trl_matches_the_declared_signatures():
    from hargo.training.trl_seam import check_seam

    check_seam()


def test_a_changed_upstream_signature_is_a_readable_error():
    """A planted change: TRL's ``_compute_loss`` gains a parameter and ``_generate`` vanishes."""
    from trl import GRPOTrainer

    from hargo.training.trl_seam import SeamDriftError, check_seam

    class Altered(GRPOTrainer):
        def _compute_loss(self, model, inputs, num_items_in_batch):   # noqa: D401
            raise NotImplementedError

        _generate = None

    resolve = lambda owner: Altered  # noqa: E731  (every owner: the altered class)
    from hargo.training.trl_seam import OVERRIDES

    grpo_only = tuple(o for o in OVERRIDES if o.owner == "trl.GRPOTrainer")
    with pytest.raises(SeamDriftError) as err:
        check_seam(grpo_only, resolve)
    msg = str(err.value)
    assert ("trl.GRPOTrainer._compute_loss changed its parameters: written against (model, "
            "inputs), installed (model, inputs, num_items_in_batch); re-read "
            "HargoGRPOTrainer._compute_loss") in msg
    assert "trl.GRPOTrainer._generate no longer exists (overridden by HargoGRPOTrainer" in msg
    assert msg.count("\n  ") == 2        # exactly the two planted changes
