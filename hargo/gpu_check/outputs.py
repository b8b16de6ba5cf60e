"""What the GPU check writes besides ``results.json``: every eval answer
(``generations.jsonl.gz``, for ``--rescore``) and the two figures (``speed.png``,
``compare.png``)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Mapping, Sequence


def _write_generations(path: Path, subset: Sequence[Mapping], evals: Mapping[str, Mapping]
                       ) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for name, e in evals.items():
            for rec, s in zip(subset, e["scored"]):
                f.write(json.dumps({"model": name, "id": rec.get("id"), "task": rec["task"],
                                    "completion": s["completion"], "reward": s["reward"]})
                        + "\n")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure_speed(path: Path, speed: Mapping | None) -> None:
    plt = _plt()
    rows = (speed or {}).get("rows") or []
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, max(len(sizes), 1), figsize=(5 * max(len(sizes), 1), 3.6),
                             squeeze=False)
    for ax, size in zip(axes[0], sizes or ["(no speed rows)"]):
        rs = [r for r in rows if r["size"] == size]
        bottom = [0.0] * len(rs)
        for part, color in (("generation_s", "tab:blue"), ("scoring_s", "tab:orange"),
                            ("update_s", "tab:green")):
            vals = [float(r.get(part) or 0.0) for r in rs]
            ax.bar([r["method"] for r in rs], vals, bottom=bottom, color=color,
                   label=part.replace("_s", ""))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"RL step, {size}", fontsize=9)
        ax.set_ylabel("seconds per step (steady)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _figure_compare(path: Path, compare: Mapping | None) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for method, r in ((compare or {}).get("rl") or {}).items():
        curve = [(s, v) for s, v in r.get("reward_curve") or [] if v is not None]
        if curve:
            a1.plot([s for s, _ in curve], [v for _, v in curve], marker=".", label=method)
    a1.set_xlabel("RL step")
    a1.set_ylabel("mean task reward (sampled)")
    a1.set_title("RL reward per step", fontsize=9)
    if a1.get_legend_handles_labels()[0]:
        a1.legend(fontsize=7)
    models = (compare or {}).get("models") or {}
    keys = ("dr_f1", "plp_similarity", "mlperf_em", "avg_score")
    names = list(models)
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        vals = [models[name].get(k) or 0.0 for k in keys]
        a2.bar([i + j * width for i in range(len(keys))], vals, width=width, label=name)
    a2.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], keys, fontsize=8)
    a2.set_title("greedy eval", fontsize=9)
    if names:
        a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
