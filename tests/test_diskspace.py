"""A full disk (issue 30, item 7): a one-line hargo message naming the path, the free space and
what the stage needs, whichever library hit it; nothing half written.

The real-disk tests mount a 256 KiB tmpfs (the suite runs as root on the CI machine); the
recognition of each library's wording is also checked on the exact messages they gave there."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import typer

from hargo.diskspace import disk_full, disk_full_message, human_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs: writes past that fail with ENOSPC."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:   # not root: the message tests below still run
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_each_librarys_full_disk_error_is_recognised(full_disk):
    import safetensors.torch as st
    import torch

    big = {"w": torch.zeros(512, 512)}          # 1 MiB
    writers = {
        "torch": lambda: torch.save(big, full_disk / "a.pt"),
        "safetensors": lambda: st.save_file(big, str(full_disk / "b.safetensors")),
        "python": lambda: (full_disk / "c.txt").write_text("x" * 2_000_000),
    }
    for name, write in writers.items():
        with pytest.raises(Exception) as e:
            write()
        assert disk_full(e.value), (name, repr(e.value))
        for f in full_disk.iterdir():
            f.unlink()


def test_the_texts_libraries_wrap_it_in():
    assert disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert disk_full(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    torch_msg = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
    assert disk_full(RuntimeError(torch_msg))
    assert disk_full(RuntimeError("[enforce fail at inline_container.cc:603] . "
                                  "PytorchStreamWriter failed writing file data/3: file write failed"))
    assert disk_full(Exception("Error while serializing: I/O error: No space left on device "
                               "(os error 28)"))
    try:   # chained: a library error raised while handling the OSError
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("could not save the checkpoint") from inner
    except ValueError as e:
        assert disk_full(e)
    for other in (FileNotFoundError(errno.ENOENT, "No such file"), ValueError("unexpected pos 3"),
                  RuntimeError("CUDA out of memory"), PermissionError(errno.EACCES, "denied")):
        assert not disk_full(other), other


def test_message_names_path_free_space_and_need(tmp_path):
    model = tmp_path / "models" / "base"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"\0" * 3 * 1024 * 1024)
    e = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "models" / "sft" / "x"))
    msg = disk_full_message(e, model_dir=model)
    free = human_bytes(shutil.disk_usage(tmp_path).free)
    assert msg.startswith(f"no space left on device writing {tmp_path}/models/sft/x: {free} free")
    assert f"a model of about 3.0 MiB (the size of {model})" in msg
    # no file name in the error: the stage's output folder, made absolute
    msg = disk_full_message(RuntimeError("os error 28"), out_dir="rel")
    assert msg.startswith(f"no space left on device writing {Path('rel').absolute()}:")
    assert "a model of" not in msg
    assert (human_bytes(512), human_bytes(1536), human_bytes(5 * 1024 ** 3)) == \
        ("512 B", "1.5 KiB", "5.0 GiB")


def test_a_stage_on_a_full_disk_says_so_in_one_line_and_leaves_nothing(full_disk, monkeypatch,
                                                                       capsys):
    """`hargo synthetic-data` with its outputs on the full disk: exit 1, one error line naming
    the folder, no traceback, and no data/synthetic (whole or not at all)."""
    from typer.testing import CliRunner

    from hargo.cli import app

    shutil.copy(ROOT / "params.yaml", full_disk / "params.yaml")
    monkeypatch.chdir(full_disk)
    res = CliRunner().invoke(app, ["synthetic-data", "--params", "params.yaml"])
    assert res.exit_code == 1, res.output
    out = res.output.strip().splitlines()
    assert out[-1].startswith(f"error: no space left on device writing {full_disk}"), out
    assert "Traceback" not in res.output and "free of 256.0 KiB" in out[-1]
    assert not (full_disk / "data" / "synthetic").exists() or \
        not any((full_disk / "data" / "synthetic").iterdir())
    # other errors are not dressed up as a full disk
    from hargo.cli import _run

    with pytest.raises(typer.Exit):
        _run(lambda p: (_ for _ in ()).throw(ValueError("bad record")), {})
    assert "error: ValueError: bad record" in capsys.readouterr().err
