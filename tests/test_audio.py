"""jasr.audio against soundfile's raw decode and an independent polyphase resampler (scipy)."""
import json
import os

import numpy as np
import pytest
import scipy.signal
import soundfile as sf

from jasr.audio import AudioError, audio_info, load_audio, resample, to_mono

DATA = "/work/shared/data"


def _manifest(name):
    with open(os.path.join(DATA, name, "manifest.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for r in rows:
        r["path"] = os.path.join(DATA, name, r["audio"])
    return rows


FSDD = _manifest("fsdd")[:3]
LJ = _manifest("ljspeech_sample")[:2]
LIBRI = _manifest("librivox_sense_sensibility")[:2]


@pytest.mark.parametrize("row", FSDD + LJ + LIBRI, ids=lambda r: r["id"])
def test_native_rate_is_the_exact_decode(row):
    x = load_audio(row["path"], sample_rate=None)
    ref, sr = sf.read(row["path"], dtype="int16")
    assert sr == row["sample_rate"] and x.dtype == np.float32 and x.shape == (row["num_samples"],)
    np.testing.assert_array_equal(x, ref.astype(np.float32) / 32768.0)
    info = audio_info(row["path"])
    assert (info.sample_rate, info.num_samples, info.channels) == (row["sample_rate"], row["num_samples"], 1)
    assert abs(info.duration - row["duration"]) < 1e-3


@pytest.mark.parametrize("row", FSDD[:2] + LJ[:1], ids=lambda r: r["id"])
def test_resampling_matches_scipy_polyphase(row):
    """soxr (library) vs scipy's Kaiser polyphase filter: same band-limited signal up to filter differences."""
    sr_in = row["sample_rate"]
    x = load_audio(row["path"], sample_rate=None).astype(np.float64)
    y = load_audio(row["path"], 16000)
    g = np.gcd(16000, sr_in)
    ref = scipy.signal.resample_poly(x, 16000 // g, sr_in // g, window=("kaiser", 14.0))
    assert abs(y.shape[0] - ref.shape[0]) <= 1
    n = min(y.shape[0], ref.shape[0])
    # the two anti-aliasing filters differ in their transition bands: compare below 80% of the lower Nyquist
    lp = scipy.signal.firwin(255, 0.8 * min(sr_in, 16000) / 2, fs=16000)
    a, b = scipy.signal.filtfilt(lp, [1.0], y[:n]), scipy.signal.filtfilt(lp, [1.0], ref[:n])
    rel = np.sqrt(np.mean((a - b)[300:-300] ** 2) / np.mean(b[300:-300] ** 2))
    assert rel < 0.02, rel
    assert np.corrcoef(y[:n], ref[:n])[0, 1] > 0.99


def test_resample_roundtrip_and_identity():
    x = load_audio(FSDD[1]["path"], sample_rate=None)
    assert resample(x, 8000, 8000) is not None and np.array_equal(resample(x, 8000, 8000), x)
    back = resample(resample(x, 8000, 16000), 16000, 8000)
    assert back.shape == x.shape
    # energy is mostly below 3.5 kHz, so up-then-down sampling must give the signal back closely
    rel = np.linalg.norm(back[100:-100] - x[100:-100]) / np.linalg.norm(x[100:-100])
    assert rel < 0.05, rel
    with pytest.raises(ValueError, match="positive"):
        resample(x, 0, 16000)


def test_stereo_is_averaged_and_other_formats(tmp_path):
    x = load_audio(LIBRI[1]["path"], sample_rate=None)
    stereo = np.stack([x, 0.5 * x], axis=1)
    p = tmp_path / "stereo.wav"
    sf.write(p, stereo, 16000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(p), 0.75 * x, atol=1e-7)
    both = load_audio(p, mono=False)
    assert both.shape == (x.shape[0], 2)
    np.testing.assert_allclose(to_mono(both), 0.75 * x, atol=1e-7)
    # OGG/Vorbis (lossy): same length, highly correlated with the source
    q = tmp_path / "speech.ogg"
    sf.write(q, x, 16000, format="OGG", subtype="VORBIS")
    y = load_audio(q)
    assert abs(y.shape[0] - x.shape[0]) <= 1
    n = min(x.shape[0], y.shape[0])
    assert np.corrcoef(x[:n], y[:n])[0, 1] > 0.98


def test_segment_read_matches_slice():
    row = LIBRI[0]
    x = load_audio(row["path"])
    seg = load_audio(row["path"], offset=1.25, duration=0.5)
    np.testing.assert_array_equal(seg, x[20000:28000])


def test_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.wav"
    with pytest.raises(AudioError, match="nope.wav"):
        load_audio(missing)
    with pytest.raises(AudioError, match="nope.wav"):
        audio_info(missing)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 4)
    with pytest.raises(AudioError, match="corrupt.wav"):
        load_audio(corrupt)
    text = tmp_path / "notes.flac"
    text.write_text("this is not audio\n")
    with pytest.raises(AudioError, match="notes.flac"):
        load_audio(text)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros((0,), np.float32), 16000)
    with pytest.raises(AudioError, match="empty.wav"):
        load_audio(empty)
