"""Multi-process training (jasr.distributed): two processes on localhost, joined by jax.distributed with gloo CPU
collectives and 2 host CPU devices each, train a tiny Conformer-CTC through train.py's --coordinator /
--num-processes / --process-id and match one single-device process step by step; the checkpoint they write together
resumes in one process with the same losses. Plus the settings' checks and the loader's per-process row blocks
(no processes needed)."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from jasr.augment import AudioAugment
from jasr.data import BatchConfig, make_loader
from jasr.distributed import distributed_settings
from jasr.features import FeatureConfig
from jasr.logs import read_jsonl
from jasr.manifests import read_manifest
from jasr.tokenizers import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")

OVERRIDES = {"data.speakers_dev": "()", "data.speed_perturb": "()", "data.gain_db": "()",
             "data.spec_augment": "False", "data.max_frames": "2400", "data.num_buckets": "1",
             "data.max_batch_size": "8", "model.d_model": "32", "model.num_layers": "1", "model.num_heads": "2",
             "model.ff_mult": "2", "model.conv_kernel": "7", "model.subsampling_channels": "8",
             "model.dropout_rate": "0.0", "model.ff_dropout_rate": "0.0", "optim.warmup_steps": "0",
             "optim.schedule": "constant", "optim.lr": "1e-3", "train.num_steps": "4", "train.log_every": "1",
             "train.checkpoint_every": "2", "train.eval_every": "2", "train.progress": "False",
             "train.tensorboard": "False", "train.async_checkpoint": "False"}


def _manifest(path: str, suffixes: tuple[str, ...]) -> str:
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    rows = [{**r, "audio": os.path.abspath(os.path.join(FSDD, r["audio"]))} for r in recs if r["id"].endswith(suffixes)]
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train(workdir: str, devices: int, *extra: str, **overrides: str) -> subprocess.Popen:
    cfg = {**OVERRIDES, **overrides}
    cmd = [sys.executable, "train.py", "--config", "configs/fsdd.py", *[f"--config.{k}={v}" for k, v in cfg.items()],
           "--workdir", workdir, *extra]
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=os.path.join(ROOT, ".cache", "jax"))
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outs.append(out)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-6000:]
    return outs


def _records(workdir: str, kind: str) -> list[dict]:
    return [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["kind"] == kind]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one_and_their_checkpoint_resumes_in_one(tmp_path):
    train = _manifest(str(tmp_path / "train.jsonl"), ("_george_0", "_george_1"))     # 20 utterances
    dev = _manifest(str(tmp_path / "dev.jsonl"), ("_theo_0",))                         # 10
    data = {"data.train_manifest": train, "data.dev_manifest": dev}
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    coordinator = f"127.0.0.1:{_free_port()}"
    # 2 processes x 2 devices, 4-way data parallel, stopped after 2 steps; beside them the single-device reference
    procs = [_train(two, 2, "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(p),
                    **data, **{"mesh.data": "-1", "train.stop_after": "2"}) for p in (0, 1)]
    procs.append(_train(one, 1, **data, **{"mesh.data": "1"}))
    out0, out1, _ = _finish(procs)
    assert "[train] process 0 of 2 (explicit); 2 local of 4 devices" in out0
    assert "[train] mesh {'pipeline': 1, 'data': 4, 'fsdp': 1, 'tensor': 1} over 4 of 4 devices" in out0
    assert "each loading 1/2 of every batch" in out0
    assert "[train] process 1 of 2" in out1 and "[train] model" not in out1    # only process 0 reports
    assert "[step 2] dev:" in out0 and "[step 2] dev:" not in out1

    ref = {r["step"]: r for r in _records(one, "train")}
    got = {r["step"]: r for r in _records(two, "train")}
    assert sorted(ref) == [1, 2, 3, 4] and sorted(got) == [1, 2], (sorted(ref), sorted(got))   # one writer
    for s in got:
        assert got[s]["loss"] == pytest.approx(ref[s]["loss"], rel=1e-4), s
    ref_dev = {r["step"]: r for r in _records(one, "eval/dev")}
    got_dev = {r["step"]: r for r in _records(two, "eval/dev")}
    assert sorted(got_dev) == [2]
    assert got_dev[2]["loss"] == pytest.approx(ref_dev[2]["loss"], rel=1e-4)
    assert got_dev[2]["utterances"] == ref_dev[2]["utterances"] == 10

    # the checkpoint the two processes wrote together (4-device mesh) resumes in one process on one device
    out, = _finish([_train(two, 1, **data, **{"mesh.data": "1"})])
    assert "resumed from" in out and "at step 2" in out
    got = {r["step"]: r["loss"] for r in _records(two, "train")}
    assert sorted(got) == [1, 2, 3, 4]
    for s in (3, 4):
        assert got[s] == pytest.approx(ref[s]["loss"], rel=1e-4), s
    assert _records(two, "eval/dev")[-1]["loss"] == pytest.approx(ref_dev[4]["loss"], rel=1e-4)


def test_distributed_settings_from_flags_environment_and_clusters():
    assert distributed_settings(env={}) is None
    s = distributed_settings("10.0.0.1:1234", 2, 1, env={})
    assert (s.auto, s.coordinator, s.num_processes, s.process_id) == (False, "10.0.0.1:1234", 2, 1)
    env = {"JASR_COORDINATOR": "host:99", "JASR_NUM_PROCESSES": "4", "JASR_PROCESS_ID": "3"}
    s = distributed_settings(env=env)
    assert (s.coordinator, s.num_processes, s.process_id) == ("host:99", 4, 3)
    assert distributed_settings(process_id=0, env=env).process_id == 0          # a flag beats the environment
    assert distributed_settings("auto", env={}).auto
    assert distributed_settings(env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}).auto
    assert distributed_settings(env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None     # one task
    assert distributed_settings(env={"TPU_WORKER_HOSTNAMES": "t0,t1"}).auto
    assert distributed_settings(env={"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    with pytest.raises(ValueError, match="missing --process-id"):
        distributed_settings("h:1", 2, env={})
    with pytest.raises(ValueError, match="HOST:PORT"):
        distributed_settings("h", 2, 0, env={})
    with pytest.raises(ValueError, match=r"process_id must be in \[0, 2\)"):
        distributed_settings("h:1", 2, 2, env={})
    with pytest.raises(ValueError, match="JASR_NUM_PROCESSES must be an integer"):
        distributed_settings(env={"JASR_NUM_PROCESSES": "two", "JASR_COORDINATOR": "h:1", "JASR_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="do not also pass"):
        distributed_settings("auto", 2, env={})


def test_row_blocks_of_two_processes_join_into_the_single_process_batches(tmp_path):
    """make_loader(row_index=i, row_count=2) builds rows [i * B / 2, (i + 1) * B / 2) of the batches a single
    loader yields, augmentation (speed, gain, noise, dither) included, over two epochs."""
    utts = read_manifest(_manifest(str(tmp_path / "train.jsonl"), ("_george_0", "_george_1", "_george_2")))
    tok = CharTokenizer.from_texts(u.text for u in utts)
    fc = FeatureConfig(kind="fbank", sample_rate=8000, num_mel_bins=16, dither=1.0)
    bc = BatchConfig(max_frames=800, num_buckets=2, batch_pad_multiple=2)
    aug = AudioAugment(speeds=(0.9, 1.0, 1.1), gain_db=(-6.0, 6.0), noise_snr_db=(10.0, 20.0), noise_prob=0.5)

    def batches(**rows):
        return list(make_loader(utts, tok, fc, bc, seed=5, num_epochs=2, augment=aug, **rows))
    whole, first, second = batches(), batches(row_index=0, row_count=2), batches(row_index=1, row_count=2)
    assert len(whole) == len(first) == len(second) > 4
    assert {b["features"].shape[0] for b in whole} != {1}                      # batches of several rows
    for w, a, b in zip(whole, first, second):
        assert list(a["global_ids"]) == list(b["global_ids"]) == list(w["ids"])
        for k in ("features", "feature_paddings", "labels", "label_paddings", "ids", "label_weights"):
            np.testing.assert_array_equal(np.concatenate([a[k], b[k]]), w[k], err_msg=k)
    with pytest.raises(ValueError, match="do not split into 3 equal row blocks"):
        make_loader(utts, tok, fc, bc, row_index=0, row_count=3)
