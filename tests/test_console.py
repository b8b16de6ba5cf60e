"""Each distinct library warning once, with a count of the repeats (issue 30, item 7)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

from hargo.console import CHILD_FILTER, warnings_once


def _five_places():
    # the same text from five code locations, as TRL's vLLM-version warning is raised
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)


def test_each_distinct_warning_once_then_a_count(monkeypatch):
    shown: list[str] = []    # what reaches the display (pytest records warnings itself)
    monkeypatch.setattr(warnings, "showwarning",
                        lambda message, *a, **k: shown.append(str(message)))
    before_env = os.environ.get("PYTHONWARNINGS")
    before_filters = list(warnings.filters)
    out = io.StringIO()
    with warnings_once(out) as seen:
        _five_places()
        for _ in range(3):
            warnings.warn("another library's warning", FutureWarning)   # same line: once
        warnings.warn("loading weights in float32", UserWarning)
        assert os.environ["PYTHONWARNINGS"].endswith(CHILD_FILTER)
    err = "\n".join(shown)
    assert err.count("TRL currently supports vLLM versions") == 1
    assert err.count("loading weights in float32") == 1
    assert err.count("another library's warning") == 1
    assert seen[("UserWarning", "TRL currently supports vLLM versions from 0.22.0 to 0.31.0.")] \
        == 5
    assert out.getvalue() == ("(4 repeats of 1 library warning(s) above not shown again: "
                              "UserWarning 'TRL currently supports vLLM versions from 0.22.0 "
                              "to 0.31.0.' x5)\n")              # 60 characters: not cut
    assert os.environ.get("PYTHONWARNINGS") == before_env
    assert warnings.filters == before_filters


def test_nothing_repeated_prints_no_summary():
    out = io.StringIO()
    with warnings_once(out):
        warnings.warn("just once", UserWarning)
    assert out.getvalue() == ""


def test_a_process_started_inside_shows_each_text_once():
    code = ("import warnings\n"
            "warnings.warn('from a worker', UserWarning)\n"
            "warnings.warn('from a worker', UserWarning)\n")
    with warnings_once(io.StringIO()):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=os.environ.copy(), timeout=60)
    assert proc.returncode == 0 and proc.stderr.count("from a worker") == 1, proc.stderr
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env={k: v for k, v in os.environ.items()
                                            if k != "PYTHONWARNINGS"})
    assert plain.stderr.count("from a worker") == 2       # Python's default: once per line


def test_the_vllm_logging_config_shows_each_message_once_even_after_it_is_reapplied():
    """vLLM applies its logging config (hargo.console.VLLM_LOGGING_CONFIG, through
    VLLM_LOGGING_CONFIG_PATH) at import and again at every engine start, with a new handler and
    filter each time: the count must live in the warnings_once block, not in the filter."""
    import json
    import logging
    import logging.config

    from hargo.console import VLLM_LOGGING_CONFIG

    config = json.loads(VLLM_LOGGING_CONFIG.read_text())
    stream = io.StringIO()
    config["handlers"]["vllm"]["stream"] = stream   # the shipped file writes to sys.stdout
    assert json.loads(VLLM_LOGGING_CONFIG.read_text())["handlers"]["vllm"]["stream"] == \
        "ext://sys.stdout"
    worker = logging.getLogger("vllm.v1.worker.cpu_worker")
    vllm_logger = logging.getLogger("vllm")
    saved = (vllm_logger.handlers[:], vllm_logger.level, vllm_logger.propagate)
    msg = "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding"
    out = io.StringIO()
    try:
        with warnings_once(out) as seen:
            for engine in range(3):                      # three engines, config re-applied
                logging.config.dictConfig(config)
                for _ in range(4):
                    worker.warning(msg)
                worker.warning("Loaded model %d", engine)   # one template, three texts
                worker.info("not shown: below WARNING")
        logging.config.dictConfig(config)
        worker.warning(msg)                              # outside the block: shown again
    finally:
        vllm_logger.handlers[:], vllm_logger.level, vllm_logger.propagate = saved
    lines = stream.getvalue().splitlines()
    assert lines == [f"vllm WARNING [test_console.py:{lines[0].split(':')[1].split(']')[0]}] "
                     f"{msg}", lines[1], lines[2]]
    assert lines[1].endswith("Loaded model 0") and lines[2].endswith(msg)
    assert seen[("vllm WARNING", msg)] == 12 and seen[("vllm WARNING", "Loaded model %d")] == 3
    assert out.getvalue().startswith("(13 repeats of 2 library warning(s) above not shown again")


def test_a_shown_warning_is_one_line_without_the_librarys_source_line(capsys, monkeypatch):
    # Python's own display (pytest records warnings instead of showing them)
    monkeypatch.setattr(warnings, "showwarning", lambda m, c, f, n, file=None, line=None:
                        sys.stderr.write(warnings.formatwarning(m, c, f, n, line)))
    with warnings_once(io.StringIO()):
        warnings.warn("`torch.distributed.reduce_op` is deprecated", FutureWarning)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(
        "FutureWarning: `torch.distributed.reduce_op` is deprecated\n")
