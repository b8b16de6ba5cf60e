"""``plp``: sentence-length answers about programming-language processing (HPC-GPT's task 1,
``task1_plp.json``). Reward: MiniLM cosine with the reference plus a format bonus minus a length
penalty (``hargo.rewards.plp.plp_rewards``: one batched embedding pass). Metric: PLP Similarity
(``plp_similarity``: the plain cosine). Correct: a reward >= :data:`PLP_CORRECT_THRESHOLD`, not
degenerate -- the one rule of training's accuracy and evaluation's ``accuracy_plp``."""
from __future__ import annotations

from hargo.tasks import Metric, RewardBatch, ScoreBatch, Task, mean as _mean, register_task

#: plp has no exact answer: a completion counts as correct when its reward (MiniLM cosine plus
#: the format bonus minus the length penalty, a degenerate completion's scaled down) reaches
#: this value.
PLP_CORRECT_THRESHOLD = 0.5


def plp_batch_rewards(batch: RewardBatch) -> list[float]:
    """``hargo.rewards.plp.plp_rewards`` of the batch with the reward's ``config.plp`` and
    ``scorer``.

    Raises:
        ValueError: a reference answer that is not a string (names the completion)."""
    from hargo.rewards.plp import plp_rewards

    references = [batch.answer(j) for j in range(len(batch.texts))]
    return plp_rewards(list(batch.texts), references, batch.reward_fn.config.plp,
                       batch.reward_fn.scorer)


def plp_scores(batch: ScoreBatch) -> list[dict]:
    """Per completion ``similarity``: the plain MiniLM cosine with the reference
    (``TaskReward.plp_similarity``, one batched pass)."""
    sims = batch.reward_fn.plp_similarity(list(batch.texts),
                                          [s["answer"] for s in batch.samples])
    return [{"similarity": float(x)} for x in sims]


PLP = register_task(Task(
    name="plp", description="programming-language processing, sentence-length answers",
    kind="sentence", reward=plp_batch_rewards, score=plp_scores,
    correct_threshold=PLP_CORRECT_THRESHOLD, metrics=("plp_similarity",),
    # rank 25: the paper's column order, PLP similarity before MLPerf EM
    headline=(Metric("plp_similarity", "PLP sim", "similarity", rank=25),),
    summarize=lambda rows: {"plp_similarity": _mean([r["similarity"] for r in rows])},
    raw_file="task1_plp.json", rank=40))
