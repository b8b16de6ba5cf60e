"""The comparison report's blocks as text: markdown (:func:`render_md`) and one self-contained
HTML page (:func:`render_html`). The block format is :mod:`hargo.compare.render`'s:
``("h", level, text)``, ``("p", text)``, ``("ul", [items])``, ``("table", header, rows)`` and
``("img", alt, png file name)``. Pure: nothing here reads or writes files.
"""
from __future__ import annotations

import base64
import html
from typing import Mapping, Sequence

__all__ = ["render_md", "render_html"]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table padded to column width (aligned in a terminal); first column left-aligned,
    the others right-aligned."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])  # noqa: E731
                                       for i, c in enumerate(r)) + " |"
    sep = "|" + "|".join(("-" * (w[i] + 2)) if i == 0 else ("-" * (w[i] + 1) + ":")
                         for i in range(len(header))) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def render_md(blocks: list, figures_dir: str) -> str:
    """The blocks as markdown; images link to ``<figures_dir>/<file>`` (relative to the
    report)."""
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2])
        elif kind == "p":
            out.append(b[1])
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in b[1]))
        elif kind == "table":
            out.append(_md_table(b[1], b[2]))
        elif kind == "img":
            out.append(f"![{b[1]}]({figures_dir}/{b[2]})")
    return "\n\n".join(out) + "\n"


def render_html(blocks: list, images: Mapping[str, bytes], title: str) -> str:
    """The blocks as one self-contained HTML page; ``images`` maps an image block's file name to
    its PNG bytes, embedded as base64."""
    e = html.escape
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
           "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
           "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
           "img{max-width:100%}code{background:#f4f4f4}</style></head><body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
        elif kind == "p":
            out.append(f"<p>{e(b[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{e(str(c))}</th>" for c in b[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
                           for r in b[2])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "img":
            data = base64.b64encode(images[b[2]]).decode("ascii")
            out.append(f"<p><img alt='{e(b[1])}' src='data:image/png;base64,{data}'></p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
