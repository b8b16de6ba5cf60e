"""params.yaml ``rewards``, typed: the task rewards' constants (PLP, MLPerf) and how every reward
and metric reads a completion (a section of :mod:`hargo.config`).

These dataclasses are the rewards' own configs too: :mod:`hargo.rewards` names them
``PLPConfig``, ``MLPerfConfig`` and ``AnswerConfig`` (one definition of each constant, its
range and help). Their fields are ``required`` in params.yaml and carry defaults (method.md's
values) for code that builds one itself; :meth:`PLPReward.from_params` and its siblings read a
block given as a mapping (missing keys keep the defaults).
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Mapping

from hargo.config.fields import knob, node
from hargo.config.knobs import _int, section
from hargo.param_values import ParamsError

__all__ = ["PLPReward", "MLPerfReward", "AnswerRule", "Rewards", "block_items"]


def block_items(d: Any) -> Mapping:
    """The knobs of a params block as a mapping: a typed block (a dataclass instance) by its
    field names, a mapping as it is, None as ``{}``."""
    if d is None:
        return {}
    if is_dataclass(d) and not isinstance(d, type):
        return {f.name: getattr(d, f.name) for f in fields(d)}
    return d


def _numbers(cls: type, d: Any):
    """``cls(**d)`` for a block of int and float constants, each converted to its field's type;
    keys ``d`` lacks keep the defaults, keys ``cls`` lacks are ignored (the typed config refuses
    unknown ones); a block of ``cls`` itself as it is.

    Raises:
        ValueError, TypeError: a value that is not a number of the field's type."""
    if isinstance(d, cls):
        return d
    d = block_items(d)
    return cls(**{f.name: (int if f.type in ("int", int) else float)(d[f.name])
                  for f in fields(cls) if f.name in d})


# ------------------------------------------------------------------------------------ rewards
@section
class PLPReward:
    """``rewards.plp``: constants of the PLP reward (hargo/rewards/plp.py, ``PLPConfig``; not in
    the paper)."""

    format_bonus: float = knob(0.1, "added for non-empty, non-repetitive output", 0,
                               required=True)
    length_budget: int = _int(400, "characters allowed before the length penalty", 0,
                              required=True)
    length_penalty: float = knob(0.0005, "subtracted per character past the budget", 0,
                                 required=True)
    min_reward: float = knob(-1.0, "floor of the reward", required=True)
    batch_size: int = _int(64, "embedding batch size", 1, required=True)
    embed_max_chars: int = _int(2048, "characters of a text the embedder sees", 1)
    repetition_ngram: int = _int(3, "repetitive: < repetition_min_distinct of the word n-grams "
                                    "distinct", 1)
    repetition_min_distinct: float = knob(0.5, "see repetition_ngram", 0, 1, lo_open=True)
    repetition_max_char_run: int = _int(16, "or one non-space character repeated more than "
                                            "this in a row", 1)

    @classmethod
    def from_params(cls, d) -> "PLPReward":
        """From ``rewards.plp``: the typed block, a mapping (missing keys keep the defaults,
        unknown keys are ignored) or None (the defaults).

        Raises:
            ValueError, TypeError: a value that is not a number of the field's type."""
        return _numbers(cls, d)


@section
class MLPerfReward:
    """``rewards.mlperf``: the tiered MLPerf reward (hargo/rewards/mlperf.py, ``MLPerfConfig``;
    the defaults are method.md's)."""

    partial: float = knob(0.5, "reward of a partial answer", 0, 1, required=True)
    overlap_high: float = knob(0.7, "token overlap of the high tier", 0, 1, required=True)
    overlap_high_reward: float = knob(0.2, "reward of the high tier", 0, 1, required=True)
    overlap_low: float = knob(0.4, "token overlap of the low tier", 0, 1, required=True)
    overlap_low_reward: float = knob(0.1, "reward of the low tier", 0, 1, required=True)

    @classmethod
    def from_params(cls, d) -> "MLPerfReward":
        """From ``rewards.mlperf``: the typed block, a mapping (missing keys keep the defaults)
        or None.

        Raises:
            ValueError, TypeError: a value that is not a number of the field's type."""
        return _numbers(cls, d)


@section
class AnswerRule:
    """``rewards.answer``: how every reward and metric reads a completion, and when it is
    degenerate (hargo/rewards/text.py, ``AnswerConfig``). Checked at construction too (a rule
    built by hand: ValueError naming the key)."""

    max_chars: Mapping[str, int] = knob({"race_c": 2048, "race_fortran": 2048, "mlperf": 2048,
                                         "plp": 4096},
                                        "per task: characters past which a completion "
                                        "is degenerate", kind="task_map",
                                        item={"kind": int, "lo": 1, "hi": None}, required=True)
    degenerate_scale: float = knob(0.0, "a degenerate completion's positive reward is "
                                   "multiplied by this", 0, 1, required=True)
    repetition_ngram: int = _int(3, "repetitive: < repetition_min_distinct of the word "
                                    "n-grams distinct", 1, required=True)
    repetition_min_distinct: float = knob(0.5, "see repetition_ngram", 0, 1, lo_open=True,
                                          required=True)
    repetition_max_char_run: int = _int(16, "or one non-space character repeated more "
                                            "than this in a row", 1, required=True)

    def __post_init__(self):
        for task, n in self.max_chars.items():
            if not isinstance(n, int) or n <= 0:
                raise ValueError(f"rewards.answer.max_chars.{task}: must be an int > 0, got {n!r}")
        if self.degenerate_scale == 1:
            raise ParamsError("rewards.answer.degenerate_scale: must be < 1 (a degenerate answer "
                              "earns less than the plain one), got 1")
        if not 0 <= self.degenerate_scale < 1:
            raise ValueError("rewards.answer.degenerate_scale: must be in [0, 1), got "
                             f"{self.degenerate_scale}")
        if self.repetition_ngram < 1 or self.repetition_max_char_run < 1:
            raise ValueError("rewards.answer.repetition_ngram and repetition_max_char_run must "
                             "be >= 1")
        if not 0 < self.repetition_min_distinct <= 1:
            raise ValueError("rewards.answer.repetition_min_distinct must be in (0, 1], got "
                             f"{self.repetition_min_distinct}")

    @classmethod
    def from_params(cls, d) -> "AnswerRule":
        """From ``rewards.answer``: the typed block, a mapping (missing keys keep the defaults)
        or None.

        Raises:
            ValueError: an unknown key, a budget that is not an int > 0, a scale outside [0, 1).
        """
        if isinstance(d, cls):
            return d
        d = dict(block_items(d))
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"rewards.answer: unknown key(s) {unknown}; valid: {sorted(names)}")
        kw: dict[str, Any] = {}
        if "max_chars" in d:
            kw["max_chars"] = {str(k): int(v) for k, v in dict(d["max_chars"]).items()}
        if "degenerate_scale" in d:
            kw["degenerate_scale"] = float(d["degenerate_scale"])
        for name in ("repetition_ngram", "repetition_max_char_run"):
            if name in d:
                kw[name] = int(d[name])
        if "repetition_min_distinct" in d:
            kw["repetition_min_distinct"] = float(d["repetition_min_distinct"])
        return cls(**kw)


@section
class Rewards:
    """``rewards``: the task rewards' constants."""

    plp: PLPReward = node(PLPReward, "the PLP reward")
    mlperf: MLPerfReward = node(MLPerfReward, "the MLPerf reward")
    answer: AnswerRule = node(AnswerRule, "reading a completion")
