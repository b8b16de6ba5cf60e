"""One figure for interference-map cells that each come from their own report (the cells whose
knob changes the SFT policy: ``synthetic.data.conflict``, ``synthetic.sft.hedge_style``; each is
the neutral cell of ``interference_map.py`` under its own ``--root``): per cell, GRPO's alone
minus mixed per task with its interval, and the transfer matrix (what each task trained alone
does to every task, minus the SFT policy: :func:`interference_report.transfer`).

    python benchmarks/interference_cells_figure.py --out docs/synthetic/interference_map_sft_cells.png \\
        --title "2-core AMD EPYC, AVX512-BF16, bf16" \\
        "neutral=reports/interference_map_e192" "conflict=reports/interference_map_conflict"

Each ``label=stem`` reads ``stem.json`` (the report's numbers) and ``stem_transfer.json``
(written beside it since the transfer table), and takes the cell ``--cell`` (default
``std=group``, the neutral cell) from both.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


def lift_matrix(transfer_cell: Mapping, tasks: Sequence[str]) -> np.ndarray:
    """``(len(tasks), len(tasks))`` array: row i is task i trained alone, column j task j's final
    eval reward minus the SFT policy's (the ``vs_sft`` difference of
    :func:`interference_report.transfer`); NaN where an arm or its step-0 point is missing.
    A large off-diagonal entry is a habit the tasks share."""
    out = np.full((len(tasks), len(tasks)), np.nan)
    for i, u in enumerate(tasks):
        arm = transfer_cell.get(f"alone {u}")
        for j, t in enumerate(tasks):
            ci = arm and arm[t]["vs_sft"]
            if ci:
                out[i, j] = ci["diff"]
    return out


def load(stem: str, cell: str) -> tuple[Mapping, Mapping]:
    """(numbers, transfer) of ``cell`` from a report's ``stem.json`` and ``stem_transfer.json``.

    Raises:
        SystemExit: a file or the cell is missing (named)."""
    out = []
    for path in (Path(stem + ".json"), Path(stem + "_transfer.json")):
        if not path.exists():
            raise SystemExit(f"{path}: not found (run interference_map.py with --report {stem}.md)")
        data = json.loads(path.read_text())
        if cell not in data:
            raise SystemExit(f"{path}: no cell {cell!r}; it has {sorted(data)}")
        out.append(data[cell])
    return out[0], out[1]


def plot(cells: Sequence[tuple[str, Mapping, Mapping]], path: Path, confidence: float = 0.95,
         title: str = "") -> None:
    """Top row: per cell, alone - mixed at the end per task with its interval; bottom row: the
    cell's :func:`lift_matrix` as a heatmap (annotated); ``title`` above (name the CPU and
    precision the runs came from: the figures depend on them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(cells)
    fig, axes = plt.subplots(2, n, figsize=(3.4 * n, 6.4), squeeze=False)
    for ax in axes[0][1:]:
        ax.sharey(axes[0][0])            # one scale: the cells' intervals compare by eye
    for k, (label, numbers, tr) in enumerate(cells):
        tasks = list(numbers)
        ax = axes[0][k]
        for j, t in enumerate(tasks):
            ci = numbers[t]["het"]["end"]
            if ci:
                ax.errorbar([j], [ci["diff"]], yerr=[[ci["diff"] - ci["low"]],
                                                    [ci["high"] - ci["diff"]]],
                            fmt="o", capsize=3, color=f"C{j}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(tasks)), [t.replace("syn_", "") for t in tasks])
        ax.set_title(f"{label} ({numbers[tasks[0]]['n_seeds']} seeds)", fontsize=9)
        if k == 0:
            ax.set_ylabel(f"alone - mixed, end ({int(round(confidence * 100))}% CI)")
        m = lift_matrix(tr, tasks)
        ax = axes[1][k]
        im = ax.imshow(m, cmap="RdBu_r", vmin=-0.5, vmax=0.5)
        for i in range(len(tasks)):
            for j in range(len(tasks)):
                if not np.isnan(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:+.2f}", ha="center", va="center", fontsize=8,
                            color="white" if abs(m[i, j]) > 0.3 else "black")
        short = [t.replace("syn_", "") for t in tasks]
        ax.set_xticks(range(len(tasks)), short)
        ax.set_yticks(range(len(tasks)), [f"{s} alone" for s in short] if k == 0 else [])
        ax.set_xlabel("eval task: end - SFT", fontsize=8)
    fig.colorbar(im, ax=axes[1].tolist(), shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cells", nargs="+", help="label=report stem (no .md)")
    ap.add_argument("--cell", default="std=group")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="", help="e.g. the CPU and precision of the runs")
    a = ap.parse_args(argv)
    cells = []
    for item in a.cells:
        label, sep, stem = item.partition("=")
        if not sep:
            raise SystemExit(f"{item}: expected label=stem")
        cells.append((label, *load(stem, a.cell)))
    plot(cells, Path(a.out), title=a.title)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
