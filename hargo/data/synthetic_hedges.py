"""The SFT hedges of the synthetic test bed (:mod:`hargo.data.synthetic`): a reference answer
offered together with a wrong candidate of its own kind, the habit every reward pays less for
(as SFT answers MLPerf verbosely, method.md), so RL has a behaviour to unlearn.

Two styles (``synthetic.sft.hedge_style``), the same candidate and order from the same ``rng``
draws, and the same reward under every configuration:

==============  ===============================  ==================================
task            ``shared`` (default)             ``task_specific``
==============  ===============================  ==================================
syn_yesno       ``"yes or no"`` (label first)    ``"yes/no"``
syn_short       ``"23 or 21"`` (either order)    ``"23|21"``
syn_long        ``"<answer> or <reversed>"``     ``"<answer> vs <reversed>"``
==============  ===============================  ==================================

``shared`` joins every task's candidates with ``" or "``: one habit common to all tasks, which
training any one task can unlearn for all (issue 40's confound). ``task_specific`` gives each
task a marker of its own (:data:`MARKERS`): no character of one task's marker is in another's,
so unlearning one task's hedge teaches nothing about another's. Rewards: the yes/no hedge names
both words (0), the short hedge offers two numbers (tier 1 shared by 2: 0.5), the long hedge
adds one two-letter word and the reversed words (the same unigram and bigram F1 and length
penalty as ``" or "``). Pure Python.
"""
from __future__ import annotations

import random

from hargo.config.synthetic import HEDGE_STYLES, SYNTHETIC_TASKS
from hargo.rewards.race import canonical_label

__all__ = ["MARKERS", "hedge"]

#: The string joining a hedge's two candidates, per style and task.
MARKERS: dict[str, dict[str, str]] = {
    "shared": {"syn_yesno": " or ", "syn_short": " or ", "syn_long": " or "},
    "task_specific": {"syn_yesno": "/", "syn_short": "|", "syn_long": " vs "},
}


def hedge(task: str, answer: str, rng: random.Random, style: str = "shared") -> str:
    """A hedged version of the reference ``answer`` of ``task`` in ``style`` (module docstring):
    the answer and a wrong candidate of its own kind joined by ``MARKERS[style][task]``. ``rng``
    draws the candidate and the order (the same draws in either style).

    - syn_yesno: the label, then the other label: names both, scores 0;
    - syn_short: the sum and a number 1-3 away from it, in a drawn order: tier 1 shared by 2
      numbers, 0.5;
    - syn_long: the answer, then its words reversed: unigram and bigram precision halved and
      past the 1.5x length budget, ~0.5 at the defaults.

    Under the homogeneous (exact-match) rewards every hedge scores 0.

    Raises:
        ValueError: an unknown task or style.
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; valid: {list(SYNTHETIC_TASKS)}")
    if style not in HEDGE_STYLES:
        raise ValueError(f"synthetic.sft.hedge_style: unknown style {style!r}; valid: "
                         f"{list(HEDGE_STYLES)}")
    join = MARKERS[style][task]
    if task == "syn_yesno":
        other = "no" if canonical_label(answer) == "yes" else "yes"
        return f"{answer}{join}{other}"
    if task == "syn_short":
        y = int(answer)
        other = y + rng.choice((-3, -2, -1, 1, 2, 3))
        pair = [str(y), str(other)]
        rng.shuffle(pair)
        return join.join(pair)
    return f"{answer}{join}{' '.join(answer.split()[::-1])}"
