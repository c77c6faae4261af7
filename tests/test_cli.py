"""End to end through the command line: train.py on a tiny demo corpus, SIGKILL mid-run, resume, compare the
logged losses with an uninterrupted run; decode.py on the held-out split."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("espeakng_loader")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_args(tmp, workdir, num_steps):
    return [sys.executable, "train.py", "--config", "configs/demo.py", "--workdir", str(workdir),
            f"--config.data.demo_dir={tmp}/corpus", "--config.data.demo_num_train=16",
            "--config.data.demo_num_dev=4", "--config.data.demo_num_heldout=6", "--config.data.demo_max_words=2",
            "--config.data.max_frames=1200", "--config.data.num_buckets=1",
            "--config.model.d_model=32", "--config.model.num_layers=1", "--config.model.num_heads=2",
            "--config.model.ff_mult=2", "--config.model.conv_kernel=7", "--config.model.subsampling_channels=8",
            "--config.optim.schedule=constant", "--config.optim.warmup_steps=2",
            f"--config.train.num_steps={num_steps}", "--config.train.log_every=1",
            "--config.train.checkpoint_every=3", "--config.train.eval_every=1000", "--config.train.keep_last=2",
            "--config.train.progress=false"]


def train_records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r for r in recs if r["kind"] == "train"]


def run(args, **kw):
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_sigkill_resume_logs_same_losses_and_decode(tmp_path):
    steps = 12
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    run(tiny_args(tmp_path, ref_dir, steps))
    ref = train_records(ref_dir)
    assert [r["step"] for r in ref] == list(range(1, steps + 1))

    # the same run with an open-ended step budget (constant lr: num_steps does not change the schedule), killed
    # with SIGKILL after it has logged step 7 (past the checkpoint at step 6)
    proc = subprocess.Popen(tiny_args(tmp_path, kill_dir, 100000), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log = os.path.join(kill_dir, "metrics.jsonl")
    deadline = time.time() + 500
    try:
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(log) and any(json.loads(l)["step"] >= 7 for l in open(log) if l.strip().endswith("}")):
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(r["step"] for r in train_records(kill_dir))
    assert 7 <= killed_at < steps, f"the kill landed at step {killed_at}; the test needs it before step {steps}"
    ckpts = sorted(int(n) for n in os.listdir(kill_dir / "checkpoints") if n.isdigit())
    assert ckpts and max(ckpts) <= killed_at

    out = run(tiny_args(tmp_path, kill_dir, steps)).stdout
    assert f"resumed from" in out and f"at step {max(ckpts)}" in out
    got = train_records(kill_dir)
    assert [r["step"] for r in got] == list(range(1, steps + 1)), "the log reads as one uninterrupted run"
    for a, b in zip(ref, got):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["lr"] == b["lr"], (a, b)
    # no temporary (partially written) checkpoint folders survive; the last K are kept
    names = os.listdir(kill_dir / "checkpoints")
    assert not [n for n in names if "tmp" in n], names
    assert sorted(int(n) for n in names if n.isdigit())[-1] == steps
    assert os.path.isdir(kill_dir / "tb") and os.listdir(kill_dir / "tb")

    # a different config cannot silently resume this run
    bad = subprocess.run(tiny_args(tmp_path, kill_dir, steps) + ["--config.optim.lr=0.5"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "different config" in (bad.stderr + bad.stdout)
    run(tiny_args(tmp_path, kill_dir, steps) + ["--config.decode.beam=4"])   # the decode section may change

    dec = run([sys.executable, "decode.py", "--workdir", str(kill_dir), "--split", "heldout", "--show", "2"]).stdout
    assert "WER" in dec and "CER" in dec and "ref:" in dec and "hyp:" in dec
    with open(kill_dir / "decode_heldout.jsonl") as f:
        results = [json.loads(l) for l in f]
    assert len(results) == 6 and all(r["ref"] for r in results)
