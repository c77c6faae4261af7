"""Faults around a training run (issue 21): a corrupt latest checkpoint (resume and decode fall back to the newest
one that reads back whole), a full disk (one clear error naming the run folder, the previous checkpoint kept), and
train.py's clean errors (exit status 2) for mistakes in the input. Tiny Conformer-CTC runs on real speech (FSDD)."""
import errno
import importlib.util
import json
import os
import subprocess

import pytest

from jasr.checkpoint import Checkpointer, CheckpointError
from jasr.config import apply_override, load_config_file
from jasr.logs import read_jsonl
from jasr.training import load_run, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")

TINY = {"data.dev_manifest": "", "data.speakers_dev": "()", "data.speed_perturb": "()", "data.num_buckets": "1",
        "data.max_frames": "800", "model.d_model": "16", "model.num_layers": "1", "model.num_heads": "2",
        "model.ff_mult": "2", "model.conv_kernel": "3", "model.subsampling_channels": "4", "train.num_steps": "6",
        "train.log_every": "1", "train.eval_every": "1000", "train.checkpoint_every": "2", "train.keep_last": "3",
        "train.progress": "False", "train.tensorboard": "False", "optim.warmup_steps": "0",
        "optim.schedule": "constant"}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """8 FSDD recordings (0.3-0.8 s, 8 kHz) with absolute paths."""
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if r["speaker"] == "george"][::50][:8]
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps({**r, "audio": os.path.abspath(os.path.join(FSDD, r["audio"]))}) + "\n"
                            for r in rows))
    return str(path)


def _overrides(manifest, **kw):
    out = {**TINY, "data.train_manifest": manifest}
    out.update({k.replace("__", "."): str(v) for k, v in kw.items()})
    return out


def _cfg(manifest, **kw):
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    for k, v in _overrides(manifest, **kw).items():
        apply_override(cfg, k, v)
    return cfg


def _train_records(workdir):
    return [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["kind"] == "train"]


# ------------------------------------------------------------------------------------------------ corrupt checkpoint

def test_corrupt_latest_checkpoint_resume_and_decode_fall_back(tmp_path, manifest, capsys):
    wd = tmp_path / "run"
    cfg = _cfg(manifest, train__async_checkpoint=False)
    train(cfg, str(wd), root=ROOT)
    ref = _train_records(wd)
    assert sorted(int(n) for n in os.listdir(wd / "checkpoints")) == [2, 4, 6]
    # the newest step's array data files cut to half their size (as an interrupted copy leaves them; which of the
    # files orbax reads for a given array is its business)
    for data in (wd / "checkpoints" / "6").glob("state/**/d/*"):
        data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
    capsys.readouterr()

    # decode.py's loader: "latest" and "best" fall back (saying so); the corrupt step asked for by number is an error
    run = load_run(str(wd), checkpoint="latest", root=ROOT)
    assert run.step == 4
    err = capsys.readouterr().err
    assert f"checkpoint step 6 of {wd} does not read back whole" in err and "skipped it" in err
    with pytest.raises(CheckpointError, match=f"checkpoint step 6 in {wd}/checkpoints does not read back whole"):
        load_run(str(wd), checkpoint="6", root=ROOT)

    # resume: from step 4, with the same losses as the uninterrupted run from there
    train(cfg, str(wd), root=ROOT)
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if "skipped it" in line]
    assert len(skipped) == 1 and skipped[0].startswith("[train] checkpoint step 6 does not read back whole (")
    assert f"resumed from {wd}/checkpoints at step 4" in out
    got = _train_records(wd)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(ref, got):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
    assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4", "6", "6.corrupt"]
    assert load_run(str(wd), checkpoint="latest", root=ROOT).step == 6, "step 6 was written again"


# ------------------------------------------------------------------------------------------------ full disk

def _train_cli():
    spec = importlib.util.spec_from_file_location("train_cli", os.path.join(ROOT, "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _argv(workdir, overrides):
    return ["--config", os.path.join(ROOT, "configs", "fsdd.py"), "--workdir", str(workdir)] + \
        [f"--config.{k}={v}" for k, v in overrides.items()]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs when this process may mount one (root), else None."""
    d = tmp_path / "disk"
    d.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True,
                           timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        r = None
    if r is None or r.returncode != 0:
        yield None
        return
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30, check=False)


def test_full_disk_is_one_clear_error_naming_the_workdir(tmp_path, manifest, small_disk, capfd, monkeypatch):
    """A real full disk (a tmpfs, filled up after the first checkpoint) where the test may mount one, else a
    checkpoint writer that fails as a full disk does (ENOSPC)."""
    main = _train_cli()
    wd = (small_disk or tmp_path) / "run"
    argv = _argv(wd, _overrides(manifest))
    assert main(argv + ["--config.train.stop_after=2"]) == 0
    capfd.readouterr()
    if small_disk is not None:
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        (small_disk / "filler").write_bytes(b"\0" * (free - 100_000))   # room for the logs, not a checkpoint
    else:
        from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch

        async def full_disk(self, x, directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "metadata"))
        monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", full_disk)
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"train.py: error: no space left on device while writing checkpoint step 4 to "
                          f"{wd}/checkpoints ("), err[:2000]
    assert err.rstrip().endswith("the checkpoints before it are kept (latest: step 2)"), err[:2000]
    assert len(err.strip().splitlines()) == 1, err[:2000]
    monkeypatch.undo()
    if small_disk is not None:
        (small_disk / "filler").unlink()
    with Checkpointer(str(wd / "checkpoints"), async_save=False) as c:
        assert c.all_steps() == [2]
    assert load_run(str(wd), checkpoint="latest", root=ROOT).step == 2, "the previous checkpoint reads back whole"


def test_full_disk_outside_checkpoints_names_the_file_and_workdir(tmp_path, manifest, capfd, monkeypatch):
    """ENOSPC from a plain write (here: config.json, whose write fails on the rename) is the same one line."""
    import jasr.config

    def full_replace(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(jasr.config.os, "replace", full_replace)
    wd = tmp_path / "run"
    assert _train_cli()(_argv(wd, _overrides(manifest))) == 2
    err = capfd.readouterr().err
    assert err == (f"train.py: error: no space left on device while writing {wd}/config.json (--workdir {wd}): "
                   f"No space left on device\n"), err
    assert not os.path.exists(wd / "config.json.tmp")


# ------------------------------------------------------------------------------------------------ user errors

def _bad_audio(tmp_path):
    p = tmp_path / "noise.wav"
    p.write_bytes(os.urandom(3000))
    return p


@pytest.mark.parametrize("case", ["manifest_json", "missing_audio", "random_bytes_audio", "tokenizer",
                                  "longer_than_buckets"])
def test_train_cli_user_errors_are_one_line_with_status_2(tmp_path, manifest, capfd, case):
    main = _train_cli()
    with open(manifest) as f:
        rows = [json.loads(line) for line in f]
    bad = tmp_path / "bad.jsonl"
    extra = {}
    if case == "manifest_json":
        bad.write_text("{\"id\": \"a\", \"audio\": \n")
        named = str(bad)
    elif case == "missing_audio":
        bad.write_text("".join(json.dumps({**r, "audio": str(tmp_path / f"gone_{i}.wav")}) + "\n"
                               for i, r in enumerate(rows)))
        named = "gone_0.wav"
    elif case == "random_bytes_audio":
        noise = _bad_audio(tmp_path)
        bad.write_text("".join(json.dumps({**r, "audio": str(noise), "id": f"n{i}"}) + "\n"
                               for i, r in enumerate(rows)))
        named = str(noise)
    elif case == "tokenizer":
        bad = manifest
        tok = tmp_path / "tokenizer.json"
        tok.write_text("not a tokenizer")
        extra["data.tokenizer"] = str(tok)
        named = str(tok)
    else:
        bad = manifest
        extra["data.bucket_boundaries"] = "(0.1,)"
        named = "0.1"
    rc = main(_argv(tmp_path / "run", {**_overrides(str(bad)), **extra}))
    err = capfd.readouterr().err
    assert rc == 2, err[-3000:]
    assert err.startswith("train.py: error: ") and "Traceback" not in err, err[-3000:]
    assert named in err, err[-3000:]
