"""params.yaml ``rewards``, typed: the task rewards' constants (PLP, MLPerf) and how every reward
and metric reads a completion (a section of :mod:`hargo.config`).
"""
from __future__ import annotations

from typing import Mapping

from hargo.config.fields import REQUIRED, knob, node
from hargo.config.knobs import _int, section
from hargo.param_values import ParamsError

__all__ = ["PLPReward", "MLPerfReward", "AnswerRule", "Rewards"]


# ------------------------------------------------------------------------------------ rewards
@section
class PLPReward:
    """``rewards.plp``: constants of the PLP reward (hargo/rewards/plp.py; not in the paper)."""

    format_bonus: float = knob(REQUIRED, "added for non-empty, non-repetitive output", 0)
    length_budget: int = _int(REQUIRED, "characters allowed before the length penalty", 0)
    length_penalty: float = knob(REQUIRED, "subtracted per character past the budget", 0)
    min_reward: float = knob(REQUIRED, "floor of the reward")
    batch_size: int = _int(REQUIRED, "embedding batch size", 1)
    embed_max_chars: int = _int(2048, "characters of a text the embedder sees", 1)
    repetition_ngram: int = _int(3, "repetitive: < repetition_min_distinct of the word n-grams "
                                    "distinct", 1)
    repetition_min_distinct: float = knob(0.5, "see repetition_ngram", 0, 1, lo_open=True)
    repetition_max_char_run: int = _int(16, "or one non-space character repeated more than "
                                            "this in a row", 1)


@section
class MLPerfReward:
    """``rewards.mlperf``: the tiered MLPerf reward (hargo/rewards/mlperf.py)."""

    partial: float = knob(REQUIRED, "reward of a partial answer", 0, 1)
    overlap_high: float = knob(REQUIRED, "token overlap of the high tier", 0, 1)
    overlap_high_reward: float = knob(REQUIRED, "reward of the high tier", 0, 1)
    overlap_low: float = knob(REQUIRED, "token overlap of the low tier", 0, 1)
    overlap_low_reward: float = knob(REQUIRED, "reward of the low tier", 0, 1)


@section
class AnswerRule:
    """``rewards.answer``: how every reward and metric reads a completion, and when it is
    degenerate (hargo/rewards/text.py)."""

    max_chars: Mapping[str, int] = knob(REQUIRED, "per task: characters past which a completion "
                                        "is degenerate", kind="task_map",
                                        item={"kind": int, "lo": 1, "hi": None})
    degenerate_scale: float = knob(REQUIRED, "a degenerate completion's positive reward is "
                                   "multiplied by this", 0, 1)
    repetition_ngram: int = _int(REQUIRED, "repetitive: < repetition_min_distinct of the word "
                                           "n-grams distinct", 1)
    repetition_min_distinct: float = knob(REQUIRED, "see repetition_ngram", 0, 1, lo_open=True)
    repetition_max_char_run: int = _int(REQUIRED, "or one non-space character repeated more "
                                                  "than this in a row", 1)

    @staticmethod
    def _after(value: "AnswerRule", key: str, root: Mapping) -> None:
        if value.degenerate_scale == 1:
            raise ParamsError("rewards.answer.degenerate_scale: must be < 1 (a degenerate answer "
                              "earns less than the plain one), got 1")


@section
class Rewards:
    """``rewards``: the task rewards' constants."""

    plp: PLPReward = node(PLPReward, "the PLP reward")
    mlperf: MLPerfReward = node(MLPerfReward, "the MLPerf reward")
    answer: AnswerRule = node(AnswerRule, "reading a completion")
