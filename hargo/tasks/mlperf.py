"""``mlperf``: short facts about MLPerf benchmarks (HPC-GPT's task 1, ``task1_ml_perf.json``).
Reward: tiered partial credit 1 / 0.5 / 0.2 / 0.1, times the hedging share
(``hargo.rewards.mlperf.mlperf_reward``; the question's own values are excused). Metric: MLPerf
EM (``mlperf_em``: the reference occurs as a whole phrase and no other candidate is offered).
Correct: the full reward 1.0, not degenerate."""
from __future__ import annotations

from hargo.tasks import Metric, RewardBatch, ScoreBatch, Task, mean as _mean, register_task


def mlperf_rewards(batch: RewardBatch) -> list[float]:
    """``hargo.rewards.mlperf.mlperf_reward`` of each completion, with the reward's
    ``config.mlperf`` and the question.

    Raises:
        ValueError: a reference answer that is not a string (names the completion)."""
    from hargo.rewards.mlperf import mlperf_reward

    cfg = batch.reward_fn.config.mlperf
    return [mlperf_reward(text, batch.answer(j), cfg, q)
            for j, (text, q) in enumerate(zip(batch.texts, batch.questions))]


def mlperf_scores(batch: ScoreBatch) -> list[dict]:
    """Per completion ``em`` (bool): ``hargo.rewards.mlperf.mlperf_em`` of a non-degenerate
    completion."""
    from hargo.rewards import question_text
    from hargo.rewards.mlperf import mlperf_em

    return [{"em": not deg and mlperf_em(text, s["answer"], question_text(s.get("prompt")))}
            for s, text, deg in zip(batch.samples, batch.texts, batch.degenerate)]


MLPERF = register_task(Task(
    name="mlperf", description="MLPerf facts, short answers", kind="short_answer",
    reward=mlperf_rewards, score=mlperf_scores, metrics=("mlperf_em",),
    headline=(Metric("mlperf_em", "MLPerf EM", "em", percent=True),),
    summarize=lambda rows: {"mlperf_em": _mean([float(r["em"]) for r in rows])},
    raw_file="task1_ml_perf.json", rank=30))
