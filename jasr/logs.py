"""Training logs: a tqdm progress bar, TensorBoard event files (tensorboardX) and a JSONL metrics log.

On resume from step S the JSONL log is cut back to records with ``step <= S`` and TensorBoard purges events after
S, so a resumed run's logs read as if the run had never been interrupted.
"""
from __future__ import annotations

import json
import math
import os
import time

from tensorboardX import SummaryWriter
from tqdm.auto import tqdm


def truncate_jsonl(path: str, max_step: int) -> None:
    """Keeps only records with ``step <= max_step`` (atomic rewrite). Drops a torn last line."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
            if rec.get("step", -1) <= max_step:
                keep.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def _finite(v):
    return v if isinstance(v, (int, str)) or (isinstance(v, float) and math.isfinite(v)) else str(v)


class TrainLogger:
    """Progress bar + TensorBoard + JSONL for one run in `workdir`.

    Args:
      workdir: run folder; writes ``metrics.jsonl`` and ``tb/``.
      total_steps: for the bar and the ETA.
      start_step: the step training resumes from (0 for a fresh run).
      progress: show the tqdm bar (stderr).
    """

    def __init__(self, workdir: str, total_steps: int, start_step: int = 0, progress: bool = True,
                 tensorboard: bool = True):
        os.makedirs(workdir, exist_ok=True)
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        truncate_jsonl(self.jsonl_path, start_step)
        self._jsonl = open(self.jsonl_path, "a")
        self._tb = None
        if tensorboard:
            self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=start_step + 1 if start_step else None)
        self._bar = tqdm(total=total_steps, initial=start_step, disable=not progress, dynamic_ncols=True,
                         unit="step", desc="train")
        self._t0 = time.time()
        self._last_step = start_step
        self._last_time = time.time()
        self._utts = 0.0
        self._audio_s = 0.0

    def count(self, utterances: float, audio_seconds: float) -> None:
        """Adds one batch's real (unpadded) utterances and audio seconds to the throughput counters."""
        self._utts += utterances
        self._audio_s += audio_seconds

    def log_train(self, step: int, metrics: dict) -> dict:
        """Logs averaged training metrics at `step`; adds throughput. Returns the record written."""
        now = time.time()
        dt = max(now - self._last_time, 1e-9)
        rec = {"step": int(step), "kind": "train", **{k: _finite(float(v)) for k, v in metrics.items()},
               "utterances_per_s": self._utts / dt, "audio_seconds_per_s": self._audio_s / dt,
               "wall_s": now - self._t0}
        self._utts = self._audio_s = 0.0
        self._last_time = now
        self._write(rec)
        if self._tb is not None:
            for k, v in rec.items():
                if k not in ("step", "kind", "wall_s") and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"train/{k}", v, step)
        self._bar.set_postfix(loss=f"{rec.get('loss', float('nan')):.4g}" if isinstance(rec.get("loss"), float)
                              else rec.get("loss"),
                              lr=f"{rec.get('lr', 0.0):.3g}", utt_s=f"{rec['utterances_per_s']:.1f}",
                              audio_s=f"{rec['audio_seconds_per_s']:.1f}", refresh=False)
        return rec

    def log_eval(self, step: int, split: str, metrics: dict) -> dict:
        rec = {"step": int(step), "kind": f"eval/{split}", **{k: _finite(v) for k, v in metrics.items()}}
        self._write(rec)
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{split}/{k}", v, step)
        self._bar.write(f"[step {step}] {split}: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
        return rec

    def advance(self, step: int) -> None:
        self._bar.update(step - self._last_step)
        self._last_step = step

    def write(self, msg: str) -> None:
        self._bar.write(msg)

    def _write(self, rec: dict) -> None:
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()

    def flush(self) -> None:
        self._jsonl.flush()
        os.fsync(self._jsonl.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._bar.close()
        self.flush()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
