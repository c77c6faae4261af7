"""Training logs: a tqdm progress bar, TensorBoard event files (tensorboardX), a JSONL metrics log, and the log of
utterances left out (``skipped.jsonl``, :class:`SkipLog`).

On resume from step S the JSONL logs are cut back to records with ``step <= S`` and TensorBoard purges events
after S, so a resumed run's logs read as if the run had never been interrupted.
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

    def log_data(self, step: int, counts: dict) -> dict:
        """A ``kind: "data"`` record: how many utterances are used, skipped (bad input) and dropped (by config)."""
        rec = {"step": int(step), "kind": "data", **counts}
        self._write(rec)
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


class SkipLog:
    """Every utterance a run leaves out or cannot score, named: ``workdir/skipped.jsonl`` (one record per utterance
    and split: ``{"step", "split", "id", "audio", "action", "cause", "reason"}``) and a line through `echo` for each
    one skipped or dropped.

    action: "skipped" (bad input: unreadable/truncated/non-finite audio, a transcript the tokenizer cannot encode),
    "dropped" (by config: drop_unfit, drop_too_long) or "no_loss" (kept in evaluation with a placeholder label, so
    outside the dev loss but scored; or, in training, a row the CTC loss left out at some step because its label
    cannot align with the model's frames: cause "infeasible"). A (re)started run rewrites the records found before
    its first step (step 0); those found while training (a file that fails on first read at step s) are kept up to
    the step it resumes from, as in metrics.jsonl.
    """

    def __init__(self, workdir: str, start_step: int = 0, echo=print):
        self.path = os.path.join(workdir, "skipped.jsonl")
        self._echo = echo
        earlier = []
        if start_step and os.path.exists(self.path):
            truncate_jsonl(self.path, start_step)
            earlier = [r for r in read_jsonl(self.path) if r.get("step", 0) > 0]
        self.records: list[dict] = earlier
        self._seen = {(r["split"], r["id"], r["action"]) for r in earlier}
        self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)
        os.replace(tmp, self.path)

    def add(self, step: int, split: str, records, action: str, *, echo: bool = True) -> list[dict]:
        """Records `records` (dicts with id, audio, reason and optionally cause) of `split` not logged before;
        returns the new ones. Records of step 0 go before those found during training."""
        new = []
        for r in records:
            key = (split, r["id"], action)
            if key in self._seen:
                continue
            self._seen.add(key)
            rec = {"step": int(step), "split": split, "id": r["id"], "audio": r.get("audio", ""), "action": action,
                   "cause": r.get("cause", "bad_audio"), "reason": r["reason"]}
            new.append(rec)
            if echo:
                self._echo(f"[data] {action} {split} utterance {rec['id']} ({rec['audio']}): {rec['reason']}")
        if not new:
            return new
        if step == 0:
            self.records = [r for r in self.records if r["step"] == 0] + new + [r for r in self.records if r["step"]]
            self._rewrite()
        else:
            self.records += new
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
        return new

    def count(self, split: str, action: str) -> int:
        return sum(r["split"] == split and r["action"] == action for r in self.records)
