"""``python -m hargo.gpu_check``: the command line (see the package docstring), and the summary
it prints."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Mapping

from hargo.gpu_check.common import PARTS, ROOT, hide_packages, log
from hargo.gpu_check.compare import rescore
from hargo.gpu_check.payload import convert_gguf, pack_minilm, preflight, unpack_minilm
from hargo.gpu_check.run import run_check
from hargo.gpu_check.tracking import import_mlflow


class _Tee:
    """Write to a stream and to a log file."""

    def __init__(self, stream, fh):
        self.stream, self.fh = stream, fh

    def write(self, s):
        self.stream.write(s)
        try:
            self.fh.write(s)
        except ValueError:  # log file closed at exit
            pass
        return len(s)

    def flush(self):
        self.stream.flush()
        with contextlib.suppress(ValueError):
            self.fh.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _summary_lines(res: Mapping) -> list[str]:
    lines = [f"passed: {res.get('passed')}  elapsed {res.get('elapsed_s')} s  parts "
             + ", ".join(f"{k}={v.get('status')}" for k, v in res.get("parts", {}).items())]
    c = res.get("correctness") or {}
    for name, d in (c.get("comparisons") or {}).items():
        if "max_abs_diff" in d:
            lines.append(f"correctness {name} vs cpu-fp32: passed={d['passed']} "
                         + " ".join(f"{k}={v:.2g}" for k, v in d["max_abs_diff"].items()
                                    if v is not None))
    for r in (res.get("speed") or {}).get("rows", []):
        lines.append(f"speed {r['size']:<26} {r['method']:<6} {r['s_per_step']:.3f} s/step = "
                     f"gen {r['generation_s']:.3f} + score {r['scoring_s']:.3f} + update "
                     f"{r['update_s']:.3f}; peak GPU {r['peak_gpu_mib']} MiB")
    comp = res.get("compare") or {}
    if comp.get("budget"):
        lines.append(f"compare: RL steps per method {comp['budget']} (requested "
                     f"{comp.get('steps_requested')}), SFT {comp.get('sft', {}).get('steps')} "
                     f"steps, {comp.get('setup', {}).get('eval_prompts')} eval prompts")
    for name, m in (comp.get("models") or {}).items():
        lines.append(f"eval {name:<10} DR-F1 {m.get('dr_f1')}  PLP {m.get('plp_similarity')}  "
                     f"EM {m.get('mlperf_em')}  Avg {m.get('avg_score')}  "
                     f"Win {m.get('win_rate')}")
    for pair, d in (comp.get("bootstrap") or {}).items():
        for k, v in d.items():
            lines.append(f"bootstrap {pair} {k}: {v['diff']:+.4f} [{v['low']:+.4f}, "
                         f"{v['high']:+.4f}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command line: one of the tools (payload, preflight, MLflow import, rescoring) or a
    run of the check (:func:`_run`); the exit status."""
    ap = _parser()
    args = ap.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    status = _tool(args)
    if status is not None:
        return status
    return _run(ap, args)


def _parser() -> argparse.ArgumentParser:
    """The command line's options (the description is the package docstring's first
    paragraph)."""
    import hargo.gpu_check as package

    ap = argparse.ArgumentParser(prog="python -m hargo.gpu_check",
                                 description=package.__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny random model, synthetic data, 1-2 steps per part")
    ap.add_argument("--smoke", action="store_true",
                    help="the dry run's sizes on the device (device call 1's first GPU run)")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="dry run/smoke: SmolLM2 tokenizer folder (default: read the GGUF once)")
    ap.add_argument("--save-tokenizer", type=Path, metavar="DIR", default=None,
                    help="write SmolLM2's tokenizer folder to DIR (payload build)")
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    ap.add_argument("--model", type=Path, default=None, help="base model folder (GPU run)")
    ap.add_argument("--data", type=Path, default=None,
                    help="folder with train.jsonl and eval.jsonl (default data/prepared)")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="seconds for the whole run (default 480; dry run 900, a safety net)")
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--no-log-file", action="store_true",
                    help="print only (scripts/gpu_check.sh writes gpu_check.log itself)")
    ap.add_argument("--convert-gguf", nargs=2, type=Path, metavar=("GGUF", "DST"),
                    help="convert the SmolLM2 GGUF (sha256-checked) into a model folder")
    ap.add_argument("--preflight", action="store_true", help="check versions/CUDA/imports only")
    ap.add_argument("--allow-cpu", action="store_true", help="preflight: no GPU is fine")
    ap.add_argument("--pack-minilm", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--unpack-minilm", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--shim", type=Path, default=None, help="with --unpack-minilm: site folder")
    ap.add_argument("--import-mlflow", type=Path, metavar="DIR", default=None)
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--rescore", type=Path, metavar="DIR", default=None)
    return ap


def _tool(args: argparse.Namespace) -> int | None:
    """Run the one tool ``args`` asks for and return its exit status; None when they ask for a
    run of the check."""
    if args.pack_minilm:
        print(json.dumps(pack_minilm(*args.pack_minilm)))
        return 0
    if args.unpack_minilm:
        print(unpack_minilm(*args.unpack_minilm, shim_site=args.shim))
        return 0
    if args.preflight:
        return preflight(args.out, need_cuda=not args.allow_cpu)
    if args.convert_gguf:
        print(json.dumps(convert_gguf(*args.convert_gguf)))
        return 0
    if args.save_tokenizer:
        from hargo.testing import save_tokenizer

        print(save_tokenizer(args.save_tokenizer))
        return 0
    if args.import_mlflow:
        print(f"MLflow run {import_mlflow(args.import_mlflow, args.tracking_uri)}")
        return 0
    if args.rescore:
        res = rescore(args.rescore, args.data or ROOT / "data" / "prepared", args.out)
        print("\n".join(_summary_lines({"compare": res})))
        return 0
    return None


def _run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """A run of the check (dry, smoke or GPU), its output teed into ``gpu_check.log``; 0 when
    it passed."""
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; valid: {', '.join(PARTS)}")
    dry = args.dry_run or args.smoke
    budget = args.time_budget_s or (900.0 if dry else 480.0)
    if args.dry_run:
        hide_packages()   # as on the GPU machine: no MLflow, Prefect, DVC, GE, vLLM
        os.environ["CUDA_VISIBLE_DEVICES"] = ""   # the CPU, even on a GPU host
    args.out.mkdir(parents=True, exist_ok=True)
    fh = open(os.devnull if args.no_log_file else args.out / "gpu_check.log", "a",
              encoding="utf-8")
    sys.stdout, sys.stderr = _Tee(sys.__stdout__, fh), _Tee(sys.__stderr__, fh)
    try:
        data = args.data if args.data is not None else (None if dry
                                                         else ROOT / "data" / "prepared")
        kind = "smoke run" if args.smoke else "dry run" if args.dry_run else "GPU run"
        log(f"{kind}: parts {parts}, budget {budget:.0f} s, out {args.out}")
        res = run_check(args.out, parts, dry, args.model, data, budget, args.keep_work,
                        tokenizer_dir=args.tokenizer, use_device=not args.dry_run)
        for line in _summary_lines(res):
            log(line)
        return 0 if res.get("passed") else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        fh.close()
