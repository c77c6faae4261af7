"""Features against independent references: kaldi-native-fbank (Kaldi fbank/MFCC), transformers'
WhisperFeatureExtractor and openai-whisper (log-mel), librosa (Slaney mel filters); jnp == numpy."""
import dataclasses
import json
import os

import jax
import kaldi_native_fbank as knf
import librosa
import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings
from hypothesis import strategies as st

from jasr.audio import load_audio
from jasr.data import compute_cmvn_stats
from jasr.cmvn import (CmvnStats, accumulate_cmvn, apply_cmvn, equalize_spectrum, long_term_log_spectrum,
                       utterance_cmvn)
from jasr.features import (FeatureConfig, compute_features, compute_features_jax, fbank, fbank_jax, feature_dim,
                           level_gain, librosa_mfcc, log_mel_spectrogram, mfcc, num_frames, slaney_mel_filters,
                           whisper_log_mel, whisper_log_mel_jax)

DATA = "/work/shared/data"


def _rows(name):
    with open(os.path.join(DATA, name, "manifest.jsonl")) as f:
        return [dict(json.loads(line), path=os.path.join(DATA, name, json.loads(line)["audio"])) for line in f]


LIBRI = _rows("librivox_sense_sensibility")
LJ = _rows("ljspeech_sample")
FSDD = _rows("fsdd")


@pytest.fixture(scope="module")
def speech16k():
    return load_audio(LIBRI[1]["path"], 16000)          # 2.99 s, native 16 kHz


@pytest.fixture(scope="module")
def speech_lj():
    return load_audio(LJ[1]["path"], 16000)             # 1.9 s, resampled from 22.05 kHz


def _knf(audio, sr, opts):
    comp = knf.OnlineFbank(opts) if isinstance(opts, knf.FbankOptions) else knf.OnlineMfcc(opts)
    comp.accept_waveform(sr, audio.tolist())
    comp.input_finished()
    return np.stack([comp.get_frame(i) for i in range(comp.num_frames_ready)])


def _fbank_opts(sr, bins, **kw):
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = sr
    o.frame_opts.dither = 0.0
    o.mel_opts.num_bins = bins
    for k, v in kw.items():
        if k in ("window_type", "preemph_coeff", "remove_dc_offset", "frame_shift_ms", "frame_length_ms",
                 "snip_edges"):
            setattr(o.frame_opts, k, v)
        elif k in ("low_freq", "high_freq"):
            setattr(o.mel_opts, k, v)
        else:
            setattr(o, k, v)
    return o


# Kaldi's float32 arithmetic vs our float64: log-energies agree to ~1e-3 absolute (values span ~-16..+10)
@pytest.mark.parametrize("kw", [
    {},
    {"use_energy": True},
    {"window_type": "hamming", "low_freq": 60.0, "high_freq": -400.0},
    {"preemph_coeff": 0.0, "remove_dc_offset": False, "window_type": "hanning"},
    {"snip_edges": False, "use_energy": True},
], ids=["default", "energy", "hamming-band", "no-preemph-hanning", "no-snip-edges"])
def test_fbank_matches_kaldi_native_fbank(speech16k, kw):
    ref = _knf(speech16k, 16000, _fbank_opts(16000, 80, **kw))
    ours = fbank(speech16k, 16000, 80, **kw)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert ours.shape[0] == num_frames(speech16k.shape[0], FeatureConfig(**kw))
    np.testing.assert_allclose(ours, ref, atol=2e-3, rtol=1e-4)


def test_fbank_8khz_40_bins_matches_kaldi():
    x = load_audio(FSDD[3]["path"], sample_rate=None)
    ref = _knf(x, 8000, _fbank_opts(8000, 40))
    np.testing.assert_allclose(fbank(x, 8000, 40), ref, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("kw", [{}, {"num_ceps": 20, "num_mel_bins": 40, "cepstral_lifter": 0.0,
                                     "use_energy": False}])
def test_mfcc_matches_kaldi_native_fbank(speech_lj, kw):
    o = knf.MfccOptions()
    o.frame_opts.dither = 0.0
    o.mel_opts.num_bins = kw.get("num_mel_bins", 23)
    o.num_ceps = kw.get("num_ceps", 13)
    o.cepstral_lifter = kw.get("cepstral_lifter", 22.0)
    o.use_energy = kw.get("use_energy", True)
    ref = _knf(speech_lj, 16000, o)
    ours = mfcc(speech_lj, 16000, **kw)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=5e-3, rtol=1e-4)


@pytest.mark.parametrize("sr,n_fft,n_mels,fmin,fmax", [(16000, 400, 80, 0.0, None), (16000, 400, 128, 0.0, None),
                                                       (22050, 1024, 64, 50.0, 8000.0), (8000, 256, 40, 0.0, None)])
def test_slaney_filters_match_librosa(sr, n_fft, n_mels, fmin, fmax):
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, dtype=np.float64)
    np.testing.assert_allclose(slaney_mel_filters(sr, n_fft, n_mels, fmin, fmax), ref, rtol=1e-9, atol=1e-12)


def test_librosa_convention_log_mel_and_mfcc():
    x = load_audio(LJ[1]["path"], sample_rate=None)                         # 22.05 kHz
    ref = librosa.power_to_db(librosa.feature.melspectrogram(y=x, sr=22050))
    np.testing.assert_allclose(log_mel_spectrogram(x, 22050), ref.T, atol=1e-3, rtol=0)
    ref = librosa.feature.mfcc(y=x, sr=22050, n_mfcc=13)
    np.testing.assert_allclose(librosa_mfcc(x, 22050, 13), ref.T, atol=2e-3, rtol=1e-5)
    y = load_audio(FSDD[5]["path"], sample_rate=None)                       # 8 kHz, other framing
    kw = dict(n_fft=512, hop_length=128, n_mels=40)
    ref = librosa.feature.mfcc(y=y, sr=8000, n_mfcc=20, **kw)
    np.testing.assert_allclose(librosa_mfcc(y, 8000, 20, **kw), ref.T, atol=2e-3, rtol=1e-5)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_whisper_log_mel_matches_transformers(speech16k, speech_lj, n_mels):
    from transformers import WhisperFeatureExtractor
    fe = WhisperFeatureExtractor(feature_size=n_mels)
    for x in (speech16k, speech_lj):
        ref = fe(x, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = whisper_log_mel(x, n_mels)
        assert ours.shape == ref.shape == (n_mels, 3000) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_whisper_log_mel_matches_openai_whisper(speech_lj):
    import torch
    import whisper
    for padding in (0, 16000):
        ref = whisper.log_mel_spectrogram(torch.from_numpy(speech_lj), 80, padding=padding).numpy()
        ours = whisper_log_mel(speech_lj, 80, pad_or_trim=False, padding=padding)
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    long = np.concatenate([speech_lj] * 17)          # 32 s: cut to 30 s
    assert whisper_log_mel(long).shape == (80, 3000)


def test_jax_fbank_and_mfcc_equal_numpy_in_jit(speech16k, speech_lj):
    """A padded batch of two real utterances: valid frames equal the numpy features, the rest are padding."""
    s = speech16k.shape[0]
    audio = np.zeros((2, s), np.float32)
    audio[0] = speech16k
    audio[1, :speech_lj.shape[0]] = speech_lj
    pads = np.ones((2, s), np.float32)
    pads[0] = 0.0
    pads[1, :speech_lj.shape[0]] = 0.0
    for cfg in (FeatureConfig(num_mel_bins=80, use_energy=True),
                FeatureConfig(num_mel_bins=40, snip_edges=False),
                FeatureConfig(kind="mfcc", num_mel_bins=23, num_ceps=13, use_energy=True)):
        feats, fpad = jax.jit(lambda a, p, c=cfg: fbank_jax(a, p, c))(audio, pads)
        feats, fpad = np.asarray(feats), np.asarray(fpad)
        assert feats.shape == (2, num_frames(s, cfg), feature_dim(cfg))
        for r, x in enumerate((speech16k, speech_lj)):
            ref = compute_features(x, cfg)
            n = ref.shape[0]
            np.testing.assert_array_equal(fpad[r], np.arange(feats.shape[1]) >= n)
            np.testing.assert_allclose(feats[r, :n], ref, atol=2e-3, rtol=1e-4)
            assert not feats[r, n:].any()


def test_jax_whisper_equals_numpy(speech16k, speech_lj):
    batch = np.zeros((2, 48000), np.float32)
    batch[0, :speech16k.shape[0]] = speech16k
    batch[1, :speech_lj.shape[0]] = speech_lj
    got = np.asarray(jax.jit(lambda a: whisper_log_mel_jax(a, 80, pad_or_trim=True))(batch))
    for r in range(2):
        np.testing.assert_allclose(got[r], whisper_log_mel(batch[r]), atol=1e-4, rtol=0)


def test_device_normalisation_equals_host(speech16k, speech_lj):
    cfg = FeatureConfig(normalize="utterance", num_mel_bins=40)
    n0 = speech_lj.shape[0]
    audio = np.zeros((1, n0 + 3000), np.float32)
    audio[0, :n0] = speech_lj
    pads = (np.arange(n0 + 3000) >= n0).astype(np.float32)[None]
    feats, fpad = compute_features_jax(audio, pads, cfg)
    ref = compute_features(speech_lj, cfg)
    np.testing.assert_allclose(np.asarray(feats)[0, :ref.shape[0]], ref, atol=2e-3)
    stats = accumulate_cmvn([fbank(speech16k, 16000, 40)])
    gcfg = FeatureConfig(normalize="global", num_mel_bins=40)
    feats, _ = compute_features_jax(audio, pads, gcfg, cmvn=stats)
    np.testing.assert_allclose(np.asarray(feats)[0, :ref.shape[0]],
                               compute_features(speech_lj, gcfg, cmvn=stats), atol=2e-3)


def test_cmvn(tmp_path, speech16k, speech_lj):
    a, b = fbank(speech16k, 16000, 40), fbank(speech_lj, 16000, 40)
    stats = accumulate_cmvn([a, b])
    both = np.concatenate([a, b]).astype(np.float64)
    np.testing.assert_allclose(stats.mean, both.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats.std, both.std(0), rtol=1e-7)
    assert stats.count == both.shape[0]
    p = tmp_path / "cmvn.json"
    stats.save(p)
    again = CmvnStats.load(p)
    np.testing.assert_array_equal(again.mean, stats.mean)
    normed = apply_cmvn(np.concatenate([a, b]), again)
    np.testing.assert_allclose(normed.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(normed.std(0), 1.0, atol=1e-4)
    u = utterance_cmvn(a)
    np.testing.assert_allclose(u.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(u.std(0), 1.0, atol=1e-4)
    # stats from files, and the dispatcher reading them from FeatureConfig.cmvn_path
    cfg = FeatureConfig(num_mel_bins=40, normalize="global", cmvn_path=str(p))
    file_stats = compute_cmvn_stats([LIBRI[1]["path"], LJ[1]["path"]], cfg)
    np.testing.assert_allclose(file_stats.mean, stats.mean, rtol=1e-6)
    manifest = os.path.join(DATA, "librivox_sense_sensibility", "manifest.jsonl")
    from jasr.manifests import read_manifest
    all_feats = [fbank(load_audio(u.audio_path), 16000, 40) for u in read_manifest(manifest)]
    m_stats = compute_cmvn_stats(manifest, cfg)
    np.testing.assert_allclose(m_stats.mean, np.concatenate(all_feats).astype(np.float64).mean(0), rtol=1e-6)
    sub = compute_cmvn_stats(manifest, cfg, max_utterances=2, seed=1)          # a seeded subset of two
    assert sub.count in {a.shape[0] + b.shape[0] for i, a in enumerate(all_feats) for b in all_feats[i + 1:]}
    assert compute_cmvn_stats(manifest, cfg, max_utterances=2, seed=1).count == sub.count
    np.testing.assert_allclose(compute_features(speech16k, cfg), apply_cmvn(a, stats), atol=1e-6)
    with pytest.raises(ValueError, match="CMVN"):
        compute_features(speech16k, FeatureConfig(normalize="global"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        CmvnStats.load(tmp_path / "bad.json")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 4000), kind=st.sampled_from(["fbank", "mfcc", "whisper"]),
       shift=st.sampled_from([10.0, 12.5]), snip=st.booleans())
def test_num_frames_matches_outputs(n, kind, shift, snip):
    cfg = FeatureConfig(kind=kind, frame_shift_ms=shift, num_mel_bins=40 if kind != "whisper" else 80,
                        snip_edges=snip)
    x = np.asarray(np.random.default_rng(n).standard_normal(n) * 0.1, np.float32)
    if kind == "whisper" and n <= 200:
        with pytest.raises(ValueError, match="more than"):
            compute_features(x, cfg)
        return
    try:
        out = compute_features(x, cfg)
    except ValueError as e:       # Kaldi reflects once: only shorter-than-a-window signals may be refused
        assert kind != "whisper" and not snip and n < cfg.window_length and "reflect" in str(e)
        return
    frames = out.shape[1] if kind == "whisper" else out.shape[0]
    assert frames == num_frames(n, cfg)
    assert np.isfinite(out).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"1-D"):
        fbank(np.zeros((2, 400), np.float32))
    with pytest.raises(ValueError, match="floating"):
        fbank(np.zeros(400, np.int16))
    with pytest.raises(ValueError, match="rng"):
        fbank(np.zeros(800, np.float32), dither=1.0)
    with pytest.raises(ValueError, match="kind"):
        FeatureConfig(kind="spectrogram")
    with pytest.raises(ValueError, match="16000"):
        FeatureConfig(kind="whisper", sample_rate=8000)
    d1 = fbank(np.zeros(800, np.float32), dither=1.0, rng=np.random.default_rng(0))
    d2 = fbank(np.zeros(800, np.float32), dither=1.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(d1, d2)


def test_long_term_log_spectrum_of_white_noise_by_hand():
    """Periodogram bins of Gaussian noise are exponential: E[log P] = log(sigma^2 sum w^2) - Euler's gamma."""
    rng = np.random.default_rng(0)
    x = 0.1 * rng.standard_normal(8000 * 20)
    ls = long_term_log_spectrum([x[:80000], x[80000:]], 8000)        # 25 ms frames: 200 samples, n_fft 256
    w = np.hanning(202)[1:-1]
    want = np.log(0.01 * np.sum(w * w)) - np.euler_gamma
    assert ls.shape == (129,)
    assert abs(ls[2:-2].mean() - want) < 0.02                        # DC and Nyquist bins are chi^2 with 1 dof
    np.testing.assert_allclose(ls[2:-2], want, atol=0.15)            # per bin: ~6400 effectively independent frames
    with pytest.raises(ValueError, match="1-D"):
        long_term_log_spectrum([np.zeros((2, 300))], 8000)


def test_equalize_spectrum_flattens_a_coloured_channel():
    """Noise through a strong tilt (scipy lfilter), equalised with its own long-term spectrum to a flat target:
    Welch's PSD (scipy, independent framing) is flat within 1 dB, against a 16 dB tilt before."""
    rng = np.random.default_rng(1)
    coloured = scipy.signal.lfilter([1.0, 0.95], [1.0], rng.standard_normal(8000 * 8))
    chunks = np.split(coloured, 16)                                   # a "speaker": 16 recordings of 0.5 s
    ls = long_term_log_spectrum(chunks, 8000)
    out = np.concatenate([equalize_spectrum(c, ls, target=0.0) for c in chunks])
    assert out.dtype == np.float32 and out.shape == coloured.shape
    f, before = scipy.signal.welch(coloured, 8000, nperseg=256)
    _, after = scipy.signal.welch(out.astype(np.float64), 8000, nperseg=256)
    band = (f > 200) & (f < 3600)
    db = lambda p: 10 * np.log10(p[band])                              # noqa: E731
    assert np.ptp(db(before)) > 12 and np.ptp(db(after)) < 1.0
    np.testing.assert_allclose(equalize_spectrum(chunks[0], ls, target=ls), chunks[0], atol=1e-5)   # identity
    with pytest.raises(ValueError, match="log_spectrum"):
        equalize_spectrum(chunks[0], np.array([0.0, np.nan, 1.0]))


@pytest.mark.parametrize("kind", ["fbank", "mfcc"])
def test_level_normalisation_is_gain_invariant_and_device_equals_host(speech_lj, kind):
    """normalize='level': the waveform is scaled to an RMS of LEVEL_RMS first, so a 20 dB quieter copy gives the
    same features (bins at the log's floor included) while the spectral shape stays (unlike CMVN); the device path,
    with the padding samples left out of the RMS, equals the host path."""
    cfg = FeatureConfig(kind=kind, normalize="level", num_mel_bins=40)
    ref = compute_features(speech_lj, cfg)
    np.testing.assert_allclose(compute_features(speech_lj * np.float32(0.1), cfg), ref, atol=1e-3)
    np.testing.assert_allclose(compute_features(speech_lj * np.float32(3.0), cfg), ref, atol=1e-3)
    rms = float(np.sqrt(np.mean(speech_lj.astype(np.float64) ** 2)))
    np.testing.assert_allclose(level_gain(np.sum(speech_lj.astype(np.float64) ** 2), speech_lj.size), 0.1 / rms)
    raw = compute_features(speech_lj * np.float32(0.1 / rms), dataclasses.replace(cfg, normalize="none"))
    np.testing.assert_allclose(ref, raw, atol=1e-3)
    assert level_gain(0.0, 100) == 1.0          # digital silence stays as it is
    n0 = speech_lj.shape[0]
    audio = np.zeros((1, n0 + 3000), np.float32)
    audio[0, :n0] = speech_lj
    pads = (np.arange(n0 + 3000) >= n0).astype(np.float32)[None]
    feats, _ = compute_features_jax(audio * np.float32(0.3), pads, cfg)
    np.testing.assert_allclose(np.asarray(feats)[0, :ref.shape[0]], ref, atol=2e-3)
