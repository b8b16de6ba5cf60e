"""The seam to TRL (hargo/training/trl_seam.py): every private upstream method hargo's trainers
override, and every private upstream attribute or method hargo uses without overriding it, is
declared and written in hargo/training/trl_overrides.py (one module; no other hargo module names
one), each declared signature and attribute shape is the installed one, and a change fails with
a message naming it and both forms. Where a public hook serves (the loss, the metrics' log), it
is used instead."""
from __future__ import annotations

from collections import defaultdict, deque
from types import SimpleNamespace

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
        check_seam(grpo_only, resolve, uses=())
    msg = str(err.value)
    assert ("trl.GRPOTrainer._calculate_rewards changed its parameters: written against (inputs, "
            "prompts, completions, completion_ids_list), installed (inputs, prompts, completions, "
            "completion_ids_list, reward_kwargs); re-read GRPOOverrides._calculate_rewards") in msg
    assert "trl.GRPOTrainer._generate no longer exists (overridden by GRPOOverrides" in msg
    assert msg.count("\n  ") == 2        # exactly the two planted changes


def test_the_public_hooks_replace_the_dropped_overrides():
    """The loss, hargo's metrics, the resume's method state and the sampler's epoch go through
    public hooks (``compute_loss``, ``log``, ``train``, ``on_epoch_begin``), not TRL's private
    ``_compute_loss``, ``_metrics``, ``_load_optimizer_and_scheduler`` or transformers'
    ``_run_epoch``."""
    from hargo.training.grpo_loss import GroupWeightedLossMixin
    from hargo.training.resume import SamplerEpochCallback

    assert {"compute_loss", "log", "record_metric"} <= set(vars(GroupWeightedLossMixin))

    for cls in _trainer_classes()[:2]:
        for name in ("_compute_loss", "_load_optimizer_and_scheduler", "_run_epoch"):
            assert not any(name in vars(k) for k in cls.__mro__
                           if k.__module__.startswith("hargo")), (cls.__name__, name)
    assert "on_epoch_begin" in vars(SamplerEpochCallback)


# ------------------------------------------------- private names used without overriding

def _private_names():
    from hargo.training.trl_seam import upstream_private_names

    return upstream_private_names(*_trainer_classes())


def test_no_hargo_module_but_trl_overrides_names_a_private_upstream_name():
    """Every TRL/transformers private attribute or method hargo reads, writes, calls or
    overrides is named in hargo/training/trl_overrides.py only (an AST scan of the package)."""
    from hargo.training.trl_seam import private_name_uses

    names = _private_names()
    assert {"_logs", "_metrics", "_compute_loss", "_tokenizer", "_get_output_dir"} <= names
    outside = private_name_uses(names)
    assert not outside, ("private TRL/transformers names used outside "
                         "hargo/training/trl_overrides.py (use a public API, or add an accessor "
                         "there and declare it in trl_seam.PRIVATE_USES):\n  "
                         + "\n  ".join(outside))


def test_every_private_name_trl_overrides_uses_is_declared():
    from hargo.training.trl_seam import OVERRIDES, PRIVATE_USES, private_name_uses

    used = {u.rsplit(".", 1)[1] for u in private_name_uses(_private_names(), exclude=())}
    declared = {o.name for o in OVERRIDES} | {u.name for u in PRIVATE_USES}
    assert used == declared, (sorted(used - declared), sorted(declared - used))
    assert all(u.why and u.via for u in PRIVATE_USES)
    from hargo.training.trl_overrides import GRPOOverrides

    for u in PRIVATE_USES:                    # each accessor exists where it is declared
        assert all(v in vars(GRPOOverrides) for v in u.via), u


def test_the_installed_trl_sets_and_reads_the_private_attributes_as_declared():
    """TRL 1.16's source: ``GRPOTrainer.__init__`` sets ``_logs`` as a dict of deques with the
    prompt, completion and advantage columns, and ``GRPOTrainer.log`` reads them."""
    from trl import GRPOTrainer

    from hargo.training.trl_seam import PRIVATE_USES, _dict_assigned, _subscripts_read

    (logs,) = [u for u in PRIVATE_USES if u.kind == "attribute"]
    assert logs.name == "_logs" and logs.shape == ("prompt", "completion", "advantages")
    set_in_init = _dict_assigned(GRPOTrainer.__init__, "_logs")
    assert set_in_init is not None, "TRL's GRPOTrainer.__init__ no longer sets self._logs"
    assert {k: set_in_init.get(k) for k in logs.shape} == dict.fromkeys(logs.shape, "deque"), \
        f"TRL's GRPOTrainer.__init__ sets self._logs = {set_in_init} (key: callee)"
    read = _subscripts_read(GRPOTrainer.log, "_logs")
    assert set(logs.shape) <= read, f"TRL's GRPOTrainer.log reads self._logs{sorted(read)} only"


def test_a_changed_private_attribute_or_called_method_is_a_readable_error():
    """Planted changes: TRL's ``__init__`` stops setting ``_logs`` (or makes a column a list),
    its ``log`` stops reading the advantage column, and transformers' ``_get_output_dir`` gains a
    parameter."""
    from trl import GRPOTrainer

    from hargo.training.trl_seam import SeamDriftError, check_seam

    class Renamed(GRPOTrainer):
        def __init__(self):   # noqa: D401  (sets a renamed attribute)
            self._completion_logs = {"prompt": None}

        def log(self, logs, start_time=None):
            return self._completion_logs["prompt"]

        def _get_output_dir(self, trial, run_name):
            raise NotImplementedError

    with pytest.raises(SeamDriftError) as err:
        check_seam((), lambda owner: Renamed)
    msg = str(err.value)
    assert ("trl.GRPOTrainer._logs is no longer set in Renamed.__init__ (used by "
            "GRPOOverrides.scored_with_logged_texts, GRPOOverrides.set_logged_texts, "
            "GRPOOverrides.set_logged_advantages: the columns of TRL's completions table") in msg
    assert ("transformers.Trainer._get_output_dir changed its parameters: written against "
            "(trial), installed (trial, run_name); re-read GRPOOverrides._save_checkpoint") in msg
    assert msg.count("\n  ") == 2

    class Reshaped(GRPOTrainer):
        def __init__(self):
            self._logs = {"prompt": deque(), "completion": deque(), "advantages": []}

        def log(self, logs, start_time=None):
            return self._logs["prompt"], self._logs["completion"]

    with pytest.raises(SeamDriftError) as err:
        check_seam((), lambda owner: Reshaped)
    msg = str(err.value)
    assert ("trl.GRPOTrainer._logs changed its shape: written against a dict of deques with "
            "keys (prompt, completion, advantages), installed keys (prompt: deque, completion: "
            "deque, advantages: )") in msg
    assert ("trl.GRPOTrainer._logs: Reshaped.log no longer reads its column(s) advantages") in msg


def test_a_trainer_without_the_private_attribute_is_a_readable_error():
    """The check a trainer runs when built (``check_trainer_attributes``), with ``_logs`` taken
    away from a trainer-like object, then with a column of another type."""
    from hargo.training.trl_seam import SeamDriftError, check_trainer_attributes

    trainer = SimpleNamespace(_logs={"prompt": deque(), "completion": deque(),
                                     "advantages": deque(), "rewards": defaultdict(deque)})
    check_trainer_attributes(trainer)
    del trainer._logs
    with pytest.raises(SeamDriftError, match=r"trl\.GRPOTrainer\._logs: the trainer has no such "
                       r"attribute, not a dict of deques \(used by GRPOOverrides\."
                       r"scored_with_logged_texts, "):
        check_trainer_attributes(trainer)
    trainer._logs = {"prompt": deque(), "completion": [], "advantages": deque()}
    with pytest.raises(SeamDriftError, match=r"_logs: key\(s\) not a deque: completion \(list\); "
                       r"re-read GRPOOverrides\.scored_with_logged_texts"):
        check_trainer_attributes(trainer)


def test_hargo_metrics_are_logged_as_trl_averages_its_own():
    """``record_metric`` + the public ``log``: each metric the mean of its logging window's
    values, NaN left out, None when none is left, ``eval_`` in evaluation, then cleared (TRL
    1.16's ``GRPOTrainer.log`` over its ``_metrics``)."""
    from hargo.training.grpo_loss import GroupWeightedLossMixin

    class Upstream:
        def log(self, logs, start_time=None):
            self.logged.append(dict(logs))

    class Trainer(GroupWeightedLossMixin, Upstream):
        pass

    t = Trainer()
    t.logged, t.model = [], SimpleNamespace(training=True)
    t.hargo_metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    for v in (1.0, float("nan"), 4.0):
        t.record_metric("kl", v)
    t.record_metric("ppo/kl", float("nan"))
    t.record_metric("entropy", 2.0, "eval")
    t.log({"loss": 0.5})
    assert t.logged == [{"loss": 0.5, "kl": 2.5, "ppo/kl": None}]
    assert not t.hargo_metrics["train"] and t.hargo_metrics["eval"]["entropy"] == [2.0]
    t.model.training = False
    t.log({"eval_loss": 0.1})
    assert t.logged[-1] == {"eval_loss": 0.1, "eval_entropy": 2.0}
    assert not t.hargo_metrics["eval"]
