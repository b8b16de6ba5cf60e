"""When a failed stage is worth retrying.

Retried (with exponential back-off): failures of the outside world that go away by themselves --
a locked or briefly unreachable MLflow store, a dropped connection, a timeout. Not retried:
everything else, in particular bad params (``hargo.params.ParamsError``), failed data contracts
(``hargo.data.validate.ValidationFailed``) and bad input data (``hargo.io.HargoInputError``):
running them again gives the same answer. The stages run in a DVC subprocess
(:mod:`flows.stages`), so their failures arrive as ``flows.stages.DvcError``: its message holds
the stage's output (a transient cause is found there), and its ``permanent`` flag marks what the
``hargo`` CLI reported as bad params, input or data, and DVC's own refusals.
"""
from __future__ import annotations

from typing import Iterator

# Substrings of messages that mark a transient store failure (SQLite under concurrent writers,
# an HTTP tracking server restarting). Matched case-insensitively anywhere in the cause chain.
TRANSIENT_MESSAGES = (
    "database is locked",
    "database is busy",
    "temporarily unavailable",
    "connection reset",
    "connection refused",
    "connection aborted",
    "max retries exceeded",
    "503 service unavailable",
    "502 bad gateway",
    "504 gateway timeout",
)
# MLflow error codes (mlflow.protos.databricks_pb2) that mean "try again later".
TRANSIENT_MLFLOW_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")


def _chain(exc: BaseException, limit: int = 16) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < limit:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _permanent(exc: BaseException) -> bool:
    from hargo.io import HargoInputError
    from hargo.params import ParamsError

    if isinstance(exc, (ParamsError, HargoInputError)):
        return True
    # a failure reported by a subprocess that knows it is final (flows.stages.DvcError: the
    # stage's `hargo` command reported bad params/input/data, or DVC refused to run it)
    if getattr(exc, "permanent", False) is True:
        return True
    # hargo.data.validate is imported only if already loaded (it pulls Great Expectations in).
    import sys

    validate = sys.modules.get("hargo.data.validate")
    failed = getattr(validate, "ValidationFailed", None)
    return failed is not None and isinstance(exc, failed)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception in its ``__cause__``/``__context__`` chain) is a
    transient outside failure (module docstring); False for hargo's own input/params/data
    contract errors, whatever they wrap."""
    if _permanent(exc):
        return False
    for e in _chain(exc):
        if _permanent(e):
            return False
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if type(e).__name__ in ("ConnectionError", "Timeout", "ReadTimeout", "ConnectTimeout") \
                and type(e).__module__.startswith(("requests", "urllib3", "httpx")):
            return True
        code = getattr(e, "error_code", None)
        if isinstance(code, str) and code in TRANSIENT_MLFLOW_CODES:
            return True
        msg = str(e).lower()
        if any(m in msg for m in TRANSIENT_MESSAGES):
            return True
    return False


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: retry the failed task run only if its exception is
    :func:`is_transient`. Prefect calls it with the task, the task run and the Failed state
    whose data is the exception."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            state.result()
        except BaseException as e:  # noqa: BLE001 - we classify, never swallow: Prefect re-raises
            exc = e
    return exc is not None and is_transient(exc)
