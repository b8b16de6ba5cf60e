"""The uniform-weight controls: HARGO's estimator path (``hargo_uniform``: B1's computation,
``alpha = 0``) with every response weight ``1/G``, so a difference to HARGO is its weighting and
nothing else.

``uniform_sample``
    at GRPO's std convention (sample std + 1e-4): it equals ``grpo`` exactly (loss and gradients,
    tests/test_loss_path.py), the check that HARGO's path adds nothing of its own.
``uniform_pop``
    at HARGO's (population std + 1e-6): ``hargo_b1 - uniform_pop`` is B1's weighting alone, and
    ``uniform_pop - grpo`` the std convention alone.
"""
from __future__ import annotations

from hargo.method_config import GRPOParams, UniformParams
from hargo.methods import Method, register_method

_UNIFORM = dict(family="grpo_family", loss="weighted", policy_loss="clipped_surrogate", kl="k3",
                estimator="hargo_uniform")

UNIFORM_SAMPLE = register_method(Method(
    name="uniform_sample", label="Uniform (sample std)",
    description="control: HARGO's path, weights 1/G, GRPO's sample std", rank=50,
    params_class=GRPOParams, **_UNIFORM))
UNIFORM_POP = register_method(Method(
    name="uniform_pop", label="Uniform (pop. std)",
    description="control: HARGO's path, weights 1/G, HARGO's population std", rank=51,
    params_class=UniformParams, **_UNIFORM))
