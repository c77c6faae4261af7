"""Cepstral mean and variance normalisation of [frames, dim] features: global statistics (accumulated in float64
over a training set, saved as JSON) and per-utterance normalisation; numpy on the host.

Speaker-level mean normalisation in the waveform domain: :func:`long_term_log_spectrum` is the mean log power
spectrum of all frames of a speaker's (unlabelled) recordings, and :func:`equalize_spectrum` filters a recording
(zero phase, FFT of the whole signal) so that this long-term spectrum becomes a target one: a speaker's channel and
vocal tract tilt are taken out before any feature, as per-speaker CMN does to log-mel features (approximately: mel
bands pool FFT bins)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable

import numpy as np

__all__ = ["CmvnStats", "accumulate_cmvn", "utterance_cmvn", "apply_cmvn", "long_term_log_spectrum",
           "equalize_spectrum"]


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


def _frame_geometry(sample_rate: int, frame_ms: float, shift_ms: float) -> tuple[int, int, int]:
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
    win, shift = int(sample_rate * frame_ms / 1000), int(sample_rate * shift_ms / 1000)
    if win < 2 or shift < 1:
        raise ValueError(f"frame_ms={frame_ms} / shift_ms={shift_ms} give {win} / {shift} samples at {sample_rate} Hz")
    return win, shift, 1 << (win - 1).bit_length()


def long_term_log_spectrum(signals: Iterable[np.ndarray], sample_rate: int, *, frame_ms: float = 25.0,
                           shift_ms: float = 10.0, floor: float = 1e-10) -> np.ndarray:
    """Mean over all frames of all `signals` (1-D float) of log(|rfft(Hann-windowed frame)|^2 + floor): float64
    [n_fft // 2 + 1], n_fft the power of two >= the frame length. Signals shorter than a frame are zero-padded."""
    win, shift, n_fft = _frame_geometry(sample_rate, frame_ms, shift_ms)
    window = np.hanning(win + 2)[1:-1]
    total, count = np.zeros(n_fft // 2 + 1), 0
    for x in signals:
        x = np.asarray(x, np.float64)
        if x.ndim != 1:
            raise ValueError(f"signals must be 1-D, got shape {x.shape}")
        if x.shape[0] < win:
            x = np.pad(x, (0, win - x.shape[0]))
        idx = np.arange(0, x.shape[0] - win + 1, shift)[:, None] + np.arange(win)[None, :]
        power = np.abs(np.fft.rfft(x[idx] * window, n=n_fft, axis=-1)) ** 2
        total += np.log(power + floor).sum(0)
        count += power.shape[0]
    if count == 0:
        raise ValueError("long_term_log_spectrum: no signals")
    return total / count


def equalize_spectrum(audio: np.ndarray, log_spectrum: np.ndarray, target: np.ndarray | float = 0.0) -> np.ndarray:
    """`audio` (1-D float) filtered by the zero-phase gain sqrt(exp(target - log_spectrum)) per frequency (both
    [K] over 0 .. Nyquist, as from :func:`long_term_log_spectrum`; linearly interpolated onto the signal's FFT
    grid); float32, same length. A recording whose long-term log spectrum is `log_spectrum` comes out with about
    `target`."""
    x = np.asarray(audio, np.float64)
    ls = np.asarray(log_spectrum, np.float64)
    tg = np.broadcast_to(np.asarray(target, np.float64), ls.shape)
    if x.ndim != 1:
        raise ValueError(f"audio must be 1-D, got shape {x.shape}")
    if ls.ndim != 1 or ls.shape[0] < 2 or not np.all(np.isfinite(ls)) or not np.all(np.isfinite(tg)):
        raise ValueError(f"log_spectrum must be finite [K >= 2] (and target finite), got shape {ls.shape}")
    n = 1 << (x.shape[0] + 2 * (ls.shape[0] - 1) - 1).bit_length()     # room for the filter's tails
    grid = np.linspace(0.0, 1.0, n // 2 + 1)
    gain = np.exp(0.5 * np.interp(grid, np.linspace(0.0, 1.0, ls.shape[0]), tg - ls))
    return np.fft.irfft(np.fft.rfft(x, n=n) * gain, n=n)[:x.shape[0]].astype(np.float32)
