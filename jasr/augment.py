"""Data augmentation: SpecAugment in jax (explicit PRNG key, respects paddings) and host-side waveform
perturbations in numpy (speed, volume, additive noise, vocal tract length perturbation) with an explicit
np.random.Generator.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.signal
import soxr

from jasr.audio import load_audio

__all__ = ["spec_augment", "time_warp", "speed_perturb", "volume_perturb", "add_noise", "vtlp_warp", "vtlp",
           "eq_curve_db", "random_eq", "AudioAugment"]


# ----------------------------------------------------------------------------------------------------------------
# SpecAugment (device, jax).

def _valid_lengths(paddings):
    return jnp.sum(1.0 - paddings.astype(jnp.float32), axis=1).astype(jnp.int32)


def _masks_1d(key, size, limit, num_masks, max_width):
    """[num_masks] random intervals [start, start + w) inside [0, limit), w ~ U{0..max_width} -> mask [size] bool."""
    k_w, k_s = jax.random.split(key)
    max_w = jnp.minimum(jnp.asarray(max_width, jnp.int32), limit)
    widths = jax.random.randint(k_w, (num_masks,), 0, max_w + 1)
    starts = (jax.random.uniform(k_s, (num_masks,)) * (limit - widths + 1).astype(jnp.float32)).astype(jnp.int32)
    pos = jnp.arange(size)[None, :]
    return jnp.any((pos >= starts[:, None]) & (pos < (starts + widths)[:, None]), axis=0)


def time_warp(key, features, paddings, max_warp: int):
    """SpecAugment time warp: features [B, T, F], paddings [B, T] -> [B, T, F].

    Per example, a centre c in [W, L - W) (L = valid length) moves by w ~ U[-W, W]; valid frames are resampled
    piecewise-linearly (linear interpolation in time); padded frames are untouched. Examples with L <= 2W + 1 stay.
    """
    b, t, _ = features.shape
    lengths = _valid_lengths(paddings)

    def one(k, x, length):
        k_c, k_w = jax.random.split(k)
        lf = length.astype(jnp.float32)
        ok = length > 2 * max_warp + 1
        c = jax.random.randint(k_c, (), max_warp, jnp.maximum(length - max_warp, max_warp + 1)).astype(jnp.float32)
        w = jax.random.randint(k_w, (), -max_warp, max_warp + 1).astype(jnp.float32)
        tt = jnp.arange(t, dtype=jnp.float32)
        new_c = c + w
        src = jnp.where(tt < new_c, tt * c / jnp.maximum(new_c, 1.0),
                        c + (tt - new_c) * (lf - c) / jnp.maximum(lf - new_c, 1.0))
        src = jnp.clip(src, 0.0, jnp.maximum(lf - 1.0, 0.0))
        lo = jnp.floor(src).astype(jnp.int32)
        hi = jnp.minimum(lo + 1, jnp.maximum(length - 1, 0))
        frac = (src - lo)[:, None]
        warped = x[lo] * (1.0 - frac) + x[hi] * frac
        keep = (~ok) | (tt >= lf)
        return jnp.where(keep[:, None], x, warped)

    return jax.vmap(one)(jax.random.split(key, b), features, lengths)


def spec_augment(key, features, paddings, *, num_freq_masks: int = 2, max_freq_width: int = 27,
                 num_time_masks: int = 2, max_time_width: int = 40, max_time_ratio: float = 0.05,
                 max_time_warp: int = 0, mask_value: float = 0.0):
    """SpecAugment (Park et al. 2019): features [B, T, F], paddings [B, T] (1.0 = padded) -> features [B, T, F].

    Frequency masks: `num_freq_masks` bands of width U{0..max_freq_width}. Time masks: `num_time_masks` spans of
    width U{0..min(max_time_width, max_time_ratio * L)} placed inside each example's valid length L, so padding
    never absorbs a mask. Optional time warp (max_time_warp > 0) first. Masked cells get `mask_value`; padded
    frames are left as they were. Pure function of `key`; jit-able.
    """
    features = jnp.asarray(features)
    paddings = jnp.asarray(paddings)
    if features.ndim != 3 or paddings.shape != features.shape[:2]:
        raise ValueError(f"spec_augment needs features [B, T, F] and paddings [B, T], got {features.shape} "
                         f"and {paddings.shape}")
    b, t, f = features.shape
    k_warp, k_f, k_t = jax.random.split(key, 3)
    if max_time_warp > 0:
        features = time_warp(k_warp, features, paddings, max_time_warp)
    lengths = _valid_lengths(paddings)
    fmask = jax.vmap(lambda k: _masks_1d(k, f, jnp.int32(f), num_freq_masks, max_freq_width))(
        jax.random.split(k_f, b)) if num_freq_masks > 0 else jnp.zeros((b, f), bool)

    def tmask_one(k, length):
        width = jnp.minimum(max_time_width, jnp.floor(max_time_ratio * length.astype(jnp.float32)).astype(jnp.int32))
        return _masks_1d(k, t, length, num_time_masks, width)

    tmask = jax.vmap(tmask_one)(jax.random.split(k_t, b), lengths) if num_time_masks > 0 else jnp.zeros((b, t), bool)
    valid = paddings < 0.5
    mask = (fmask[:, None, :] | tmask[:, :, None]) & valid[:, :, None]
    return jnp.where(mask, jnp.asarray(mask_value, features.dtype), features)


# ----------------------------------------------------------------------------------------------------------------
# Waveform perturbations (host, numpy).

def speed_perturb(audio: np.ndarray, sample_rate: int, factor: float) -> np.ndarray:
    """Kaldi/sox-style speed change (tempo and pitch): [n] -> float32 [~n / factor].

    The signal is treated as if recorded at sample_rate * factor and resampled (soxr) to sample_rate.
    """
    if factor <= 0:
        raise ValueError(f"speed factor must be positive, got {factor}")
    audio = np.asarray(audio, np.float32)
    if factor == 1.0:
        return audio
    return soxr.resample(audio, sample_rate * factor, sample_rate, quality="HQ").astype(np.float32, copy=False)


def volume_perturb(audio: np.ndarray, gain_db: float) -> np.ndarray:
    """Scales by 10^(gain_db / 20): [n] -> float32 [n]."""
    return (np.asarray(audio, np.float32) * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)


def add_noise(audio: np.ndarray, noise: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """Adds `noise` (random crop, tiled if shorter) scaled to the given SNR (mean power ratio): [n] -> float32 [n]."""
    audio = np.asarray(audio, np.float64)
    noise = np.asarray(noise, np.float64)
    n = audio.shape[0]
    if noise.ndim != 1 or noise.shape[0] == 0:
        raise ValueError(f"noise must be a non-empty [m] array, got shape {noise.shape}")
    if noise.shape[0] < n:
        noise = np.tile(noise, -(-n // noise.shape[0]))
    start = int(rng.integers(0, noise.shape[0] - n + 1))
    noise = noise[start:start + n]
    p_sig, p_noise = np.mean(audio ** 2), np.mean(noise ** 2)
    if p_noise <= 0.0 or p_sig <= 0.0:
        return audio.astype(np.float32)
    scale = np.sqrt(p_sig / (p_noise * 10.0 ** (snr_db / 10.0)))
    return (audio + scale * noise).astype(np.float32)


def vtlp_warp(freqs: np.ndarray, alpha: float, sample_rate: int, boundary_hz: float | None = None) -> np.ndarray:
    """Piecewise-linear VTLP frequency map (Jaitly & Hinton 2013), Hz -> Hz, [k] -> [k]: ``f -> alpha * f`` up to
    ``b = boundary_hz * min(alpha, 1) / alpha`` (boundary_hz defaults to 0.8 * Nyquist), then the straight line from
    ``(b, alpha * b)`` to ``(nyq, nyq)``: monotone, 0 and Nyquist stay fixed."""
    if alpha <= 0:
        raise ValueError(f"vtlp warp factor alpha must be positive, got {alpha}")
    nyq = sample_rate / 2.0
    f_hi = 0.8 * nyq if boundary_hz is None else float(boundary_hz)
    if not 0.0 < f_hi < nyq:
        raise ValueError(f"vtlp boundary_hz must be in (0, {nyq}), got {boundary_hz}")
    b = f_hi * min(alpha, 1.0) / alpha
    freqs = np.asarray(freqs, np.float64)
    upper = nyq - (nyq - alpha * b) / (nyq - b) * (nyq - freqs)
    return np.where(freqs <= b, alpha * freqs, upper)


def _with_power_of(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y scaled to the mean power of x (unchanged where y is silent)."""
    p_in, p_out = float(np.mean(x ** 2)), float(np.mean(y ** 2))
    return y * np.sqrt(p_in / p_out) if p_out > 0.0 else y


def _stft(x: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """Hann-window short-time Fourier transform of [n] float64: complex [n_fft // 2 + 1, frames]."""
    return scipy.signal.stft(x, window="hann", nperseg=n_fft, noverlap=n_fft - hop)[2]


def _istft(spec: np.ndarray, n_fft: int, hop: int, n: int) -> np.ndarray:
    """The inverse of :func:`_stft`, zero-padded or cut to n samples: [n] float64."""
    y = scipy.signal.istft(spec, window="hann", nperseg=n_fft, noverlap=n_fft - hop)[1]
    return np.pad(y, (0, max(0, n - y.shape[0])))[:n]


def vtlp(audio: np.ndarray, sample_rate: int, alpha: float, boundary_hz: float | None = None) -> np.ndarray:
    """Vocal tract length perturbation of a waveform: [n] -> float32 [n] (same length and tempo).

    STFT (Hann, ~32 ms window, 75 % overlap); each bin's magnitude moves to its warped frequency
    :func:`vtlp_warp` (split linearly between the two nearest bins) with a phase re-accumulated from its warped
    instantaneous frequency (phase vocoder); inverse STFT. alpha > 1
    moves formants up (a shorter vocal tract), alpha < 1 down; the output has the input's mean power; alpha == 1
    returns the input.
    """
    audio = np.asarray(audio, np.float32)
    if audio.ndim != 1:
        raise ValueError(f"vtlp needs a mono waveform [n], got shape {audio.shape}")
    if alpha <= 0:
        raise ValueError(f"vtlp warp factor alpha must be positive, got {alpha}")
    if alpha == 1.0 or audio.shape[0] == 0:
        return audio
    n_fft = int(2 ** np.ceil(np.log2(0.032 * sample_rate)))
    n = audio.shape[0]
    x = np.pad(audio.astype(np.float64), (0, max(0, n_fft - n)))
    hop = n_fft // 4
    spec = _stft(x, n_fft, hop)
    k = spec.shape[0]
    bin_hz = sample_rate / n_fft
    pos = vtlp_warp(np.arange(k) * bin_hz, alpha, sample_rate, boundary_hz) / bin_hz
    # phase vocoder: each bin's instantaneous frequency (from its phase advance per hop) is warped too, and its
    # phase re-accumulated at the warped frequency, so that a steady partial stays coherent across frames
    phase = np.angle(spec)
    expected = 2.0 * np.pi * hop * np.arange(k)[:, None] / n_fft
    dev = np.diff(phase, axis=1) - expected
    dev = (dev + np.pi) % (2.0 * np.pi) - np.pi
    inst_hz = (expected + dev) * sample_rate / (2.0 * np.pi * hop)
    warped_hz = vtlp_warp(np.clip(inst_hz, 0.0, sample_rate / 2.0), alpha, sample_rate, boundary_hz)
    new_phase = np.concatenate([phase[:, :1], phase[:, :1] + np.cumsum(2.0 * np.pi * hop * warped_hz / sample_rate,
                                                                        axis=1)], axis=1)
    moved = np.abs(spec) * np.exp(1j * new_phase)
    lo = np.clip(np.floor(pos).astype(np.int64), 0, k - 1)
    hi = np.minimum(lo + 1, k - 1)
    frac = (pos - lo)[:, None]
    out = np.zeros_like(spec)
    np.add.at(out, lo, (1.0 - frac) * moved)
    np.add.at(out, hi, frac * moved)
    y = _with_power_of(_istft(out, n_fft, hop, n), x[:n])   # re-phasing loses some power where partials interfere
    return y.astype(np.float32)


def eq_curve_db(coefs: np.ndarray, num_bins: int, max_db: float) -> np.ndarray:
    """A smooth gain curve in dB over `num_bins` frequencies from 0 to Nyquist: max_db * sum_k c_k cos(pi k f)
    / sum_k |c_k| (k = 1..len(coefs), f in [0, 1]), so it stays within +-max_db; k = 1 is a spectral tilt, higher
    k add broad bumps."""
    f = np.linspace(0.0, 1.0, num_bins)
    coefs = np.asarray(coefs, np.float64)
    norm = np.abs(coefs).sum()
    if norm == 0.0:
        return np.zeros(num_bins)
    k = np.arange(1, coefs.shape[0] + 1)
    return max_db * (coefs[:, None] * np.cos(np.pi * k[:, None] * f[None])).sum(0) / norm


def random_eq(audio: np.ndarray, max_db: float, rng: np.random.Generator, bands: int = 3, points: int = 1
              ) -> np.ndarray:
    """Random equalisation of a waveform [n] -> float32 [n], scaled back to the input's mean power, so that only
    the spectral balance changes (microphone, channel and voice-effort variety: a tilt towards or away from the
    high frequencies and broad bumps).

    points=1: one gain curve :func:`eq_curve_db` (`bands` coefficients drawn uniformly in [-1, 1]) applied to the
    spectrum of the whole signal (one FFT). points > 1: a time-varying equalisation: `points` such curves (drawn
    in turn) placed evenly from the first to the last frame of a short-time Fourier transform (256-point Hann
    window, 75 % overlap), their dB gains interpolated linearly between, so that the start and the end of a word
    get independent balances (a burst or a fricative can become brighter or duller than the vowel before it).
    Signals shorter than 256 samples get one curve, as with points=1."""
    audio = np.asarray(audio, np.float32)
    if audio.ndim != 1:
        raise ValueError(f"random_eq needs a mono waveform [n], got shape {audio.shape}")
    if max_db < 0:
        raise ValueError(f"random_eq max_db must be >= 0, got {max_db}")
    if points < 1:
        raise ValueError(f"random_eq points must be >= 1, got {points}")
    n = audio.shape[0]
    if max_db == 0.0 or n < 2:
        return audio
    x = audio.astype(np.float64)
    if points == 1 or n < 256:
        spec = np.fft.rfft(x)
        curve = eq_curve_db(rng.uniform(-1.0, 1.0, bands), spec.shape[0], max_db)
        return _with_power_of(np.fft.irfft(spec * 10.0 ** (curve / 20.0), n), x).astype(np.float32)
    n_fft, hop = 256, 64
    spec = _stft(x, n_fft, hop)                                                               # [bins, frames]
    curves = np.stack([eq_curve_db(rng.uniform(-1.0, 1.0, bands), spec.shape[0], max_db) for _ in range(points)])
    at = np.linspace(0.0, points - 1.0, spec.shape[1])                 # each frame's place between the curves
    lo = np.minimum(at.astype(np.int64), points - 2)
    frac = (at - lo)[None, :]
    gain_db = curves[lo].T * (1.0 - frac) + curves[lo + 1].T * frac                           # [bins, frames]
    return _with_power_of(_istft(spec * 10.0 ** (gain_db / 20.0), n_fft, hop, n), x).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class AudioAugment:
    """Host-side waveform augmentation for the data loader: `aug(audio, sample_rate, rng) -> audio`.

    speeds: factors drawn uniformly per utterance (e.g. (0.9, 1.0, 1.1)). gain_db: (low, high) uniform gain.
    noise_snr_db: (low, high) uniform SNR, applied with probability noise_prob; noise from `noise_files`
    (read with jasr.audio.load_audio) or, when none are given, white Gaussian noise. vtlp: (low, high) uniform
    VTLP warp factor per utterance (:func:`vtlp`), applied after the speed change. eq_db: random equalisation
    within +-eq_db dB (:func:`random_eq`), after VTLP; eq_points > 1: time-varying, with that many curves.
    """
    speeds: Sequence[float] = (1.0,)
    gain_db: tuple[float, float] | None = None
    noise_snr_db: tuple[float, float] | None = None
    noise_prob: float = 1.0
    noise_files: Sequence[str] = ()
    vtlp: tuple[float, float] | None = None
    eq_db: float = 0.0
    eq_points: int = 1

    def __post_init__(self):
        if not self.speeds or any(s <= 0 for s in self.speeds):
            raise ValueError(f"AudioAugment.speeds must be positive factors, got {self.speeds}")
        if self.vtlp is not None and (len(self.vtlp) != 2 or not 0 < self.vtlp[0] <= self.vtlp[1]):
            raise ValueError(f"AudioAugment.vtlp must be (low, high) with 0 < low <= high, got {self.vtlp}")
        if self.eq_db < 0:
            raise ValueError(f"AudioAugment.eq_db must be >= 0, got {self.eq_db}")
        if self.eq_points < 1:
            raise ValueError(f"AudioAugment.eq_points must be >= 1, got {self.eq_points}")

    @property
    def min_speed(self) -> float:
        return float(min(self.speeds))

    @property
    def max_speed(self) -> float:
        return float(max(self.speeds))

    def __call__(self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
        speed = float(self.speeds[int(rng.integers(len(self.speeds)))])
        audio = speed_perturb(audio, sample_rate, speed)
        if self.vtlp is not None:
            audio = vtlp(audio, sample_rate, float(rng.uniform(*self.vtlp)))
        if self.eq_db > 0:
            audio = random_eq(audio, self.eq_db, rng, points=self.eq_points)
        if self.gain_db is not None:
            audio = volume_perturb(audio, float(rng.uniform(*self.gain_db)))
        if self.noise_snr_db is not None and rng.random() < self.noise_prob:
            snr = float(rng.uniform(*self.noise_snr_db))
            if self.noise_files:
                noise = load_audio(self.noise_files[int(rng.integers(len(self.noise_files)))], sample_rate)
            else:
                noise = rng.standard_normal(audio.shape[0])
            audio = add_noise(audio, noise, snr, rng)
        return audio
