"""The synthetic test-bed tasks ``syn_yesno``, ``syn_short``, ``syn_long``
(``hargo.data.synthetic``: records generated from a seed, each task a copy of one real task's
reward shape). Reward: ``hargo.data.synthetic.synthetic_reward`` with the calling reward
function's ``SyntheticConfig`` (:class:`hargo.data.synthetic.SyntheticReward`). They are
registered with ``synthetic=True``: :func:`hargo.tasks.tasks` lists them only when asked, and
the HPC-GPT pipeline's reward and metrics refuse them."""
from __future__ import annotations

from hargo.tasks import RewardBatch, ScoreBatch, Task, register_task


def _synthetic_rewards(name: str):
    def rewards(batch: RewardBatch) -> list[float]:
        """``hargo.data.synthetic.synthetic_reward`` of each completion (the reward function's
        ``config``, a ``SyntheticConfig``)."""
        from hargo.data.synthetic import synthetic_reward

        return [synthetic_reward(name, text, a, lab, batch.reward_fn.config)
                for text, a, lab in zip(batch.texts, batch.answers, batch.labels)]
    return rewards


def _no_scores(batch: ScoreBatch) -> list[dict]:
    """No per-task evaluation fields (the test bed's report reads the rewards:
    ``hargo.compare.synthetic``)."""
    return [{} for _ in batch.samples]


for _rank, (_name, _kind, _copies) in enumerate((
        ("syn_yesno", "yes_no", "race_c"), ("syn_short", "short_answer", "mlperf"),
        ("syn_long", "sentence", "plp"))):
    register_task(Task(
        name=_name, description=f"synthetic {_kind.replace('_', '/')} task, {_copies}'s reward "
                                f"shape", kind=_kind, reward=_synthetic_rewards(_name),
        score=_no_scores, labelled=_kind == "yes_no", synthetic=True,
        rank=100 + 10 * _rank))
