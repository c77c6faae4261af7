"""The synthetic demo corpus: real eSpeak NG synthesis, manifests, held-out voice settings, determinism, reuse."""
import json
import os

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("espeakng_loader")

from jasr import demo_data  # noqa: E402
from jasr.demo_data import DemoCorpusConfig, make_demo_corpus, read_jsonl  # noqa: E402

SMALL = DemoCorpusConfig(num_train=12, num_dev=4, num_heldout=6, max_words=3, seed=3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("demo") / "corpus")
    return root, make_demo_corpus(root, SMALL, verbose=False)


def test_synth_speaks_and_differs_by_voice():
    s = demo_data.get_synth()
    a = s.synth("one two three", "en-us+m1", rate=150, pitch=40)
    b = s.synth("one two three", "en-us+f2", rate=150, pitch=70)
    assert a.dtype == np.int16 and s.sample_rate == 22050
    assert 0.6 < a.shape[0] / s.sample_rate < 3.0, "three words at 150 wpm last about a second"
    assert np.abs(a).max() > 3000, "audible signal"
    assert a.shape != b.shape or not np.array_equal(a, b)
    fast = s.synth("one two three", "en-us+m1", rate=260, pitch=40)
    assert fast.shape[0] < a.shape[0], "a higher rate gives shorter audio"


def test_synth_errors_name_the_input():
    s = demo_data.get_synth()
    with pytest.raises(ValueError, match="no voice 'xx-nonexistent'"):
        s.synth("one", "xx-nonexistent")
    with pytest.raises(ValueError, match="empty text"):
        s.synth("  ", "en-us")


def test_manifests_match_audio(corpus):
    root, manifests = corpus
    assert set(manifests) == {"train", "dev", "heldout"}
    for split, n in (("train", 12), ("dev", 4), ("heldout", 6)):
        recs = read_jsonl(manifests[split])
        assert len(recs) == n
        for r in recs:
            words = r["text"].split()
            assert 1 <= len(words) <= 3 and all(w in demo_data.DIGIT_WORDS for w in words)
            audio, sr = sf.read(os.path.join(root, r["audio"]), dtype="float32")
            assert sr == 16000 and audio.shape[0] == r["num_samples"]
            assert abs(r["duration"] - audio.shape[0] / sr) < 1e-3
            assert np.abs(audio).max() > 0.01


def test_heldout_voice_settings_are_unseen(corpus):
    _, manifests = corpus
    seen = read_jsonl(manifests["train"]) + read_jsonl(manifests["dev"])
    held = read_jsonl(manifests["heldout"])
    seen_voices = {r["voice"] for r in seen}
    for r in held:
        lang, variant = r["voice"].split("+")
        assert lang in demo_data.HELDOUT_LANGUAGES and variant in demo_data.HELDOUT_VARIANTS
        assert r["voice"] not in seen_voices
        assert r["rate"] in demo_data.HELDOUT_RATES and r["pitch"] in demo_data.HELDOUT_PITCHES
    assert not set(demo_data.TRAIN_VARIANTS) & set(demo_data.HELDOUT_VARIANTS)
    assert not set(demo_data.TRAIN_LANGUAGES) & set(demo_data.HELDOUT_LANGUAGES)
    assert not set(demo_data.TRAIN_PITCHES) & set(demo_data.HELDOUT_PITCHES)


def test_deterministic_and_reused(corpus, tmp_path):
    root, manifests = corpus
    info = os.path.join(root, "corpus.json")
    mtime = os.path.getmtime(info)
    assert make_demo_corpus(root, SMALL, verbose=False) == manifests
    assert os.path.getmtime(info) == mtime, "a matching corpus is reused, not rebuilt"
    other = make_demo_corpus(str(tmp_path / "again"), SMALL, verbose=False)
    a = read_jsonl(manifests["heldout"])
    b = read_jsonl(other["heldout"])
    keys = ("id", "text", "voice", "rate", "pitch", "snr_db")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    # eSpeak's waveform may differ by a few samples between calls; the durations agree closely
    assert all(abs(x["duration"] - y["duration"]) < 0.05 for x, y in zip(a, b))


def test_changed_config_rebuilds_atomically(tmp_path):
    root = str(tmp_path / "c")
    make_demo_corpus(root, DemoCorpusConfig(num_train=2, num_dev=1, num_heldout=1), verbose=False)
    m = make_demo_corpus(root, DemoCorpusConfig(num_train=3, num_dev=1, num_heldout=1), verbose=False)
    assert len(read_jsonl(m["train"])) == 3
    with open(os.path.join(root, "corpus.json")) as f:
        assert json.load(f)["config"]["num_train"] == 3
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".demo_corpus_tmp_") or ".old." in n]


def test_bad_corpus_config():
    with pytest.raises(ValueError, match="min_words"):
        DemoCorpusConfig(min_words=3, max_words=2).validate()
    with pytest.raises(ValueError, match="num_train"):
        DemoCorpusConfig(num_train=-1).validate()
