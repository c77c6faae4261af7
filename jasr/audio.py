"""Audio file reading: soundfile (wav, flac, ogg, ...) -> mono float32, resampled with soxr.

All functions are pure (no global state). Errors on unreadable files are `AudioError` naming the path.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import soundfile as sf
import soxr

__all__ = ["AudioError", "AudioInfo", "audio_info", "load_audio", "resample", "to_mono"]


class AudioError(Exception):
    """An audio file is missing, unreadable or corrupt (the message names the path)."""


@dataclasses.dataclass(frozen=True)
class AudioInfo:
    """What the file header says: native `sample_rate`, `num_samples` per channel, `channels`."""
    sample_rate: int
    num_samples: int
    channels: int

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


def audio_info(path: str | os.PathLike) -> AudioInfo:
    """Reads only the header of `path`. Raises AudioError if missing or not an audio file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AudioError(f"audio file not found: {path}")
    try:
        info = sf.info(path)
    except Exception as e:  # soundfile raises LibsndfileError / RuntimeError / TypeError
        raise AudioError(f"cannot read audio file {path}: {e}") from e
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels))


def to_mono(audio: np.ndarray) -> np.ndarray:
    """[n] or [n, channels] -> [n] float32 (channel mean)."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 2:
        audio = audio.mean(axis=1, dtype=np.float32)
    elif audio.ndim != 1:
        raise ValueError(f"audio must be [n] or [n, channels], got shape {audio.shape}")
    return audio


def resample(audio: np.ndarray, orig_sr: int, target_sr: int, *, quality: str = "HQ") -> np.ndarray:
    """Band-limited resampling with soxr. audio [n] float -> [round(n * target_sr / orig_sr)] float32."""
    audio = np.asarray(audio, dtype=np.float32)
    if orig_sr <= 0 or target_sr <= 0:
        raise ValueError(f"sample rates must be positive, got orig_sr={orig_sr}, target_sr={target_sr}")
    if orig_sr == target_sr or audio.shape[0] == 0:
        return audio
    return soxr.resample(audio, orig_sr, target_sr, quality=quality).astype(np.float32, copy=False)


def load_audio(path: str | os.PathLike, sample_rate: int | None = 16000, *, mono: bool = True,
               offset: float = 0.0, duration: float | None = None) -> np.ndarray:
    """Reads `path` (any format libsndfile decodes) -> float32 [n] in [-1, 1] at `sample_rate`.

    `sample_rate=None` keeps the file's own rate. `offset`/`duration` (seconds, in the file's time) read a segment.
    `mono=False` returns [n, channels]. Raises AudioError naming the path when the file is missing or corrupt.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AudioError(f"audio file not found: {path}")
    try:
        with sf.SoundFile(path) as f:
            sr = int(f.samplerate)
            start = int(round(offset * sr))
            if start:
                f.seek(start)
            frames = -1 if duration is None else int(round(duration * sr))
            data = f.read(frames=frames, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError(f"cannot decode audio file {path}: {e}") from e
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path} holds no samples")
    if not np.all(np.isfinite(data)):
        raise AudioError(f"audio file {path} decodes to non-finite samples")
    if sample_rate is None:
        sample_rate = sr
    if mono:
        return resample(to_mono(data), sr, sample_rate)
    if sr == sample_rate:
        return data
    return np.stack([resample(data[:, c], sr, sample_rate) for c in range(data.shape[1])], axis=1)
