"""params.yaml ``synthetic``, typed: the blocks of the synthetic test bed
(:mod:`hargo.compare.synthetic`), each a frozen dataclass of :func:`~hargo.config.fields.knob`
fields like the other sections of :mod:`hargo.config`.

The test bed's own dataclasses are these: :class:`SyntheticData` is
:class:`hargo.data.synthetic.SyntheticConfig` (the generated tasks), :class:`SyntheticPolicy` is
:class:`hargo.models.tiny.TinyPolicyConfig` (the tiny policy), and
:class:`hargo.config.Synthetic` (the whole block) is :class:`hargo.compare.synthetic_plan.SyntheticPlan`.
So the rules (ranges, choices, per-task maps, the pool's size) live here once; a block
constructed in code (``SyntheticData(difficulty=1)``) is checked by the same knobs as one read
from params.yaml. Every key is named ``synthetic.<block>.<key>`` in an error.

Imports: :mod:`hargo.param_values`, :mod:`hargo.config.fields`, :mod:`hargo.config.synthetic_rules`
(the rules relating the blocks) and, lazily, :mod:`hargo.config`
(to build a block from a mapping) and :mod:`hargo.config.registries` (the method registry's
look-ups, for ``synthetic.methods``). Nothing of
the generator, the tiny model, training or comparison.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from hargo.config.fields import REQUIRED, check_value, knob, node
from hargo.config.synthetic_rules import check_synthetic, check_synthetic_keys
from hargo.param_values import ParamsError, as_number

__all__ = ["SYNTHETIC_TASKS", "YESNO_QUESTIONS", "POOLS", "CONFLICTS", "HEDGE_STYLES",
           "SyntheticData", "SyntheticPolicy", "SyntheticSFT", "SyntheticDynamicSampling",
           "SyntheticRL", "SyntheticEvaluate", "SyntheticBootstrap",
           "check_synthetic_keys", "check_synthetic"]

_block = dataclass(frozen=True, kw_only=True)

#: The synthetic tasks (hargo/data/synthetic.py), the keys of every per-task map here.
SYNTHETIC_TASKS: tuple[str, ...] = ("syn_yesno", "syn_short", "syn_long")
#: syn_yesno's question kinds (``synthetic.data.yesno_question``).
YESNO_QUESTIONS: tuple[str, ...] = ("last_even", "mixed")
#: ``synthetic.rl.pool``: the RL pool from the train records SFT did not see, or from all.
POOLS: tuple[str, ...] = ("held_out", "all")
#: ``synthetic.data.conflict``: none, or syn_short asked in syn_yesno's question surface.
CONFLICTS: tuple[str, ...] = ("none", "shared_surface")
#: ``synthetic.sft.hedge_style``: one " or " hedge for every task, or a marker of each task's own.
HEDGE_STYLES: tuple[str, ...] = ("shared", "task_specific")

_DATA_SRC = "params.yaml synthetic.data (defaults: hargo/config/synthetic.py)"
_POLICY_SRC = "params.yaml synthetic.policy (defaults: hargo/config/synthetic.py)"


def _int(default=REQUIRED, help="", lo=None, hi=None, **kw):
    return knob(default, help, lo, hi, kind=int, **kw)


def _per_task_map(help: str, lo: int):
    """A ``task -> integer >= lo`` map over exactly :data:`SYNTHETIC_TASKS` (checked by the
    block's ``_check``, :func:`_per_task`)."""
    return knob(REQUIRED, f"{help} (one integer >= {lo} per task: "
                          f"{', '.join(SYNTHETIC_TASKS)})", kind="any", item={"lo": lo})


def _per_task(v: Any, where: str, lo: int) -> dict:
    """``v`` as ``{task: int}`` over exactly :data:`SYNTHETIC_TASKS`, each >= ``lo``.

    Raises:
        ParamsError: not a mapping (``<where>: expected one integer per task ...``), a task
            named that is not a synthetic one (``<where>.<task>: unknown task ...``) or one left
            out (``<where>.<task>: missing ...``), or a bad count (``<where>.<task>: expected
            an integer >= lo``)."""
    if not isinstance(v, Mapping):
        raise ParamsError(f"{where}: expected one integer per task {list(SYNTHETIC_TASKS)}, "
                          f"got {v!r}")
    for t in v:
        if t not in SYNTHETIC_TASKS:
            raise ParamsError(f"{where}.{t}: unknown task {t!r}; valid synthetic tasks: "
                              f"{', '.join(SYNTHETIC_TASKS)}")
    for t in SYNTHETIC_TASKS:
        if t not in v:
            raise ParamsError(f"{where}.{t}: missing (no key '{where}.{t}'; one integer per "
                              f"task: {', '.join(SYNTHETIC_TASKS)})")
    out = {}
    for t in SYNTHETIC_TASKS:
        n = as_number(f"{where}.{t}", v[t], integer=True)
        if n < lo:
            raise ParamsError(f"{where}.{t}: expected an integer >= {lo}, got {v[t]!r}")
        out[t] = n
    return out


class _Checked:
    """A block that checks its own fields by their knobs when constructed (in code or by
    :func:`hargo.config.as_section`), named ``<_where>.<field>``, and is built from a mapping
    by :meth:`from_params`."""

    _where = "synthetic"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.metadata.get("kind") in (int, float, bool, str):
                v = check_value(f"{self._where}.{f.name}", getattr(self, f.name), f.metadata)
                object.__setattr__(self, f.name, v)       # 4.0 -> 4 for an int field
        self._rules()

    def _rules(self) -> None:
        """The block's rules that relate fields (none by default)."""

    @classmethod
    def from_params(cls, d: Mapping | None):
        """The block from a params mapping; missing keys keep the defaults, None is an empty
        block.

        Raises:
            ParamsError: a ValueError naming the key: an unknown key
                (``synthetic.<block>.<key>: unknown key (known: ...)``), a value of the wrong
                type or out of range, a missing required key."""
        from hargo.config.build import _build

        return _build(cls, {} if d is None else dict(d), cls._where, {})


# ------------------------------------------------------------------------------------- data
@_block
class SyntheticData(_Checked):
    """``synthetic.data``: the generated tasks (hargo/data/synthetic.py, whose module docstring
    defines the tasks and rewards); seeded by ``seed``. Missing keys keep these defaults.

    Attributes:
        n_train, n_eval: examples per task in the train and eval split.
        difficulty: length of the integer lists of syn_yesno and syn_short (>= 2); syn_short's
            integers are drawn from 1..(10 * difficulty), so sums grow with it too.
        short_terms: syn_short's list length and range (1..10 * short_terms) instead of
            ``difficulty`` when > 0 (>= 2; 0: ``difficulty``), so the sum can be made easier
            without shrinking syn_yesno's prompt space.
        long_answer_words: words in every syn_long reference answer (>= 2).
        homogeneous: the control: every task gets a 0/1 exact-match reward (set per reward
            configuration by the test bed; params.yaml leaves it false).
        heterogeneity: h in [0, 1], the weight of syn_short's and syn_long's graded rewards
            against their exact-match rewards: ``h * graded + (1 - h) * exact``; 1 (default)
            the graded rewards, 0 the control's rewards (``homogeneous`` wins over it).
        yesno_question: syn_yesno's question: ``"last_even"`` (is the last of ``difficulty``
            digits even: one token decides) or ``"mixed"`` (sum parity, a repeated number or
            sorted order, drawn per example).
        scale_yesno, scale_short, scale_long: multiply the task's reward (>= 0).
        long_budget_ratio: syn_long's length budget, in multiples of the reference's characters.
        long_length_penalty: syn_long's penalty per character past the budget.
        long_min_reward: floor of syn_long's reward (before the scale).
        noise_yesno, noise_short, noise_long: std (>= 0, in the task's unscaled reward units) of
            the Gaussian noise added to every *training* reward of the task, then multiplied by
            its scale (:class:`hargo.data.synthetic_noise.NoisyReward`: seeded by the RL seed, one
            stream per task; not clipped, so a reward may leave the task's range). 0 (default):
            no noise. Evaluation scores the clean reward.
        conflict: ``"none"`` (default) or ``"shared_surface"``: syn_short's prompt asks its sum
            in syn_yesno's ``last_even`` question ("Is the last number of 12 7 25 even? Answer
            with the sum of the numbers only."), so the two tasks' rewards pay for different
            first tokens (yes/no against a number) after the same question words: their
            gradients conflict by construction. Same numbers and answers as ``"none"``.

    Raises:
        ParamsError: (a ValueError) a field out of its range, named ``synthetic.data.<key>``.
    """

    _where = "synthetic.data"

    n_train: int = _int(200, "examples per task in the train split", 0, source=_DATA_SRC)
    n_eval: int = _int(50, "examples per task in the eval split", 0, source=_DATA_SRC)
    difficulty: int = _int(5, "list length of syn_yesno / syn_short (syn_short's numbers "
                              "1..10*difficulty)", 2, source=_DATA_SRC)
    short_terms: int = _int(0, "> 0: syn_short's list length instead (numbers 1..10*short_terms"
                               "); 0 or >= 2", 0, source=_DATA_SRC)
    long_answer_words: int = _int(18, "words of every syn_long answer", 2, source=_DATA_SRC)
    homogeneous: bool = knob(False, "every task a 0/1 exact-match reward (the control; set per "
                                    "configuration, leave it false)", kind=bool,
                             source=_DATA_SRC)
    heterogeneity: float = knob(1.0, "h: syn_short/syn_long reward = h * graded + (1 - h) * "
                                     "exact match", 0, 1, source=_DATA_SRC)
    yesno_question: str = knob("last_even", "syn_yesno's question", kind=str,
                               choices=YESNO_QUESTIONS, source=_DATA_SRC)
    scale_yesno: float = knob(1.0, "syn_yesno's reward scale", 0, source=_DATA_SRC)
    scale_short: float = knob(1.0, "syn_short's reward scale", 0, source=_DATA_SRC)
    scale_long: float = knob(1.0, "syn_long's reward scale", 0, source=_DATA_SRC)
    long_budget_ratio: float = knob(1.5, "syn_long: characters past this multiple of the "
                                         "reference's cost the penalty", 0, source=_DATA_SRC)
    long_length_penalty: float = knob(0.002, "syn_long: penalty per character past the budget",
                                      0, source=_DATA_SRC)
    long_min_reward: float = knob(0.0, "floor of syn_long's reward (before the scale)",
                                  hi=1, source=_DATA_SRC)
    noise_yesno: float = knob(0.0, "std of Gaussian noise on syn_yesno's training reward", 0,
                              source=_DATA_SRC)
    noise_short: float = knob(0.0, "std of Gaussian noise on syn_short's training reward", 0,
                              source=_DATA_SRC)
    noise_long: float = knob(0.0, "std of Gaussian noise on syn_long's training reward", 0,
                             source=_DATA_SRC)
    conflict: str = knob("none", "shared_surface: syn_short asked in syn_yesno's question "
                                 "surface (the two tasks' gradients conflict)", kind=str,
                         choices=CONFLICTS, source=_DATA_SRC)

    def _rules(self) -> None:
        if self.short_terms == 1:
            raise ParamsError(f"{self._where}.short_terms: must be 0 or >= 2, got 1")

    def scale(self, task: str) -> float:
        """The reward scale of ``task``.

        Raises:
            ValueError: ``task`` is not a synthetic task."""
        if task not in SYNTHETIC_TASKS:
            raise ValueError(f"unknown synthetic task {task!r}; valid: {list(SYNTHETIC_TASKS)}")
        return {"syn_yesno": self.scale_yesno, "syn_short": self.scale_short,
                "syn_long": self.scale_long}[task]

    def noise(self, task: str) -> float:
        """The std of the Gaussian noise on ``task``'s training reward (unscaled units).

        Raises:
            ValueError: ``task`` is not a synthetic task."""
        self.scale(task)
        return {"syn_yesno": self.noise_yesno, "syn_short": self.noise_short,
                "syn_long": self.noise_long}[task]


# ----------------------------------------------------------------------------------- policy
@_block
class SyntheticPolicy(_Checked):
    """``synthetic.policy``: the tiny policy's architecture (hargo/models/tiny.py). Missing keys
    keep these defaults.

    Attributes:
        tokenizer: ``"small"`` (a byte-level BPE of ``vocab_size`` tokens trained on the task
            texts) or ``"project"`` (SmolLM2's tokenizer from the embedded model package).
        vocab_size: the small tokenizer's vocabulary, >= 300 (256 bytes + specials + merges).
        hidden_size, num_layers, num_heads, intermediate_size: the Llama network
            (``hidden_size`` divisible by ``num_heads``).
        max_positions: context length in tokens.

    Raises:
        ParamsError: (a ValueError) a field out of its range, named ``synthetic.policy.<key>``.
    """

    _where = "synthetic.policy"

    tokenizer: str = knob("small", "small (a BPE trained on the train split) | project "
                                   "(SmolLM2's)", kind=str, choices=("small", "project"),
                          source=_POLICY_SRC)
    vocab_size: int = _int(512, "the small tokenizer's vocabulary", 300, source=_POLICY_SRC)
    hidden_size: int = _int(256, "hidden size (divisible by num_heads)", 1, source=_POLICY_SRC)
    num_layers: int = _int(4, "decoder layers", 1, source=_POLICY_SRC)
    num_heads: int = _int(4, "attention heads", 1, source=_POLICY_SRC)
    intermediate_size: int = _int(768, "MLP width", 1, source=_POLICY_SRC)
    max_positions: int = _int(512, "context length in tokens", 1, source=_POLICY_SRC)

    def _rules(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ParamsError(f"{self._where}.hidden_size {self.hidden_size} is not divisible "
                              f"by num_heads {self.num_heads}")


# -------------------------------------------------------------------------------------- sft
@_block
class SyntheticSFT(_Checked):
    """``synthetic.sft``: full fine-tuning of the tiny policy on the first
    ``examples_per_task`` train records of each task.

    Attributes:
        epochs, learning_rate, batch_size, max_length (tokens): the SFT run.
        examples_per_task: task -> the first n train records of the task SFT sees (0 leaves a
            task to RL alone).
        hedge_share: the share of each task's SFT targets written as a hedge
            (:func:`hargo.data.synthetic.hedge`), a habit every reward pays less for, so RL has
            a behaviour to unlearn.
        hedge_style: ``"shared"`` (default: every task's hedge joins its candidates with
            ``" or "``, one habit shared by all tasks) or ``"task_specific"`` (each task its own
            marker, no character shared: ``"yes/no"``, ``"23|21"``, ``"<answer> vs
            <reversed>"``; each pays what the shared hedge pays:
            :mod:`hargo.data.synthetic_hedges`).
    """

    _where = "synthetic.sft"

    epochs: int = _int(help="SFT epochs", lo=1)
    learning_rate: float = knob(REQUIRED, "peak learning rate", 0, lo_open=True)
    batch_size: int = _int(help="examples per step", lo=1)
    max_length: int = _int(help="tokens of an example, at most", lo=1)
    examples_per_task: Mapping[str, int] = _per_task_map("the first n train records per task "
                                                         "SFT sees", 0)
    hedge_share: float = knob(REQUIRED, "share of SFT targets written as a hedge", 0, 1)
    hedge_style: str = knob("shared", "shared (' or ' in every task's hedge) | task_specific "
                                      "(a marker of each task's own)", kind=str,
                            choices=HEDGE_STYLES)

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        _check_maps(SyntheticSFT, raw, key)

    def _rules(self) -> None:
        if not any(self.examples_per_task.values()):
            raise ParamsError(f"{self._where}.examples_per_task: SFT needs at least one example")


# --------------------------------------------------------------------------------------- rl
@_block
class SyntheticDynamicSampling(_Checked):
    """``synthetic.rl.dynamic_sampling``: DAPO's dynamic sampling in the test bed, the keys of
    the main pipeline's ``rl.dynamic_sampling`` (:class:`hargo.config.DynamicSampling`,
    :mod:`hargo.training.dynamic_sampling`), the bed's own so that the main block never reaches
    it. Missing: off."""

    _where = "synthetic.rl.dynamic_sampling"

    enabled: bool = knob(False, "drop zero-variance groups and refill the step", kind=bool)
    refill_factor: float = knob(2.0, "prompts drawn per missing group in a refill round", 1)
    max_refills: int = _int(1, "refill rounds per step", 0)


@_block
class SyntheticRL(_Checked):
    """``synthetic.rl``: the RL shared by every method and seed (each method's own knobs are
    the main pipeline's ``rl.<method>``).

    Attributes:
        prompts_per_task: task -> prompts in the RL pool (the task mix; 0 leaves a task out).
        pool: ``held_out`` (drawn from the train records SFT did not see, those past
            ``synthetic.sft.examples_per_task``) or ``all`` (from every train record).
        steps, prompts_per_step, num_generations (G): the RL run.
        max_new_tokens: task -> the completion budget in tokens.
        temperature: the rollout sampling temperature.
        learning_rate: the peak learning rate.
        prompts_per_step_per_task: None (default: a step draws its ``prompts_per_step`` prompts
            from the shuffled pool, so the task mix of a step varies) or task -> the prompts of
            that task in every step, summing to ``prompts_per_step``, the pool unchanged
            (:class:`hargo.training.sampling.TaskQuotaSampler`; a dynamic-sampling refill still
            draws from the whole pool).
        dynamic_sampling: :class:`SyntheticDynamicSampling` (default off).
    """

    _where = "synthetic.rl"

    prompts_per_task: Mapping[str, int] = _per_task_map("prompts per task in the RL pool", 0)
    pool: str = knob(REQUIRED, "held_out: the pool from train records SFT did not see | all",
                     kind=str, choices=POOLS)
    steps: int = _int(help="optimizer steps", lo=1)
    prompts_per_step: int = _int(help="prompts per step", lo=1)
    num_generations: int = _int(help="G, completions per prompt (>= 2 like rl.num_generations: a "
                                     "group of one has no advantage)", lo=2)
    max_new_tokens: Mapping[str, int] = _per_task_map("completion budget per task", 1)
    temperature: float = knob(REQUIRED, "rollout sampling temperature", 0, lo_open=True)
    learning_rate: float = knob(REQUIRED, "peak learning rate", 0, lo_open=True)
    prompts_per_step_per_task: Mapping[str, int] | None = knob(
        None, "task -> prompts of that task in every step (summing to prompts_per_step); "
              "null: drawn from the pool's mix", kind="any", item={"lo": 0}, nullable=True)
    dynamic_sampling: SyntheticDynamicSampling = node(
        SyntheticDynamicSampling, "DAPO's dynamic sampling in the bed (default off)",
        default=SyntheticDynamicSampling())

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        _check_maps(SyntheticRL, raw, key)

    def _rules(self) -> None:
        pool = sum(self.prompts_per_task.values())
        if pool < self.prompts_per_step:
            raise ParamsError(f"{self._where}.prompts_per_task: {pool} prompts in the pool, "
                              f"fewer than prompts_per_step {self.prompts_per_step}")
        quota, key = self.prompts_per_step_per_task, f"{self._where}.prompts_per_step_per_task"
        if quota is None:
            return
        quota = _per_task(quota, key, 0)
        if sum(quota.values()) != self.prompts_per_step:
            raise ParamsError(f"{key}: {quota} sums to {sum(quota.values())}, not "
                              f"prompts_per_step {self.prompts_per_step}")
        short = {t: n for t, n in quota.items() if n > self.prompts_per_task[t]}
        if short:
            raise ParamsError(f"{key}: {short} exceed the task's pool "
                              f"(synthetic.rl.prompts_per_task {dict(self.prompts_per_task)})")


# --------------------------------------------------------------------------------- evaluate
@_block
class SyntheticEvaluate(_Checked):
    """``synthetic.evaluate``: the greedy evaluation of every policy.

    Attributes:
        max_new_tokens: task -> tokens of the greedy evaluation.
        samples: k >= 0; with k > 0 every evaluation also draws k completions per prompt at
            ``synthetic.rl.temperature`` and reports their mean reward (``sampled_reward``).
        every_steps: evaluate the policy also every this many RL steps (0: at the end only).
    """

    _where = "synthetic.evaluate"

    max_new_tokens: Mapping[str, int] = _per_task_map("completion budget per task", 1)
    samples: int = _int(0, "k sampled completions per prompt besides the greedy one (0: none)",
                        0)
    every_steps: int = _int(0, "evaluate also every N RL steps (0: at the end only)", 0)

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        _check_maps(SyntheticEvaluate, raw, key)


# -------------------------------------------------------------------------------- bootstrap
@_block
class SyntheticBootstrap(_Checked):
    """``synthetic.bootstrap``: the paired two-level bootstrap of the report."""

    _where = "synthetic.bootstrap"

    resamples: int = _int(help="bootstrap resamples", lo=1)
    confidence: float = knob(REQUIRED, "interval confidence", 0, 1, lo_open=True, hi_open=True)


def _check_maps(cls, raw: Mapping, key: str) -> None:
    """The per-task maps of block ``cls`` in ``raw``, checked and normalised in place."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("item") is not None and f.name in raw \
                and not (raw[f.name] is None and f.metadata.get("nullable")):
            v = _per_task(raw[f.name], f"{key}.{f.name}", f.metadata["item"]["lo"])
            if isinstance(raw, dict):
                raw[f.name] = v
