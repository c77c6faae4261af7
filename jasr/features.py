"""Acoustic features: Kaldi fbank / MFCC, Whisper log-mel; numpy on the host and jnp (jit-able) on device.

Conventions: features are float32 `[frames, bins]` (Whisper: `[n_mels, frames]`, as its feature extractor);
batched jnp versions take `audio [B, S]` + optax-style `audio_paddings [B, S]` (1.0 = padded) and return
`features [B, T, F]` + `paddings [B, T]`.

Kaldi fbank follows Kaldi's `compute-fbank-feats`: 25 ms / 10 ms frames (snip_edges as Kaldi: true drops partial
frames, false centres frames on multiples of the shift and reflects the signal at its ends), optional dither,
DC removal, raw log-energy, pre-emphasis 0.97, povey window, zero-padding to a power of two, power spectrum,
triangular mel banks on mel(f) = 1127 ln(1 + f / 700), natural log floored at float32 epsilon.
Whisper log-mel follows openai-whisper / transformers' WhisperFeatureExtractor: 400-point periodic Hann STFT,
hop 160, reflect-centred, last frame dropped, Slaney mel banks, log10 floored at 1e-10, dynamic range 8, (x + 4) / 4.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

import jax.numpy as jnp
import numpy as np
import scipy.sparse

from jasr.cmvn import CmvnStats, apply_cmvn, utterance_cmvn

__all__ = [
    "FeatureConfig", "compute_features", "num_frames", "feature_dim", "LEVEL_RMS", "level_gain",
    "fbank", "mfcc", "whisper_log_mel", "log_mel_spectrogram", "librosa_mfcc", "kaldi_mel_banks", "slaney_mel_filters",
    "feature_window",
    "time_major",
    "fbank_jax", "whisper_log_mel_jax", "compute_features_jax",
    "WHISPER_SAMPLE_RATE", "WHISPER_N_FFT", "WHISPER_HOP", "WHISPER_CHUNK_SAMPLES",
]

WHISPER_SAMPLE_RATE = 16000
WHISPER_N_FFT = 400
WHISPER_HOP = 160
WHISPER_CHUNK_SAMPLES = 30 * WHISPER_SAMPLE_RATE  # 480000 samples -> 3000 frames
_F32_EPS = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------------------------------------------------
# Mel filter banks and windows (numpy constants, shared by the numpy and jnp code paths).

def _kaldi_mel(f):
    return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)


@functools.lru_cache(maxsize=32)
def _kaldi_mel_banks_cached(num_bins: int, padded_window: int, sample_rate: int, low_freq: float,
                            high_freq: float) -> np.ndarray:
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq = nyquist + high_freq
    if not (0.0 <= low_freq < high_freq <= nyquist):
        raise ValueError(f"mel banks need 0 <= low_freq < high_freq <= Nyquist ({nyquist} Hz), "
                         f"got low_freq={low_freq}, high_freq={high_freq}")
    num_fft_bins = padded_window // 2
    fft_bin_width = sample_rate / padded_window
    mel_low, mel_high = _kaldi_mel(low_freq), _kaldi_mel(high_freq)
    delta = (mel_high - mel_low) / (num_bins + 1)
    mel = _kaldi_mel(fft_bin_width * np.arange(num_fft_bins))             # [K]
    left = mel_low + delta * np.arange(num_bins)[:, None]                   # [M, 1]
    center, right = left + delta, left + 2.0 * delta
    up = (mel[None] - left) / (center - left)
    down = (right - mel[None]) / (right - center)
    w = np.where((mel[None] > left) & (mel[None] < right), np.where(mel[None] <= center, up, down), 0.0)
    out = np.zeros((num_fft_bins + 1, num_bins), dtype=np.float64)          # Nyquist row stays 0 (as Kaldi)
    out[:num_fft_bins] = w.T
    out.setflags(write=False)
    return out


def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate: int, low_freq: float = 20.0,
                    high_freq: float = 0.0) -> np.ndarray:
    """Kaldi's triangular mel banks -> float64 [padded_window // 2 + 1, num_bins] (acts on an rfft power spectrum).

    high_freq <= 0 means Nyquist + high_freq (Kaldi's convention).
    """
    return _kaldi_mel_banks_cached(int(num_bins), int(padded_window), int(sample_rate), float(low_freq),
                                   float(high_freq))


def _slaney_hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _slaney_mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@functools.lru_cache(maxsize=32)
def _slaney_cached(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    fft_freqs = np.linspace(0.0, sample_rate / 2.0, 1 + n_fft // 2)
    mel_f = _slaney_mel_to_hz(np.linspace(_slaney_hz_to_mel(fmin), _slaney_hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    w = np.maximum(0.0, np.minimum(lower, upper))
    w *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]
    w.setflags(write=False)
    return w


def slaney_mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                       fmax: float | None = None) -> np.ndarray:
    """Slaney-scale, Slaney-normalised mel filters (librosa's default) -> float64 [n_mels, n_fft // 2 + 1]."""
    fmax = sample_rate / 2.0 if fmax is None else fmax
    return _slaney_cached(int(sample_rate), int(n_fft), int(n_mels), float(fmin), float(fmax))


def feature_window(kind: str, length: int, blackman_coeff: float = 0.42) -> np.ndarray:
    """Kaldi analysis windows (symmetric, over `length` samples) -> float64 [length]."""
    i = np.arange(length, dtype=np.float64)
    a = 2.0 * math.pi / (length - 1) if length > 1 else 0.0
    if kind == "povey":
        return (0.5 - 0.5 * np.cos(a * i)) ** 0.85
    if kind == "hanning":
        return 0.5 - 0.5 * np.cos(a * i)
    if kind == "hamming":
        return 0.54 - 0.46 * np.cos(a * i)
    if kind == "rectangular":
        return np.ones(length)
    if kind == "blackman":
        return blackman_coeff - 0.5 * np.cos(a * i) + (0.5 - blackman_coeff) * np.cos(2 * a * i)
    raise ValueError(f"unknown window type {kind!r} (povey, hanning, hamming, rectangular, blackman)")


@functools.lru_cache(maxsize=32)
def _sparse_rows(key: tuple) -> "scipy.sparse.csr_matrix":
    kind, args = key[0], key[1:]
    m = kaldi_mel_banks(*args).T if kind == "kaldi" else slaney_mel_filters(*args)
    return scipy.sparse.csr_matrix(m)


def _apply_filters(key: tuple, power: np.ndarray) -> np.ndarray:
    """Mel filters [M, K] (sparse) applied to a power spectrum [T, K] -> [M, T] float64.

    A sparse product: it is exact and, unlike a dense BLAS matmul of these small shapes, never spins up
    BLAS threads (which stall host feature extraction on a loaded machine).
    """
    return np.asarray(_sparse_rows(key) @ power.T)


def _whisper_window() -> np.ndarray:
    n = WHISPER_N_FFT
    return 0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(n) / n)   # periodic Hann, as torch.hann_window(400)


# ----------------------------------------------------------------------------------------------------------------
# Configuration.

@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """What features to compute. `kind`: "fbank" | "mfcc" | "whisper".

    normalize: "none" | "utterance" (per-utterance mean/variance) | "level" (the waveform scaled to an RMS of
    LEVEL_RMS before the features: the features do not depend on the recording level, and keep the spectral shape
    that CMVN removes) | "global" (CMVN stats from `cmvn_path`).
    Whisper features ignore the Kaldi framing fields (they are fixed by the model: 25 ms / 10 ms at 16 kHz).
    """
    kind: Literal["fbank", "mfcc", "whisper"] = "fbank"
    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0
    preemph_coeff: float = 0.97
    remove_dc_offset: bool = True
    window_type: str = "povey"
    round_to_power_of_two: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    use_energy: bool = False
    energy_floor: float = 0.0
    snip_edges: bool = True
    num_ceps: int = 13
    cepstral_lifter: float = 22.0
    whisper_pad_or_trim: bool = False   # True: pad/cut to 30 s (3000 frames), as WhisperFeatureExtractor
    normalize: Literal["none", "utterance", "level", "global"] = "none"
    normalize_variance: bool = True
    cmvn_path: str | None = None

    def __post_init__(self):
        if self.kind not in ("fbank", "mfcc", "whisper"):
            raise ValueError(f"FeatureConfig.kind must be 'fbank', 'mfcc' or 'whisper', got {self.kind!r}")
        if self.normalize not in ("none", "utterance", "level", "global"):
            raise ValueError(f"FeatureConfig.normalize must be 'none', 'utterance', 'level' or 'global', "
                             f"got {self.normalize!r}")
        if self.kind == "whisper" and self.sample_rate != WHISPER_SAMPLE_RATE:
            raise ValueError(f"Whisper features need sample_rate=16000, got {self.sample_rate}")
        if self.kind == "mfcc" and self.num_ceps > self.num_mel_bins:
            raise ValueError(f"num_ceps={self.num_ceps} > num_mel_bins={self.num_mel_bins}")

    @property
    def window_length(self) -> int:
        return int(self.sample_rate * self.frame_length_ms * 0.001)

    @property
    def window_shift(self) -> int:
        return int(self.sample_rate * self.frame_shift_ms * 0.001)

    @property
    def padded_window(self) -> int:
        n = self.window_length
        return 1 << (n - 1).bit_length() if self.round_to_power_of_two else n


def feature_dim(config: FeatureConfig) -> int:
    """F, the size of one frame's feature vector."""
    if config.kind == "mfcc":
        return config.num_ceps
    return config.num_mel_bins + (1 if config.kind == "fbank" and config.use_energy else 0)


def num_frames(num_samples: int, config: FeatureConfig) -> int:
    """Frames that `compute_features` returns for `num_samples` samples at config.sample_rate."""
    if config.kind == "whisper":
        return WHISPER_CHUNK_SAMPLES // WHISPER_HOP if config.whisper_pad_or_trim else num_samples // WHISPER_HOP
    win, shift = config.window_length, config.window_shift
    if not config.snip_edges:
        return (num_samples + shift // 2) // shift
    return 0 if num_samples < win else 1 + (num_samples - win) // shift


def _frame_indices(num_samples: int, config: FeatureConfig) -> np.ndarray:
    """Sample index of every frame position -> int [T, window_length] (Kaldi's ExtractWindow, incl. reflection)."""
    win, shift = config.window_length, config.window_shift
    t = num_frames(num_samples, config)
    start = np.arange(t)[:, None] * shift
    if not config.snip_edges:
        start = start + shift // 2 - win // 2
    idx = start + np.arange(win)[None, :]
    return _reflect(idx, num_samples)


def _reflect(idx, n):
    """Kaldi's edge reflection: s < 0 -> -s - 1, s >= n -> 2n - 1 - s (works for numpy and jnp arrays)."""
    xp = np if isinstance(idx, np.ndarray) and isinstance(n, (int, np.integer)) else _jnp()
    idx = xp.where(idx < 0, -idx - 1, idx)
    return xp.where(idx >= n, 2 * n - 1 - idx, idx)


def _jnp():
    return jnp


# ----------------------------------------------------------------------------------------------------------------
# numpy (host) features.

def _check_audio(audio, name="audio") -> np.ndarray:
    a = np.asarray(audio)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D [num_samples], got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"{name} must be floating point in [-1, 1], got dtype {a.dtype}")
    return a.astype(np.float64)


LEVEL_RMS = 0.1    # normalize="level": the waveform's RMS (-20 dB re full scale) before the features


def level_gain(sum_squares: float, num_samples: int) -> float:
    """The factor that brings a waveform with these statistics to an RMS of LEVEL_RMS (1.0 for silence)."""
    mean_square = float(sum_squares) / max(int(num_samples), 1)
    return LEVEL_RMS / math.sqrt(mean_square) if mean_square > 0.0 else 1.0


def _kaldi_frames(audio: np.ndarray, config: FeatureConfig, rng: np.random.Generator | None):
    """-> windowed frames zero-padded [T, padded_window] float64 and raw log energy [T]."""
    win, shift = config.window_length, config.window_shift
    t = num_frames(audio.shape[0], config)
    if t == 0:
        return np.zeros((0, config.padded_window)), np.zeros((0,))
    if config.snip_edges:
        frames = np.lib.stride_tricks.sliding_window_view(audio, win)[::shift][:t].copy()
    else:
        idx = _frame_indices(audio.shape[0], config)
        if idx.min() < 0 or idx.max() >= audio.shape[0]:
            raise ValueError(f"snip_edges=False: {audio.shape[0]} samples are too few to reflect a "
                             f"{win}-sample window at the edges")
        frames = audio[idx]
    if config.dither != 0.0:
        if rng is None:
            raise ValueError("dither > 0 needs an explicit rng (np.random.Generator)")
        frames += config.dither * rng.standard_normal(frames.shape)
    if config.remove_dc_offset:
        frames -= frames.mean(axis=1, keepdims=True)
    log_energy = np.log(np.maximum((frames ** 2).sum(axis=1), _F32_EPS))
    if config.energy_floor > 0.0:
        log_energy = np.maximum(log_energy, math.log(config.energy_floor))
    if config.preemph_coeff != 0.0:
        prev = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
        frames = frames - config.preemph_coeff * prev
    frames = frames * feature_window(config.window_type, win)[None]
    if config.padded_window > win:
        frames = np.pad(frames, ((0, 0), (0, config.padded_window - win)))
    return frames, log_energy


def _kaldi_log_mel(audio: np.ndarray, config: FeatureConfig, rng) -> tuple[np.ndarray, np.ndarray]:
    frames, log_energy = _kaldi_frames(audio, config, rng)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    key = ("kaldi", int(config.num_mel_bins), int(config.padded_window), int(config.sample_rate),
           float(config.low_freq), float(config.high_freq))
    return np.log(np.maximum(_apply_filters(key, power).T, _F32_EPS)), log_energy


def fbank(audio: np.ndarray, sample_rate: int = 16000, num_mel_bins: int = 80, *,
          rng: np.random.Generator | None = None, **kwargs) -> np.ndarray:
    """Kaldi-style log mel filter bank: audio float [S] -> float32 [T, num_mel_bins (+1 with use_energy)].

    kwargs: any FeatureConfig field (frame_length_ms, frame_shift_ms, dither, preemph_coeff, window_type,
    low_freq, high_freq, use_energy, energy_floor, ...). Energy, when used, is the first column (as Kaldi).
    """
    cfg = FeatureConfig(kind="fbank", sample_rate=sample_rate, num_mel_bins=num_mel_bins, **kwargs)
    return _fbank(_check_audio(audio), cfg, rng)


def _fbank(audio, cfg, rng):
    logmel, log_energy = _kaldi_log_mel(audio, cfg, rng)
    if cfg.use_energy:
        logmel = np.concatenate([log_energy[:, None], logmel], axis=1)
    return logmel.astype(np.float32)


@functools.lru_cache(maxsize=16)
def _dct_lifter(num_bins: int, num_ceps: int, lifter: float) -> np.ndarray:
    """Kaldi's orthonormal DCT-II rows 0..num_ceps-1, with the cepstral lifter folded in -> [num_bins, num_ceps]."""
    k = np.arange(num_ceps)[:, None]
    n = np.arange(num_bins)[None, :]
    dct = np.sqrt(2.0 / num_bins) * np.cos(math.pi / num_bins * (n + 0.5) * k)
    dct[0] = math.sqrt(1.0 / num_bins)
    if lifter != 0.0:
        dct *= (1.0 + 0.5 * lifter * np.sin(math.pi * np.arange(num_ceps) / lifter))[:, None]
    out = dct.T.copy()
    out.setflags(write=False)
    return out


def mfcc(audio: np.ndarray, sample_rate: int = 16000, num_ceps: int = 13, num_mel_bins: int = 23, *,
         use_energy: bool = True, cepstral_lifter: float = 22.0, rng: np.random.Generator | None = None,
         **kwargs) -> np.ndarray:
    """Kaldi-style MFCC (`compute-mfcc-feats` defaults): audio [S] -> float32 [T, num_ceps].

    DCT-II (orthonormal) of the log mel energies, liftered; with use_energy, c0 is replaced by the raw log energy.
    """
    cfg = FeatureConfig(kind="mfcc", sample_rate=sample_rate, num_mel_bins=num_mel_bins, num_ceps=num_ceps,
                        use_energy=use_energy, cepstral_lifter=cepstral_lifter, **kwargs)
    return _mfcc(_check_audio(audio), cfg, rng)


def _mfcc(audio, cfg, rng):
    logmel, log_energy = _kaldi_log_mel(audio, cfg, rng)
    ceps = np.einsum("tm,mc->tc", logmel, _dct_lifter(cfg.num_mel_bins, cfg.num_ceps, cfg.cepstral_lifter))
    if cfg.use_energy:
        ceps[:, 0] = log_energy
    return ceps.astype(np.float32)


def whisper_log_mel(audio: np.ndarray, n_mels: int = 80, *, pad_or_trim: bool = True,
                    padding: int = 0) -> np.ndarray:
    """Whisper's log-mel spectrogram: 16 kHz audio [S] -> float32 [n_mels, frames].

    pad_or_trim=True pads with zeros / cuts to 30 s first (3000 frames), as WhisperFeatureExtractor;
    False keeps the length (S // 160 frames), as openai-whisper's `log_mel_spectrogram(audio, padding=padding)`.
    """
    a = _check_audio(audio)
    if padding:
        a = np.pad(a, (0, padding))
    if pad_or_trim:
        a = a[:WHISPER_CHUNK_SAMPLES]
        a = np.pad(a, (0, WHISPER_CHUNK_SAMPLES - a.shape[0]))
    if a.shape[0] <= WHISPER_N_FFT // 2:
        raise ValueError(f"Whisper features need more than {WHISPER_N_FFT // 2} samples, got {a.shape[0]}")
    half = WHISPER_N_FFT // 2
    padded = np.pad(a, (half, half), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, WHISPER_N_FFT)[::WHISPER_HOP]
    frames = frames[: a.shape[0] // WHISPER_HOP]                   # drop the last frame, as Whisper does
    power = np.abs(np.fft.rfft(frames * _whisper_window()[None], axis=1)) ** 2      # [T, 201]
    mel = _apply_filters(("slaney", WHISPER_SAMPLE_RATE, WHISPER_N_FFT, int(n_mels), 0.0,
                          WHISPER_SAMPLE_RATE / 2.0), power)                          # [n_mels, T]
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def log_mel_spectrogram(audio: np.ndarray, sample_rate: int = 22050, *, n_fft: int = 2048, hop_length: int = 512,
                        n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None,
                        top_db: float | None = 80.0) -> np.ndarray:
    """librosa-convention log-mel (dB): audio [S] -> float32 [1 + S // hop_length, n_mels].

    As `librosa.power_to_db(librosa.feature.melspectrogram(y=audio, sr=...))` (zero-padded centred frames,
    periodic Hann window, power 2, Slaney mel filters, 10 log10 with amin 1e-10 and `top_db` range), transposed.
    """
    a = _check_audio(audio)
    half = n_fft // 2
    padded = np.pad(a, (half, half))
    if padded.shape[0] < n_fft:
        padded = np.pad(padded, (0, n_fft - padded.shape[0]))
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length]
    frames = frames[: 1 + a.shape[0] // hop_length]
    window = 0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(n_fft) / n_fft)
    power = np.abs(np.fft.rfft(frames * window[None], axis=1)) ** 2
    mel = _apply_filters(("slaney", int(sample_rate), int(n_fft), int(n_mels), float(fmin),
                          float(sample_rate / 2.0 if fmax is None else fmax)), power).T
    db = 10.0 * np.log10(np.maximum(mel, 1e-10))
    if top_db is not None:
        db = np.maximum(db, db.max() - top_db)
    return db.astype(np.float32)


def librosa_mfcc(audio: np.ndarray, sample_rate: int = 22050, n_mfcc: int = 20, **kwargs) -> np.ndarray:
    """librosa-convention MFCC: orthonormal DCT-II of `log_mel_spectrogram` -> float32 [frames, n_mfcc].

    Equal to `librosa.feature.mfcc(y=audio, sr=sample_rate, n_mfcc=n_mfcc, ...)` transposed; kwargs as for
    log_mel_spectrogram.
    """
    db = log_mel_spectrogram(audio, sample_rate, **kwargs).astype(np.float64)
    m = db.shape[1]
    if n_mfcc > m:
        raise ValueError(f"n_mfcc={n_mfcc} > n_mels={m}")
    k = np.arange(n_mfcc)[None, :]
    n = np.arange(m)[:, None]
    dct = np.sqrt(2.0 / m) * np.cos(math.pi / m * (n + 0.5) * k)
    dct[:, 0] = math.sqrt(1.0 / m)
    return np.einsum("tm,mc->tc", db, dct).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Normalisation (the statistics themselves: jasr.cmvn).

def time_major(x: np.ndarray, config: FeatureConfig) -> np.ndarray:
    """Features as [T, F] (Whisper's [n_mels, T] transposed; others unchanged). Its own inverse."""
    return x.T if config.kind == "whisper" else x


def compute_features(audio: np.ndarray, config: FeatureConfig, *, cmvn: CmvnStats | None = None,
                     rng: np.random.Generator | None = None) -> np.ndarray:
    """Dispatcher: audio [S] at config.sample_rate -> float32 [T, F] (Whisper: [n_mels, T]), normalised as configured.

    With normalize="global", `cmvn` (or, if None, the stats file config.cmvn_path) gives the statistics.
    """
    a = _check_audio(audio)
    if config.normalize == "level":
        a = a * level_gain(np.dot(a, a), a.shape[0])
    if config.kind == "fbank":
        x = _fbank(a, config, rng)
    elif config.kind == "mfcc":
        x = _mfcc(a, config, rng)
    else:
        x = whisper_log_mel(a, config.num_mel_bins, pad_or_trim=config.whisper_pad_or_trim)
    if config.normalize in ("none", "level"):
        return x
    x2 = time_major(x, config)
    if config.normalize == "utterance":
        y = utterance_cmvn(x2, variance=config.normalize_variance)
    else:
        if cmvn is None:
            if not config.cmvn_path:
                raise ValueError("normalize='global' needs CMVN stats: pass cmvn= or set FeatureConfig.cmvn_path")
            cmvn = CmvnStats.load(config.cmvn_path)
        y = apply_cmvn(x2, cmvn, variance=config.normalize_variance)
    return time_major(y, config)


# ----------------------------------------------------------------------------------------------------------------
# jnp (device) features: same numbers as the numpy path, usable inside jit.

def _lengths_from_paddings(audio, audio_paddings):
    if audio_paddings is None:
        return jnp.full(audio.shape[:1], audio.shape[1], jnp.int32)
    return jnp.sum(1.0 - audio_paddings.astype(jnp.float32), axis=1).astype(jnp.int32)


def fbank_jax(audio, audio_paddings=None, config: FeatureConfig = FeatureConfig()):
    """Kaldi fbank (or MFCC if config.kind == "mfcc") in jnp, no dither.

    audio [B, S] float, audio_paddings [B, S] (1.0 = padded, valid samples first) ->
    (features [B, T, F] float32, paddings [B, T]) with T = num_frames(S, config); frames that reach into
    padding are marked padded (and zeroed). Equal to `compute_features` per row (normalize="none").
    """
    if config.kind not in ("fbank", "mfcc"):
        raise ValueError(f"fbank_jax computes kind 'fbank' or 'mfcc', got {config.kind!r}")
    if config.dither != 0.0:
        raise ValueError("fbank_jax has no dither (pass dither=0.0)")
    audio = jnp.asarray(audio, jnp.float32)
    if audio.ndim != 2:
        raise ValueError(f"audio must be [batch, samples], got shape {audio.shape}")
    win, shift = config.window_length, config.window_shift
    b, s = audio.shape
    t = num_frames(s, config)
    lengths = _lengths_from_paddings(audio, audio_paddings)
    if config.snip_edges:
        idx = np.arange(t)[:, None] * shift + np.arange(win)[None, :]
        frames = audio[:, idx]                                              # [B, T, win]
    else:   # reflect at each row's own end
        raw = (np.arange(t)[:, None] * shift + shift // 2 - win // 2 + np.arange(win)[None, :])
        idx = _reflect(jnp.asarray(raw)[None], lengths[:, None, None])      # [B, T, win]
        frames = jnp.take_along_axis(audio[:, None, :], jnp.clip(idx, 0, s - 1).reshape(b, 1, -1),
                                     axis=2).reshape(b, t, win)
    if config.remove_dc_offset:
        frames = frames - frames.mean(axis=-1, keepdims=True)
    log_energy = jnp.log(jnp.maximum(jnp.sum(frames * frames, axis=-1), _F32_EPS))
    if config.energy_floor > 0.0:
        log_energy = jnp.maximum(log_energy, math.log(config.energy_floor))
    if config.preemph_coeff != 0.0:
        prev = jnp.concatenate([frames[..., :1], frames[..., :-1]], axis=-1)
        frames = frames - config.preemph_coeff * prev
    frames = frames * jnp.asarray(feature_window(config.window_type, win), jnp.float32)
    spec = jnp.fft.rfft(frames, n=config.padded_window, axis=-1)
    power = jnp.real(spec) ** 2 + jnp.imag(spec) ** 2
    banks = jnp.asarray(kaldi_mel_banks(config.num_mel_bins, config.padded_window, config.sample_rate,
                                        config.low_freq, config.high_freq), jnp.float32)
    logmel = jnp.log(jnp.maximum(jnp.einsum("btk,km->btm", power, banks,
                                            precision="highest"), _F32_EPS))
    if config.kind == "mfcc":
        feats = jnp.einsum("btm,mc->btc", logmel,
                           jnp.asarray(_dct_lifter(config.num_mel_bins, config.num_ceps, config.cepstral_lifter),
                                       jnp.float32), precision="highest")
        if config.use_energy:
            feats = feats.at[..., 0].set(log_energy)
    elif config.use_energy:
        feats = jnp.concatenate([log_energy[..., None], logmel], axis=-1)
    else:
        feats = logmel
    if config.snip_edges:
        n_valid = jnp.where(lengths >= win, 1 + (lengths - win) // shift, 0)
    else:
        n_valid = (lengths + shift // 2) // shift
    paddings = (jnp.arange(t)[None, :] >= n_valid[:, None]).astype(jnp.float32)
    return feats * (1.0 - paddings)[..., None], paddings


def whisper_log_mel_jax(audio, n_mels: int = 80, *, pad_or_trim: bool = True):
    """Whisper log-mel in jnp: audio [..., S] -> float32 [..., n_mels, T]; same semantics as `whisper_log_mel`.

    Each row is normalised on its own (dynamic-range clamp over the row), as the feature extractor does per item.
    """
    a = jnp.asarray(audio, jnp.float32)
    if pad_or_trim:
        s = a.shape[-1]
        a = a[..., :WHISPER_CHUNK_SAMPLES] if s >= WHISPER_CHUNK_SAMPLES else jnp.pad(
            a, [(0, 0)] * (a.ndim - 1) + [(0, WHISPER_CHUNK_SAMPLES - s)])
    s = a.shape[-1]
    half = WHISPER_N_FFT // 2
    padded = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(half, half)], mode="reflect")
    t = s // WHISPER_HOP
    idx = np.arange(t)[:, None] * WHISPER_HOP + np.arange(WHISPER_N_FFT)[None, :]
    frames = padded[..., idx] * jnp.asarray(_whisper_window(), jnp.float32)
    spec = jnp.fft.rfft(frames, axis=-1)
    power = jnp.real(spec) ** 2 + jnp.imag(spec) ** 2                      # [..., T, 201]
    filt = jnp.asarray(slaney_mel_filters(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, n_mels), jnp.float32)
    mel = jnp.einsum("mk,...tk->...mt", filt, power, precision="highest")
    log_spec = jnp.log10(jnp.maximum(mel, 1e-10))
    log_spec = jnp.maximum(log_spec, jnp.max(log_spec, axis=(-2, -1), keepdims=True) - 8.0)
    return (log_spec + 4.0) / 4.0


def compute_features_jax(audio, audio_paddings, config: FeatureConfig, *, cmvn: CmvnStats | None = None):
    """On-device features for a batch: audio [B, S], paddings [B, S] -> (features [B, T, F], paddings [B, T]).

    Whisper features come out as [B, T, n_mels] here (time-major like the others). Normalisation as configured;
    per-utterance CMVN uses only the valid frames, the level only the valid samples.
    """
    if config.normalize == "level":
        audio = jnp.asarray(audio, jnp.float32)
        valid = jnp.ones_like(audio) if audio_paddings is None else 1.0 - jnp.asarray(audio_paddings, jnp.float32)
        count = jnp.maximum(valid.sum(1, keepdims=True), 1.0)
        mean_square = jnp.sum(audio * audio * valid, axis=1, keepdims=True) / count
        gain = LEVEL_RMS / jnp.sqrt(jnp.maximum(mean_square, 1e-30))     # level_gain (silence: 1)
        audio = audio * jnp.where(mean_square > 0.0, gain, 1.0)
    if config.kind == "whisper":
        feats = jnp.swapaxes(whisper_log_mel_jax(audio, config.num_mel_bins, pad_or_trim=config.whisper_pad_or_trim),
                             -1, -2)
        lengths = _lengths_from_paddings(jnp.asarray(audio), audio_paddings)
        n_valid = (jnp.full_like(lengths, feats.shape[1]) if config.whisper_pad_or_trim
                   else lengths // WHISPER_HOP)
        paddings = (jnp.arange(feats.shape[1])[None, :] >= n_valid[:, None]).astype(jnp.float32)
    else:
        feats, paddings = fbank_jax(audio, audio_paddings, config)
    if config.normalize == "utterance":
        valid = (1.0 - paddings)[..., None]
        n = jnp.maximum(valid.sum(axis=1, keepdims=True), 1.0)
        mean = (feats * valid).sum(axis=1, keepdims=True) / n
        feats = feats - mean
        if config.normalize_variance:
            std = jnp.sqrt((feats * feats * valid).sum(axis=1, keepdims=True) / n)
            feats = feats / jnp.maximum(std, 1e-5)
    elif config.normalize == "global":
        if cmvn is None:
            if not config.cmvn_path:
                raise ValueError("normalize='global' needs CMVN stats: pass cmvn= or set FeatureConfig.cmvn_path")
            cmvn = CmvnStats.load(config.cmvn_path)
        feats = feats - jnp.asarray(cmvn.mean, jnp.float32)
        if config.normalize_variance:
            feats = feats / jnp.asarray(cmvn.std, jnp.float32)
    return feats * (1.0 - paddings)[..., None], paddings
