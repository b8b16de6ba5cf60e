"""The flows' way through DVC: one book (``dvc.lock``) for both doors.

DVC decides what is up to date and DVC runs what is not, whichever door a run comes through.
Every Prefect stage task does what ``dvc repro`` does for one stage, with DVC's own commands
in a subprocess, in the project root (the working directory):

    dvc status --json <target>                       {} -> the stage is up to date: not run
    dvc repro --single-item [--force] <target>       otherwise (or with force): DVC runs the
                                                     stage's cmd (the `hargo` CLI) and writes
                                                     its entry of dvc.lock

so a ``dvc repro`` after a Prefect run has nothing to reproduce, and a Prefect run after
``dvc repro`` runs no stage. ``--single-item`` keeps the order to the flow (Prefect runs the
stages one task each, as ``dvc.yaml``'s graph orders them); ``--wait-for-lock`` makes a stage wait
for another DVC command holding the repository's lock instead of failing.

The stages read their params from ``params.yaml`` (``dvc.yaml`` declares them there, and DVC
compares them with ``dvc.lock``), so a flow's ``overrides`` are written into ``params.yaml``
before anything runs, as ``dvc exp run -S`` does in the workspace (:func:`write_overrides`:
DVC's own writer, so only the changed values' lines differ), and put back when the flow run
ends (:func:`restore_file`, :func:`flows.pipeline.run_params`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hargo.io import atomic_write_bytes, atomic_write_text
from hargo.params import ParamsError

DVC_YAML = "dvc.yaml"
COMPARE_DVC_YAML = "compare/dvc.yaml"
PARAMS_FILE = "params.yaml"  # the file every stage of dvc.yaml and compare/dvc.yaml reads
PARAMS_STAGE = "params"     # dvc.yaml's first stage: params.yaml validated (hargo check-params)
UP_TO_DATE = "UpToDate"      # the Prefect state name of a stage DVC found up to date

# What the `hargo` CLI prints for a failure that running again cannot fix (hargo/cli.py):
# bad params, bad input data, a failed data contract; and DVC's own refusals (a missing
# dependency, an invalid dvc.yaml, an unknown stage).
_PERMANENT = re.compile(
    r"^error: (ParamsError|HargoInputError|FileNotFoundError|ValueError): |^validation failed:"
    r"|^ERROR: .*(does not exist|is invalid|not found|missing)", re.MULTILINE)
# tqdm progress bars: not worth a log line each (the last one is kept in the output tail).
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+")


class DvcError(RuntimeError):
    """A DVC command failed.

    The message is ``<reason> (dvc <args>, exit <code>)`` then the output's tail; the reason is
    the ``hargo`` CLI's error line when the stage's command failed (``error: HargoInputError:
    ...``), else DVC's own ``ERROR:`` line. ``permanent`` is True when running it again cannot
    help (:data:`_PERMANENT`); :mod:`flows.retries` does not retry those.
    """

    def __init__(self, args: list[str], returncode: int, output: str):
        self.command, self.returncode, self.output = list(args), returncode, output
        self.permanent = bool(_PERMANENT.search(output))
        super().__init__(f"{_reason(output)} (dvc {' '.join(args)}, exit {returncode})\n"
                         f"{_tail(output)}")

    def __reduce__(self):  # picklable (Prefect may serialize a failed state's exception)
        return (type(self), (self.command, self.returncode, self.output))


def _reason(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for prefix in ("error: ", "validation failed:", "ERROR: "):
        found = [ln for ln in lines if ln.startswith(prefix)]
        if found:
            return found[-1].removeprefix("error: ")
    return lines[-1] if lines else "no output"


def _tail(output: str, lines: int = 40, chars: int = 4000) -> str:
    return "\n".join(output.splitlines()[-lines:])[-chars:]


def target(stage: str, item: str | Mapping[str, Any] | None = None,
           dvc_yaml: str = DVC_YAML) -> str:
    """DVC's address of one stage: ``prepare``; ``rl@hargo`` (a ``foreach`` item);
    ``compare/dvc.yaml:compare_train@hargo-1`` (a ``matrix`` item, its values joined by ``-`` in
    the matrix's key order, as DVC names them)."""
    name = stage
    if isinstance(item, Mapping):
        name = f"{stage}@{'-'.join(str(v) for v in item.values())}"
    elif item is not None:
        name = f"{stage}@{item}"
    return name if dvc_yaml == DVC_YAML else f"{dvc_yaml}:{name}"


def dvc_env() -> dict[str, str]:
    """The environment of a DVC command: this process's (``HARGO_DOOR``,
    ``HARGO_PARENT_RUN_ID``, ``MLFLOW_TRACKING_URI`` reach the stage's process through it), with
    this interpreter's ``bin`` first on ``PATH`` so the stages' ``hargo`` command is this
    environment's."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


#: Seconds a DVC command's process group gets to end after the flow run was cancelled or
#: interrupted (SIGTERM: the stage's MLflow run ends KILLED, DVC records nothing) before it is
#: killed. Under Prefect's 30 s grace (a cancelled flow run's process gets SIGTERM, then
#: SIGKILL 30 s later).
STOP_GRACE_S = 20.0


def run_dvc(args: list[str], log: Callable[[str], Any] | None = None) -> str:
    """Run ``python -m dvc --wait-for-lock <args>`` in the working directory; each output line
    (stdout and stderr together, progress bars left out) goes to ``log``. Returns the output.

    DVC runs in a process group of its own. When this process is interrupted while it runs --
    a Prefect cancel (Prefect turns the SIGTERM it sends the flow run's process into an
    exception), Ctrl-C -- the group gets SIGTERM, so the stage's ``hargo`` process ends its
    MLflow run KILLED and DVC records nothing (:func:`stop_group`); the interruption then
    propagates.
    Before, DVC and the stage ran on with their output pipe closed, and the stage ended FAILED
    on the broken pipe.

    Raises:
        DvcError: a non-zero exit (the reason and the output's tail in the message).
    """
    cmd = [sys.executable, "-m", "dvc", "--wait-for-lock", *args]
    kept: deque[str] = deque(maxlen=400)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=dvc_env(), bufsize=1,
                          start_new_session=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if _PROGRESS.search(line):
                    if kept and _PROGRESS.search(kept[-1]):
                        kept.pop()
                elif log is not None and line.strip():
                    log(line)
                kept.append(line)
            code = proc.wait()
        except BaseException:      # cancelled, interrupted, terminated: end the stage first
            stop_group(proc)
            raise
    output = "\n".join(kept)
    if code != 0:
        raise DvcError(args, code, output)
    return output


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int | None:
    """End the process group led by ``proc`` (started with ``start_new_session``): SIGTERM to
    the group -- the ``hargo`` stage ends its MLflow runs KILLED and exits 143
    (:class:`hargo.signals.StageTerminated`, whatever its SIGINT disposition), DVC stops and
    records nothing (a dead process's entry in its lock is ignored) -- then, once every process
    of the group is gone or after ``grace_s`` seconds, SIGKILL to what is left. Returns
    ``proc``'s exit code (None if it could not be reaped)."""
    import signal
    import time

    def signal_group(sig) -> bool:
        try:
            os.killpg(proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()                          # reap DVC, so only live processes count
        if not signal_group(0):              # no process of the group is left
            break
        time.sleep(0.1)
    signal_group(signal.SIGKILL)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def stage_status(stage_target: str) -> dict[str, Any]:
    """``dvc status --json <target>``: ``{}`` when the stage is up to date, else what DVC
    found changed (``{"prepare": [{"changed deps": {...}}, ...]}``).

    Raises:
        DvcError: DVC could not tell (no such stage, an invalid dvc.yaml, ...).
    """
    out = run_dvc(["status", "--json", stage_target])
    start = out.find("{")  # DVC may print a warning line before the JSON
    if start < 0:
        raise DvcError(["status", "--json", stage_target], 0, f"no JSON in output:\n{out}")
    return json.loads(out[start:out.rfind("}") + 1])


def reproduce(stage_target: str, force: bool = False,
              log: Callable[[str], Any] | None = None) -> str:
    """``dvc repro --single-item [--force] <target>``: DVC runs the stage (its upstream stages
    are the flow's business) and records it in ``dvc.lock``. Returns DVC's output.

    The ``params`` stage (:data:`PARAMS_STAGE`: params.yaml validated, its stamp written) is
    brought up to date first, never forced: every stage depends on its stamp, and DVC runs
    nothing of a stage whose params are invalid.

    Raises:
        DvcError: the stage failed, or DVC refused (a dependency is missing, ...).
    """
    out = "" if stage_target == PARAMS_STAGE else run_dvc(["repro", "--single-item",
                                                           PARAMS_STAGE], log)
    return out + run_dvc(["repro", "--single-item", *(["--force"] if force else []),
                          stage_target], log)


# --------------------------------------------------------------------------- the project
def check_project(params_path: str | os.PathLike, root: str | os.PathLike = ".") -> Path:
    """The working directory must be a DVC project root and ``params_path`` its
    ``params.yaml`` (the file DVC compares with ``dvc.lock``). Returns the root.

    Raises:
        ParamsError: ``params_path`` is another file (the message says why, and what to do).
        RuntimeError: no ``.dvc`` folder in the working directory.
    """
    root = Path(root).resolve()
    if not (root / ".dvc").is_dir():
        raise RuntimeError(f"{root}: not a DVC project (no .dvc folder). The flows run every "
                           f"stage through DVC: run them from the repository root "
                           f"(`dvc init` first in a new project)")
    given = Path(params_path)
    given = (given if given.is_absolute() else root / given).resolve()
    if given != root / PARAMS_FILE:
        raise ParamsError(
            f"params_path: the stages read {PARAMS_FILE} in the project root, as dvc.yaml "
            f"declares (DVC compares it with dvc.lock), so the flows use that file too; got "
            f"{params_path}. Pass changes as overrides (written into {PARAMS_FILE}, as "
            f"`dvc exp run -S` does) or edit {PARAMS_FILE}")
    return root


def write_overrides(params_path: str | os.PathLike, overrides: Mapping[str, Any]) -> list[str]:
    """Write dotted ``overrides`` (already validated: :func:`flows.pipeline.resolve_params`)
    into ``params_path`` with DVC's own writer, as ``dvc exp run -S`` does
    (``dvc.utils.hydra.apply_overrides``: a round-trip load, ``merge_dicts`` and
    ``remove_missing_keys`` of the new values, DVC's YAML dump). The committed params.yaml is
    a fixed point of that writer (block-style lists, empty nulls: tests/test_flows.py), so
    only the changed values' lines differ afterwards, whichever door wrote them. Keys whose
    value is already the given one are left alone, the file is not touched when nothing
    changes, and it is replaced whole (a temporary file, then a rename). Returns the keys
    written.

    Raises:
        ParamsError: a key that ``params_path`` does not have.
    """
    import copy

    from dvc.utils.collections import merge_dicts, remove_missing_keys
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    path = Path(params_path)
    text = path.read_text(encoding="utf-8")
    doc = parse_yaml_for_update(text, str(path))
    new = copy.deepcopy(_plain(doc))
    changed = []
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = new
        for key in keys[:-1]:
            if not isinstance(cur, Mapping) or key not in cur:
                raise ParamsError(f"{dotted}: unknown parameter (not in {path})")
            cur = cur[key]
        if not isinstance(cur, Mapping) or keys[-1] not in cur:
            raise ParamsError(f"{dotted}: unknown parameter (not in {path})")
        if cur[keys[-1]] == _plain(value):
            continue
        cur[keys[-1]] = _plain(value)
        changed.append(dotted)
    if changed:
        merge_dicts(doc, new)
        remove_missing_keys(doc, new)
        atomic_write_text(path, dumps_yaml(doc))
    return changed


def restore_file(path: str | os.PathLike, content: bytes) -> None:
    """Put ``content`` back into ``path`` whole (:func:`hargo.io.atomic_write_bytes`), unless it
    already holds it."""
    path = Path(path)
    if not (path.exists() and path.read_bytes() == content):
        atomic_write_bytes(path, content)


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
