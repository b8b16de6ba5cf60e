"""The README stays a front door and the docs site builds with no broken link.

- ``mkdocs build --strict`` (mkdocs.yml: every link problem is a warning, so a link to a missing
  docs page or image, a broken ``#anchor`` or a page left out of the nav fails the build);
- the site has the tutorial, the how-to guides, the reference and the results log, and
  docs/method.md no dated heading (issue 41 item 6: dated measurements live in docs/results.md);
- README.md has at most 250 lines (issue 28: measurements, operations and the rest live in docs/);
- every relative link in README.md and docs/**/*.md points at an existing file, and a link from
  the README into a Markdown file with an ``#anchor`` names a heading of that file (GitHub's
  anchors; MkDocs checks the docs pages' own anchors);
- docs/reference/cli.md names every ``hargo`` command and option (it is written from ``--help``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target), the text possibly across lines; an optional "title"
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (their brackets are no links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _links(md: Path) -> list[str]:
    return _LINK.findall(_prose(md.read_text(encoding="utf-8")))


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None   # http:, mailto:, ...


def _github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in _HEADING.findall(_FENCE.sub("", md.read_text(encoding="utf-8"))):
        slug = _github_slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_a_front_door():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move measurements and "
        "operations to a page under docs/ (measured figures: docs/results.md)")


def test_the_link_checker_sees_links():
    """Guards the checks below against a regex that matches nothing."""
    targets = _links(README)
    assert "docs/results.md" in {t.split("#")[0] for t in targets}
    assert not any("scripts/main.sh" in t for t in targets)   # code spans are not links
    assert _github_slug("The main job (2026-12-01)") == "the-main-job-2026-12-01"
    assert _github_slug("Add a method (today)") == "add-a-method-today"


def test_relative_links_point_at_existing_files():
    broken = []
    for md in _markdown_files():
        where = md.relative_to(ROOT)
        for target in _links(md):
            if _is_external(target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif anchor and md == README and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: {target} (no heading #{anchor} in "
                              f"{dest.relative_to(ROOT)})")
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


def test_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: zero warnings (mkdocs.yml turns every link problem into one)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    for page in ("index.html", "results/index.html", "tutorial/index.html",
                 "howto/index.html", "reference/cli/index.html",
                 "reference/registries/index.html"):   # issue 41 item 6: the four kinds + the log
        assert (tmp_path / "site" / page).is_file(), page


def test_the_explanation_carries_no_dated_log():
    """Issue 41 item 6: docs/method.md explains; what was measured, and when, is the results log
    (docs/results.md). A heading with a date in method.md is a log entry in the wrong page."""
    dated = [h for _, h in _HEADING.findall(_FENCE.sub("", (DOCS / "method.md").read_text()))
             if re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
    assert not dated, f"dated headings in docs/method.md (move them to docs/results.md): {dated}"


def test_the_readmes_dvc_exp_show_line_fits_120_columns():
    """Issue 30 item 7: `dvc exp show` had 3,087 columns. The README's line, run on this
    repository (its committed metrics/headline.json and params.yaml), is at most 105 columns wide,
    leaving 15 for an experiment's name ("├── 1a2b3c4 [bushy-kite]" against "workspace"), and
    shows the headline columns it names."""
    import shlex

    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                if ln.startswith("dvc exp show"))
    dvc = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([str(dvc), *shlex.split(line)[1:], "--no-pager"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 105, out.stdout
    header = next(ln for ln in lines if "Experiment" in ln).split()
    assert header == ["Experiment", "hargo.avg_score", "hargo.dr_f1", "hargo.dr_mcc",
                      "sft.avg_score", "rl.learning_rate"]


# ------------------------------------------------------------------ the command-line reference
CLI_PAGE = DOCS / "reference" / "cli.md"
CLI_MARK = "## The commands\n\n"        # the page's generated part starts after this heading
_COMMON = {"params", "set_"}


def _cell(text: str) -> str:
    """``text`` on one line for a Markdown table cell: ``|`` escaped, ``<`` outside code spans
    escaped (``models/rl/<method>`` is no HTML tag)."""
    parts = " ".join((text or "").split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def cli_reference() -> str:
    """The generated part of docs/reference/cli.md: a table of every ``hargo`` command, then a
    section per command with its help and its own options (what ``hargo <cmd> --help`` prints;
    ``--params``/``--set`` once, in the page's hand-written head)."""
    import typer

    from hargo.cli import app

    cli = typer.main.get_command(app)
    table = ["| command | what it does | `-p` / `-S` |", "|---|---|---|"]
    blocks = []
    for name in cli.list_commands(None):
        cmd = cli.get_command(None, name)
        common = "yes" if _COMMON <= {p.name for p in cmd.params} else ""
        table.append(f"| [`hargo {name}`](#hargo-{name}) | "
                     f"{_cell(cmd.help).split('. ')[0].rstrip('.')} | {common} |")
        blocks.append(f"### hargo {name}\n\n{_cell(cmd.help)}\n")
        rows = []
        for p in cmd.params:
            if p.name == "help" or p.name in _COMMON:
                continue
            flag = getattr(p, "is_flag", False)
            kind = "flag" if flag else str(p.display_type(None)).strip("<>")
            if getattr(p, "multiple", False):
                kind = kind.removeprefix("list[").removesuffix("]") + ", repeatable"
            default = ("required" if p.required else ""
                       if p.default is None or (flag and p.default is False) else f"`{p.default}`")
            opts = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            rows.append(f"| {opts} | {kind} | {default} | {_cell(getattr(p, 'help', ''))} |")
        if common:
            rows.append("| `--params`, `-p`, `--set`, `-S` | | | "
                        "[the common options](#common-options) |")
        if rows:
            blocks += ["| option | type | default | what it does |\n|---|---|---|---|", *rows, ""]
    return "\n".join(table) + "\n\n" + "\n".join(blocks)


def write_cli_reference() -> None:
    """Rewrite docs/reference/cli.md's generated part (``python tests/test_docs.py``)."""
    head = CLI_PAGE.read_text(encoding="utf-8").split(CLI_MARK)[0]
    CLI_PAGE.write_text(head + CLI_MARK + cli_reference(), encoding="utf-8")


def test_the_cli_reference_names_every_command_and_option():
    """docs/reference/cli.md is written from `hargo <command> --help`: every command of the Typer
    app has its section (`### hargo <command>`) and every option of it appears there (the
    common `--params`/`--set` once, at the top), so a new command or option fails here until
    the reference has it."""
    import typer

    from hargo.cli import app

    page = CLI_PAGE.read_text(encoding="utf-8")
    sections = dict(re.findall(r"^### hargo (\S+)\n(.*?)(?=^### |\Z)", page, re.S | re.M))
    cli = typer.main.get_command(app)
    missing = []
    for name in cli.list_commands(None):
        if name not in sections:
            missing.append(f"hargo {name} (no '### hargo {name}' section)")
            continue
        for param in cli.get_command(None, name).params:
            opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
            where = page if param.name in ("params", "set_") else sections[name]
            if param.name != "help" and not any(f"`{o}`" in where for o in opts):
                missing.append(f"hargo {name} {'/'.join(opts) or param.name}")
    stale = sorted(set(sections) - set(cli.list_commands(None)))
    assert not missing and not stale, (
        "docs/reference/cli.md is out of date with `hargo --help` (rewrite its generated part: "
        "`python tests/test_docs.py`):\n  missing: " + ", ".join(missing)
        + "\n  no such command: " + ", ".join(stale))


if __name__ == "__main__":
    write_cli_reference()
