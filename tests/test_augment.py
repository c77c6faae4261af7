"""SpecAugment (jax) and waveform perturbations (numpy) on real speech."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings, strategies as st

from jasr.audio import load_audio
from jasr.augment import (AudioAugment, add_noise, spec_augment, speed_perturb, time_warp, volume_perturb, vtlp,
                          vtlp_warp)
from jasr.features import fbank

DATA = "/work/shared/data"
with open(os.path.join(DATA, "fsdd", "manifest.jsonl")) as _f:
    FSDD = [os.path.join(DATA, "fsdd", json.loads(line)["audio"]) for line in _f][:40:10]
LIBRI = os.path.join(DATA, "librivox_sense_sensibility", "wavs", "sense_and_sensibility_01_austen_64kb-0880.wav")

B, T, F = 4, 120, 40


@pytest.fixture(scope="module")
def batch():
    """Real fbank features of 4 digits, padded to T frames; lengths differ."""
    feats = np.zeros((B, T, F), np.float32)
    pads = np.ones((B, T), np.float32)
    for i, p in enumerate(FSDD):
        x = fbank(load_audio(p), 16000, F)[:T - 10 * i]
        feats[i, :x.shape[0]] = x
        pads[i, :x.shape[0]] = 0.0
    return feats, pads


_spec = jax.jit(spec_augment, static_argnames=("num_freq_masks", "max_freq_width", "num_time_masks",
                                               "max_time_width", "max_time_ratio", "max_time_warp"))


def test_no_masks_is_identity(batch):
    feats, pads = batch
    out = _spec(jax.random.key(0), feats, pads, num_freq_masks=0, num_time_masks=0)
    np.testing.assert_array_equal(np.asarray(out), feats)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), lengths=st.lists(st.integers(0, T), min_size=B, max_size=B))
def test_masks_are_bands_inside_valid_frames(batch, seed, lengths):
    feats = batch[0] + 100.0            # no real value is 0 after the shift: masked cells are exactly 0
    pads = (np.arange(T)[None, :] >= np.asarray(lengths)[:, None]).astype(np.float32)
    out = np.asarray(_spec(jax.random.key(seed), feats, pads, num_freq_masks=2, max_freq_width=8,
                           num_time_masks=3, max_time_width=10, max_time_ratio=0.2))
    masked = out == 0.0
    for i, n in enumerate(lengths):
        assert not masked[i, n:].any()                                  # padding untouched
        np.testing.assert_array_equal(out[i, n:], feats[i, n:])
        np.testing.assert_array_equal(out[i][~masked[i]], feats[i][~masked[i]])
        if n == 0:
            continue
        full_cols = masked[i, :n].all(axis=0)                           # frequency bands
        full_rows = masked[i, :n].all(axis=1)                           # time spans
        # every masked cell is explained by a full band or a full span
        assert np.all(masked[i, :n] == (full_cols[None, :] | full_rows[:, None]))
        assert full_cols.sum() <= 2 * 8 or full_rows.all()
        assert full_rows.sum() <= 3 * min(10, int(0.2 * n)) or full_cols.all()


def test_keys_and_determinism(batch):
    feats, pads = batch
    a = np.asarray(_spec(jax.random.key(1), feats, pads))
    b = np.asarray(_spec(jax.random.key(1), feats, pads))
    c = np.asarray(_spec(jax.random.key(2), feats, pads))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a == 0).any()


def test_time_warp_is_monotone_resampling(batch):
    _, pads = batch
    ramp = np.broadcast_to(np.arange(T, dtype=np.float32)[None, :, None], (B, T, 3)).copy()
    for seed in range(5):
        out = np.asarray(jax.jit(time_warp, static_argnums=3)(jax.random.key(seed), ramp, pads, 5))
        for i in range(B):
            n = int((1 - pads[i]).sum())
            w = out[i, :n, 0]
            assert w[0] == 0.0 and np.all(np.diff(w) >= -1e-5) and w.max() <= n - 1 + 1e-5
            np.testing.assert_array_equal(out[i, n:], ramp[i, n:])
            assert np.abs(w - np.arange(n)).max() <= 5 + 1e-4             # no frame moves more than W
    out = np.asarray(_spec(jax.random.key(3), batch[0], pads, num_freq_masks=0, num_time_masks=0,
                           max_time_warp=5))
    assert out.shape == batch[0].shape and not np.array_equal(out, batch[0])


def test_speed_perturb_changes_length_and_pitch():
    x = load_audio(LIBRI)
    for factor in (0.9, 1.1):
        y = speed_perturb(x, 16000, factor)
        assert abs(y.shape[0] - x.shape[0] / factor) <= 2
        # the spectrum is stretched by the factor: P_y(f) ~ P_x(f / factor) fits far better than P_x(f)
        f, px = scipy.signal.welch(x, 16000, nperseg=1024)
        _, py = scipy.signal.welch(y, 16000, nperseg=1024)
        band = (f > 150) & (f < 6000)
        ly = np.log(py[band])
        stretched = np.log(np.interp(f[band] / factor, f, px))
        fit_stretched = np.mean(np.abs(ly - stretched - np.mean(ly - stretched)))
        fit_same = np.mean(np.abs(ly - np.log(px[band]) - np.mean(ly - np.log(px[band]))))
        assert fit_stretched < 0.4 * fit_same, (fit_stretched, fit_same)
        back = speed_perturb(y, 16000, 1.0 / factor)
        n = min(back.shape[0], x.shape[0])
        assert np.corrcoef(back[:n], x[:n])[0, 1] > 0.99
    np.testing.assert_array_equal(speed_perturb(x, 16000, 1.0), x)


def test_volume_and_noise():
    x = load_audio(FSDD[0])
    np.testing.assert_allclose(volume_perturb(x, 6.0), x * 10 ** 0.3, rtol=1e-6)
    noise = load_audio(FSDD[2])[:1000]                                 # shorter than x: tiled
    for snr in (0.0, 10.0, 25.0):
        y = add_noise(x, noise, snr, np.random.default_rng(0))
        d = y.astype(np.float64) - x
        got = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(d ** 2))
        assert abs(got - snr) < 1e-3
    a = add_noise(x, load_audio(LIBRI), 5.0, np.random.default_rng(1))
    b = add_noise(x, load_audio(LIBRI), 5.0, np.random.default_rng(2))
    assert not np.array_equal(a, b)                                    # random crop of the noise


def test_audio_augment_is_seeded():
    x = load_audio(FSDD[1])
    aug = AudioAugment(speeds=(0.9, 1.0, 1.1), gain_db=(-6, 6), noise_snr_db=(10, 20), noise_files=(LIBRI,))
    a = aug(x, 16000, np.random.default_rng(7))
    np.testing.assert_array_equal(a, aug(x, 16000, np.random.default_rng(7)))
    outs = {aug(x, 16000, np.random.default_rng(s)).shape[0] for s in range(12)}
    assert len(outs) >= 2 and aug.min_speed == 0.9 and aug.max_speed == 1.1
    white = AudioAugment(noise_snr_db=(5, 5))(x, 16000, np.random.default_rng(0))
    assert white.shape == x.shape and not np.array_equal(white, x)
    with pytest.raises(ValueError, match="speeds"):
        AudioAugment(speeds=(0.0,))
    with pytest.raises(ValueError, match=r"\[B, T, F\]"):
        spec_augment(jax.random.key(0), jnp.zeros((3, 4)), jnp.zeros((3,)))


def test_vtlp_warp_hand_values():
    # alpha 1.1 at 8 kHz: boundary 0.8 * 4000 = 3200 Hz, b = 3200 / 1.1; above b a line to (4000, 4000)
    b = 3200 / 1.1
    f = np.array([0.0, 1000.0, b, (b + 4000) / 2, 4000.0])
    np.testing.assert_allclose(vtlp_warp(f, 1.1, 8000), [0.0, 1100.0, 3200.0, 3600.0, 4000.0], rtol=1e-9)
    np.testing.assert_allclose(vtlp_warp(np.array([1000.0, 3200.0, 3600.0, 4000.0]), 0.9, 8000),
                               [900.0, 2880.0, 2880 + (4000 - 2880) / 2, 4000.0], rtol=1e-9)
    grid = np.linspace(0, 4000, 101)
    assert np.all(np.diff(vtlp_warp(grid, 0.85, 8000)) > 0) and np.all(np.diff(vtlp_warp(grid, 1.15, 8000)) > 0)
    with pytest.raises(ValueError, match="alpha"):
        vtlp_warp(grid, 0.0, 8000)


def test_vtlp_moves_partials_and_keeps_length():
    sr = 8000
    t = np.arange(6000) / sr
    x = (np.sin(2 * np.pi * 700 * t) + 0.5 * np.sin(2 * np.pi * 1500 * t)).astype(np.float32)
    np.testing.assert_array_equal(vtlp(x, sr, 1.0), x)
    for alpha in (0.9, 1.1):
        y = vtlp(x, sr, alpha)
        assert y.shape == x.shape and y.dtype == np.float32
        assert abs(np.mean(y.astype(np.float64) ** 2) / np.mean(x.astype(np.float64) ** 2) - 1) < 1e-4
        f, p = scipy.signal.welch(y, sr, nperseg=1024)
        low, high = f < 1100, f >= 1100
        peaks = [f[low][np.argmax(p[low])], f[high][np.argmax(p[high])]]
        np.testing.assert_allclose(peaks, [700 * alpha, 1500 * alpha], atol=sr / 1024)
        assert p[np.argmin(np.abs(f - 1500))] < 1e-2 * p[np.argmin(np.abs(f - 1500 * alpha))]   # moved, not copied
    # speech: the power spectrum is warped, P_y(f) ~ P_x(w^-1(f)), far better than P_x(f)
    x = load_audio(FSDD[1], sr)
    for alpha in (0.9, 1.1):
        y = vtlp(x, sr, alpha)
        f, px = scipy.signal.welch(x, sr, nperseg=256)
        _, py = scipy.signal.welch(y, sr, nperseg=256)
        band = (f > 100) & (f < 3000)
        ly = np.log(py[band])

        def fit(a):      # mean |log P_y(f) - log P_x(w_a^-1(f))| up to a constant gain
            d = ly - np.log(np.interp(np.interp(f[band], vtlp_warp(f, a, sr), f), f, px))
            return np.mean(np.abs(d - np.mean(d)))
        assert fit(alpha) < 0.75 * fit(1.0) and fit(alpha) < 0.75 * fit(1 / alpha), (fit(alpha), fit(1.0))


def test_audio_augment_vtlp():
    x = load_audio(FSDD[1], 8000)
    aug = AudioAugment(vtlp=(0.9, 1.1))
    a = aug(x, 8000, np.random.default_rng(3))
    assert a.shape == x.shape and not np.array_equal(a, x)
    np.testing.assert_array_equal(a, aug(x, 8000, np.random.default_rng(3)))
    for bad in ((1.1, 0.9), (0.0, 1.0), (0.9,)):
        with pytest.raises(ValueError, match="vtlp"):
            AudioAugment(vtlp=bad)
    with pytest.raises(ValueError, match="mono"):
        vtlp(np.zeros((2, 100), np.float32), 8000, 1.1)


def test_random_eq_shapes_the_spectrum_within_bounds():
    """random_eq: the ratio of output to input spectrum is the drawn gain curve (within +-max_db), the mean
    power is kept, and max_db=0 returns the input."""
    from jasr.augment import eq_curve_db, random_eq
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4000).astype(np.float32)
    np.testing.assert_array_equal(random_eq(x, 0.0, rng), x)
    y = random_eq(x, 12.0, np.random.default_rng(5))
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(np.mean(y.astype(np.float64) ** 2), np.mean(x.astype(np.float64) ** 2), rtol=1e-4)
    gain_db = 20 * np.log10(np.abs(np.fft.rfft(y)) / np.abs(np.fft.rfft(x)))
    curve = eq_curve_db(np.random.default_rng(5).uniform(-1.0, 1.0, 3), gain_db.shape[0], 12.0)
    offset = np.median(gain_db - curve)          # the power renormalisation: one constant gain
    np.testing.assert_allclose(gain_db - offset, curve, atol=1e-3)
    assert np.abs(curve).max() <= 12.0 + 1e-9 and np.ptp(curve) > 3.0
    # hand values: a pure tilt (k = 1) of +-6 dB is +6 dB at 0 Hz, 0 dB at half Nyquist, -6 dB at Nyquist
    np.testing.assert_allclose(eq_curve_db(np.array([1.0]), 5, 6.0), [6.0, 6.0 * np.cos(np.pi / 4), 0.0,
                                                                       -6.0 * np.cos(np.pi / 4), -6.0], atol=1e-12)
    with pytest.raises(ValueError, match="max_db must be >= 0"):
        random_eq(x, -1.0, rng)
    aug = AudioAugment(eq_db=12.0)
    assert aug(x, 8000, np.random.default_rng(1)).shape == x.shape
    with pytest.raises(ValueError, match="eq_db must be >= 0"):
        AudioAugment(eq_db=-1.0)


def test_time_varying_random_eq_follows_its_curves():
    """random_eq with points > 1 on stationary noise: the gain over the first and the last 2048 samples is the
    first and the last drawn curve (up to the one power renormalisation), they differ, the mean power is kept,
    signals too short for the STFT get one curve, and AudioAugment passes eq_points on."""
    from jasr.augment import eq_curve_db, random_eq
    x = np.random.default_rng(0).standard_normal(80000).astype(np.float32)
    y = random_eq(x, 10.0, np.random.default_rng(3), points=3)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(np.mean(y.astype(np.float64) ** 2), np.mean(x.astype(np.float64) ** 2), rtol=1e-4)
    draw = np.random.default_rng(3)
    curves = [eq_curve_db(draw.uniform(-1.0, 1.0, 3), 129, 10.0) for _ in range(3)]   # 256-point STFT bins

    def power(sig, part):   # mean periodogram of 256-sample Hann frames of one part of the signal
        seg = sig[part].astype(np.float64).reshape(-1, 256) * np.hanning(256)
        return np.mean(np.abs(np.fft.rfft(seg, axis=1)) ** 2, axis=0)
    for part, curve in ((slice(0, 2048), curves[0]), (slice(-2048, None), curves[2])):
        gain = 10 * np.log10(power(y, part) / power(x, part))
        offset = np.median(gain - curve)          # the power renormalisation: one constant gain
        np.testing.assert_allclose(gain[2:-2] - offset, curve[2:-2], atol=1.0)
    assert np.abs(curves[0] - curves[2]).max() > 3.0
    np.testing.assert_array_equal(random_eq(x[:1000], 10.0, np.random.default_rng(3), points=1),
                                  random_eq(x[:1000], 10.0, np.random.default_rng(3)))
    for n in (2, 3, 255):   # one curve below 256 samples
        np.testing.assert_array_equal(random_eq(x[:n], 10.0, np.random.default_rng(3), points=3),
                                      random_eq(x[:n], 10.0, np.random.default_rng(3)))
    assert random_eq(x[:256], 10.0, np.random.default_rng(3), points=3).shape == (256,)
    with pytest.raises(ValueError, match="points must be >= 1"):
        random_eq(x, 10.0, np.random.default_rng(0), points=0)
    with pytest.raises(ValueError, match="eq_points must be >= 1"):
        AudioAugment(eq_db=10.0, eq_points=0)
    aug = AudioAugment(eq_db=10.0, eq_points=3)
    assert aug(x[:3000], 8000, np.random.default_rng(1)).shape == (3000,)
