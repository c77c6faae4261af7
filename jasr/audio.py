"""Audio file reading: soundfile (wav, flac, ogg, ...) -> mono float32, resampled with soxr.

All functions are pure (no global state). Errors on unreadable files are `AudioError` naming the path.

Lengths are checked, so that a damaged file is an error rather than part of an utterance: libsndfile reports the
samples a truncated WAV or AIFF file still holds (its header's sample count is clamped to the bytes present), so
:func:`audio_info` also reads the count the container's header declares (``declared_samples``); :func:`load_audio`
and :func:`check_audio` compare what the file holds, what its header declares and what the caller expects (a
manifest's duration) and raise AudioError naming the file and both lengths when they differ by more than
`tolerance` seconds (default :data:`LENGTH_TOLERANCE_S`).
"""
from __future__ import annotations

import dataclasses
import os
import struct

import numpy as np
import soundfile as sf
import soxr

__all__ = ["AudioError", "AudioInfo", "LENGTH_TOLERANCE_S", "audio_info", "check_audio", "load_audio",
           "resample", "to_mono"]

# how far (seconds) a decoded length may differ from the header's or the manifest's: manifests round
# durations (often to 10 ms), and lossy decoders may add or drop up to a frame (~26 ms for 44.1 kHz MP3)
LENGTH_TOLERANCE_S = 0.05


class AudioError(Exception):
    """An audio file is missing, unreadable or corrupt (the message names the path)."""


@dataclasses.dataclass(frozen=True)
class AudioInfo:
    """What the file header says: native `sample_rate`, `num_samples` per channel (as libsndfile reports them: for a
    truncated WAV/AIFF file, the samples it still holds), `channels`, and `declared_samples`: the count the WAV
    ``data`` / AIFF ``COMM`` header declares (None for other containers, or a streamed WAV without a size)."""
    sample_rate: int
    num_samples: int
    channels: int
    declared_samples: int | None = None

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


def _declared_samples(path: str) -> int | None:
    """Samples per channel that a WAV (RIFF) or AIFF header declares, from the raw chunks; None if not such a file,
    or if the size is unknown (streamed WAVs write 0 or 0xFFFFFFFF)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            size = os.fstat(f.fileno()).st_size
            if len(head) < 12:
                return None
            if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
                endian, wav = "<", True
            elif head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
                endian, wav = ">", False
            else:
                return None
            pos, block_align = 12, None
            for _ in range(64):              # a handful of chunks precede the samples in practice
                if pos + 8 > size:
                    return None
                f.seek(pos)
                cid, n = struct.unpack(endian + "4sI", f.read(8))
                if wav and cid == b"fmt ":
                    fmt = f.read(min(n, 16))
                    block_align = struct.unpack("<H", fmt[12:14])[0] if len(fmt) >= 14 else None
                elif wav and cid == b"data":
                    if n in (0, 0xFFFFFFFF) or not block_align:
                        return None
                    return n // block_align
                elif not wav and cid == b"COMM":
                    comm = f.read(6)
                    return struct.unpack(">hI", comm)[1] if len(comm) == 6 else None
                pos += 8 + n + (n & 1)
    except (OSError, struct.error):
        return None
    return None


def audio_info(path: str | os.PathLike) -> AudioInfo:
    """Reads only the header of `path`. Raises AudioError if missing or not an audio file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AudioError(f"audio file not found: {path}")
    try:
        info = sf.info(path)
    except Exception as e:  # soundfile raises LibsndfileError / RuntimeError / TypeError
        raise AudioError(f"cannot read audio file {path}: {e}") from e
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels), _declared_samples(path))


def _samples(n: int, sr: int) -> str:
    return f"{n} samples ({n / sr:.3f} s at {sr} Hz)"


def _check_declared(path: str, info: AudioInfo, tolerance: float) -> None:
    d = info.declared_samples
    if d is not None and abs(d - info.num_samples) > tolerance * info.sample_rate:
        raise AudioError(f"audio file {path} is truncated or corrupt: its header declares "
                         f"{_samples(d, info.sample_rate)} but it holds {_samples(info.num_samples, info.sample_rate)}")


def _segment(info: AudioInfo, offset: float, duration: float | None) -> tuple[int, int]:
    """(first sample, samples wanted) of the segment [offset, offset + duration) (to the end without duration)."""
    start = int(round(offset * info.sample_rate))
    want = info.num_samples - start if duration is None else int(round(duration * info.sample_rate))
    return start, want


def check_audio(path: str | os.PathLike, *, expected_duration: float | None = None, offset: float = 0.0,
                duration: float | None = None, tolerance: float = LENGTH_TOLERANCE_S) -> AudioInfo:
    """Header-only check that `path` can be an utterance (cheap: no samples are decoded). Raises AudioError naming
    the file when it is missing or unreadable, holds no samples, holds fewer or more samples than its header
    declares (a truncated WAV/AIFF), or when the segment (`offset`, `duration` seconds) or the whole file is
    shorter or longer than `expected_duration` (e.g. a manifest's) by more than `tolerance` seconds.
    Non-finite samples and damage inside compressed streams only show when decoding (:func:`load_audio`)."""
    path = os.fspath(path)
    info = audio_info(path)
    if info.num_samples <= 0:
        raise AudioError(f"audio file {path} holds no samples")
    _check_declared(path, info, tolerance)
    start, want = _segment(info, offset, duration)
    have = max(min(want, info.num_samples - start), 0)
    if have < want - tolerance * info.sample_rate:
        raise AudioError(f"audio file {path} is too short for its segment: {_samples(want, info.sample_rate)} "
                         f"from {offset} s wanted, it holds {_samples(info.num_samples, info.sample_rate)}")
    if expected_duration is not None and abs(have / info.sample_rate - expected_duration) > tolerance:
        raise AudioError(f"audio file {path} holds {_samples(have, info.sample_rate)} but its manifest duration "
                         f"is {expected_duration} s")
    return info


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
               offset: float = 0.0, duration: float | None = None, expected_duration: float | None = None,
               tolerance: float = LENGTH_TOLERANCE_S) -> np.ndarray:
    """Reads `path` (any format libsndfile decodes) -> float32 [n] in [-1, 1] at `sample_rate`.

    `sample_rate=None` keeps the file's own rate. `offset`/`duration` (seconds, in the file's time) read a segment.
    `mono=False` returns [n, channels]. Raises AudioError naming the path when the file is missing or corrupt: it
    cannot be decoded, holds no samples or non-finite ones, or the samples decoded differ by more than `tolerance`
    seconds from what its header declares (a truncated file), from the segment asked for, or from
    `expected_duration` (seconds, e.g. the manifest's duration of the file or segment).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AudioError(f"audio file not found: {path}")
    try:
        with sf.SoundFile(path) as f:
            sr, total = int(f.samplerate), int(f.frames)
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
    tol = tolerance * sr
    got = data.shape[0]
    header = AudioInfo(sr, total, data.shape[1], _declared_samples(path))
    _check_declared(path, header, tolerance)
    want = max(total - start, 0) if duration is None else frames
    if abs(got - want) > tol:
        what = "its header declares" if duration is None else f"its segment from {offset} s wants"
        raise AudioError(f"audio file {path} is truncated or corrupt: {what} {_samples(want, sr)} but "
                         f"{_samples(got, sr)} decode")
    if expected_duration is not None and abs(got / sr - expected_duration) > tolerance:
        raise AudioError(f"audio file {path} decodes to {_samples(got, sr)} but its manifest duration is "
                         f"{expected_duration} s")
    if sample_rate is None:
        sample_rate = sr
    if mono:
        return resample(to_mono(data), sr, sample_rate)
    if sr == sample_rate:
        return data
    return np.stack([resample(data[:, c], sr, sample_rate) for c in range(data.shape[1])], axis=1)
