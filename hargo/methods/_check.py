"""A method's names resolved against the registries they name (``hargo.advantages``,
``hargo.losses``). Apart from the registry (and ``_``-prefixed, so the registry's discovery does
not import it): it imports torch, which listing or choosing a method must not."""
from __future__ import annotations

from hargo.methods.base import Method

__all__ = ["check_method_names"]


def check_method_names(method: Method) -> None:
    """The names ``method`` refers to exist: its estimator in :data:`hargo.advantages.ESTIMATORS`
    (with the same ``needs_reference``), its policy loss and KL estimator in ``hargo.losses``'
    registries. Run by the trainer when it is built and by ``hargo check-params`` (the params
    stage) for every method of ``rl.methods`` and ``compare.methods``, so a typo in a method
    module stops a run before any stage's outputs are touched. Imports torch (the estimators).

    Raises:
        ValueError: an unknown name (the message lists the valid ones) or a ``needs_reference``
            that is not its estimator's.
    """
    from hargo.advantages import needs_reference
    from hargo.losses import KL_ESTIMATORS, policy_loss
    from hargo.losses._registry import lookup

    if method.estimator is not None and needs_reference(method.estimator) != method.needs_reference:
        raise ValueError(f"method {method.name}: needs_reference={method.needs_reference} but its "
                         f"estimator {method.estimator!r} says "
                         f"{needs_reference(method.estimator)}")
    if method.policy_loss is not None:
        policy_loss(method.policy_loss)
    if method.kl is not None:
        lookup(KL_ESTIMATORS, "KL estimator", method.kl)
