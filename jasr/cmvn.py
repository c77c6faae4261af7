"""Cepstral mean and variance normalisation of [frames, dim] features: global statistics (accumulated in float64
over a training set, saved as JSON) and per-utterance normalisation; numpy on the host."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable

import numpy as np

__all__ = ["CmvnStats", "accumulate_cmvn", "utterance_cmvn", "apply_cmvn"]


@dataclasses.dataclass(frozen=True)
class CmvnStats:
    """Global mean / standard deviation per feature dim (float64 [F]) and the frame count behind them."""
    mean: np.ndarray
    std: np.ndarray
    count: int

    def save(self, path: str | os.PathLike) -> None:
        """JSON file: {"mean": [...], "std": [...], "count": n}."""
        with open(path, "w") as f:
            json.dump({"mean": [float(x) for x in self.mean], "std": [float(x) for x in self.std],
                       "count": int(self.count)}, f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CmvnStats":
        try:
            with open(path) as f:
                d = json.load(f)
            mean, std = np.asarray(d["mean"], np.float64), np.asarray(d["std"], np.float64)
            count = int(d["count"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"cannot read CMVN stats from {os.fspath(path)}: {e}") from e
        if mean.shape != std.shape or mean.ndim != 1:
            raise ValueError(f"CMVN stats in {os.fspath(path)}: mean {mean.shape} / std {std.shape} mismatch")
        return cls(mean, std, count)


def accumulate_cmvn(features: Iterable[np.ndarray], *, min_std: float = 1e-5) -> CmvnStats:
    """Global stats over all frames of an iterable of [T, F] arrays (float64 sums, one pass)."""
    s = ss = None
    n = 0
    for x in features:
        x = np.asarray(x, np.float64)
        if x.ndim != 2:
            raise ValueError(f"features must be [frames, dim], got shape {x.shape}")
        if s is None:
            s, ss = np.zeros(x.shape[1]), np.zeros(x.shape[1])
        elif x.shape[1] != s.shape[0]:
            raise ValueError(f"feature dim changed from {s.shape[0]} to {x.shape[1]}")
        s += x.sum(0)
        ss += (x * x).sum(0)
        n += x.shape[0]
    if n == 0:
        raise ValueError("no feature frames to compute CMVN stats from")
    mean = s / n
    std = np.sqrt(np.maximum(ss / n - mean * mean, 0.0))
    return CmvnStats(mean, np.maximum(std, min_std), n)


def utterance_cmvn(features: np.ndarray, *, variance: bool = True, eps: float = 1e-5) -> np.ndarray:
    """Per-utterance mean (and variance) normalisation over frames: [T, F] -> float32 [T, F]."""
    x = np.asarray(features, np.float64)
    if x.shape[0] == 0:
        return x.astype(np.float32)
    x = x - x.mean(0, keepdims=True)
    if variance:
        x = x / np.maximum(x.std(0, keepdims=True), eps)
    return x.astype(np.float32)


def apply_cmvn(features: np.ndarray, stats: CmvnStats, *, variance: bool = True) -> np.ndarray:
    """(x - mean) / std with global stats: [T, F] -> float32 [T, F]."""
    if features.shape[-1] != stats.mean.shape[0]:
        raise ValueError(f"CMVN stats have dim {stats.mean.shape[0]}, features have {features.shape[-1]}")
    x = np.asarray(features, np.float64) - stats.mean
    if variance:
        x = x / stats.std
    return x.astype(np.float32)
