"""Manifests and the grain pipeline: exact resume, seeded shuffling, bounded shapes, each utterance once per epoch."""
import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jasr.audio import load_audio
from jasr.augment import AudioAugment
from jasr.data import BatchConfig, make_loader, plan_epoch
from jasr.manifests import ManifestError, read_folder, read_manifest, write_manifest
from jasr.features import FeatureConfig, compute_features, num_frames
from jasr.tokenizers import CharTokenizer

DATA = "/work/shared/data"
FSDD_MANIFEST = os.path.join(DATA, "fsdd", "manifest.jsonl")


@pytest.fixture(scope="module")
def fsdd():
    return read_manifest(FSDD_MANIFEST)


@pytest.fixture(scope="module")
def small(fsdd):
    # 48 utterances: 4 speakers x 4 digits x 3 takes, durations 0.2 .. 1.x s
    return [u for u in fsdd if int(u.id.split("_")[0]) < 4 and int(u.id.split("_")[-1]) < 3]


@pytest.fixture(scope="module")
def tok(fsdd):
    return CharTokenizer.from_texts(u.text for u in fsdd)


FC = FeatureConfig(kind="fbank", num_mel_bins=40)
BC = BatchConfig(max_frames=1200, num_buckets=3, frame_pad_multiple=8, label_pad_multiple=4)


def _collect(it, n=None):
    return list(itertools.islice(it, n))


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# ------------------------------------------------------------------------------------------ manifests

def test_read_shared_manifests():
    for name in ("fsdd", "ljspeech_sample", "librivox_sense_sensibility"):
        path = os.path.join(DATA, name, "manifest.jsonl")
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        utts = read_manifest(path)
        assert len(utts) == len(rows)
        for u, r in zip(utts, rows):
            assert u.id == r["id"] and u.text == r["text"] and u.duration == r["duration"]
            assert os.path.isabs(u.audio_path) and os.path.isfile(u.audio_path)
            assert u.sample_rate == r["sample_rate"] and u.speaker == r["speaker"]


def test_nemo_manifest_roundtrip_and_missing_duration(tmp_path, small):
    p = tmp_path / "nemo.jsonl"
    write_manifest(small[:5], p)
    line = json.loads(p.read_text().splitlines()[0])
    assert set(line) >= {"audio_filepath", "duration", "text"}
    assert read_manifest(p) == small[:5]
    # relative audio_filepath, no duration (read from the header), no id (file stem)
    rel = os.path.relpath(small[0].audio_path, tmp_path)
    q = tmp_path / "rel.jsonl"
    q.write_text(json.dumps({"audio_filepath": rel, "text": "ZERO"}) + "\n\n")
    (u,) = read_manifest(q)
    assert u.audio_path == small[0].audio_path and u.id == small[0].id
    assert abs(u.duration - small[0].duration) < 1e-3 and u.sample_rate == 8000


@pytest.mark.parametrize("lines,match", [
    (['{"audio": "%s", "text": "ZERO"}', '{"audio": oops}'], r"bad\.jsonl:2: not valid JSON"),
    (['{"audio": "%s", "text": "  "}'], r"bad\.jsonl:1: empty transcript"),
    (['{"audio": "%s"}'], r"bad\.jsonl:1: no transcript"),
    (['{"text": "ZERO"}'], r"bad\.jsonl:1: no audio path"),
    (['{"audio": "/nonexistent/x.wav", "text": "ZERO", "duration": 1}'], r"bad\.jsonl:1: audio file not found"),
    (['{"id": "a", "audio": "%s", "text": "ZERO"}', '{"id": "a", "audio": "%s", "text": "ONE"}'],
     r"bad\.jsonl:2: duplicate id 'a'"),
    (['[1, 2]'], r"bad\.jsonl:1: expected a JSON object"),
])
def test_manifest_errors_name_file_and_line(tmp_path, small, lines, match):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(line.replace("%s", small[0].audio_path) for line in lines) + "\n")
    with pytest.raises(ManifestError, match=match):
        read_manifest(p)


def test_read_folder(tmp_path, small):
    d = tmp_path / "corpus"
    (d / "spk1").mkdir(parents=True)
    (d / "spk2").mkdir()
    for u in small[:3]:
        os.symlink(u.audio_path, d / "spk1" / os.path.basename(u.audio_path))
        (d / "spk1" / (u.id + ".txt")).write_text(u.text.lower() + "\n")
    lines = []
    for u in small[3:6]:
        os.symlink(u.audio_path, d / "spk2" / os.path.basename(u.audio_path))
        lines.append(f"{u.id} {u.text}")
    (d / "spk2" / "spk2.trans.txt").write_text("\n".join(lines) + "\n")
    got = read_folder(d)
    want = sorted(small[:6], key=lambda u: u.id)
    assert [u.id for u in got] == [u.id for u in want]
    for g, w in zip(got, want):
        assert g.text.upper() == w.text and abs(g.duration - w.duration) < 1e-3
    os.symlink(small[7].audio_path, d / "spk2" / "orphan.wav")
    with pytest.raises(ManifestError, match="orphan.wav"):
        read_folder(d)


# ------------------------------------------------------------------------------------------ the loader

def test_batches_are_correct_and_bounded(small, tok):
    loader = make_loader(small, tok, FC, BC, seed=3, num_epochs=1)
    batches = _collect(iter(loader))
    assert len(batches) == loader.batches_per_epoch == loader.steps_per_epoch
    shapes = {(b["features"].shape[0], b["features"].shape[1], b["labels"].shape[1]) for b in batches}
    assert shapes <= set(loader.bucket_shapes) and len(loader.bucket_shapes) <= 3
    by_id = {u.id: u for u in small}
    seen = []
    for b in batches:
        bsz, t, f = b["features"].shape
        assert f == 40 and b["features"].dtype == np.float32 and b["labels"].dtype == np.int32
        assert b["feature_paddings"].shape == (bsz, t) and b["label_paddings"].shape == b["labels"].shape
        for r in range(bsz):
            uid = str(b["ids"][r])
            if not uid:          # a padding row: everything padded
                assert b["example_paddings"][r] == 1.0
                assert b["feature_paddings"][r].min() == 1.0 and b["label_paddings"][r].min() == 1.0
                continue
            seen.append(uid)
            u = by_id[uid]
            assert b["example_paddings"][r] == 0.0 and b["durations"][r] == np.float32(u.duration)
            ref = compute_features(load_audio(u.audio_path, 16000), FC)
            n = int((1 - b["feature_paddings"][r]).sum())
            assert n == ref.shape[0] == num_frames(load_audio(u.audio_path).shape[0], FC)
            np.testing.assert_array_equal(b["feature_paddings"][r], np.arange(t) >= n)
            np.testing.assert_array_equal(b["features"][r, :n], ref)
            assert not b["features"][r, n:].any()
            m = int((1 - b["label_paddings"][r]).sum())
            assert tok.decode(b["labels"][r, :m]) == u.text and not b["labels"][r, m:].any()
    assert sorted(seen) == sorted(by_id)     # every utterance exactly once


def test_resume_gives_the_same_batches(small, tok):
    def loader():
        return make_loader(small, tok, FC, BC, seed=11, num_epochs=2, worker_count=0,
                           augment=AudioAugment(speeds=(0.9, 1.0, 1.1), gain_db=(-6.0, 6.0)))
    full = _collect(iter(loader()))
    assert len(full) == loader().num_steps == 2 * loader().steps_per_epoch
    it = iter(loader())
    head = _collect(it, 4)
    state = it.get_state()
    _assert_same(head, full[:4])
    rest = _collect(it)
    it2 = iter(loader())
    it2.set_state(state)
    _assert_same(_collect(it2), rest)
    _assert_same(rest, full[4:])


def test_resume_with_worker_processes(small, tok):
    """grain worker processes: same batches as in-process, and a restored iterator continues exactly."""
    kw = dict(seed=5, num_epochs=1, shuffle=True)
    ref = _collect(iter(make_loader(small, tok, FC, BC, worker_count=0, **kw)))
    loader = make_loader(small, tok, FC, BC, worker_count=2, **kw)
    it = iter(loader)
    head = _collect(it, 3)
    state = it.get_state()
    del it
    it2 = iter(loader)
    it2.set_state(state)
    _assert_same(head + _collect(it2), ref)


def test_shuffling_is_seeded_and_epochs_differ(small, tok):
    def order(seed, epochs=2):
        ld = make_loader(small, tok, FC, BC, seed=seed, num_epochs=epochs)
        return [tuple(b["ids"]) for b in iter(ld)], ld.batches_per_epoch
    a, bpe = order(1)
    assert order(1)[0] == a
    assert order(2)[0] != a
    assert a[:bpe] != a[bpe:]                            # a new permutation each epoch
    for e in range(2):
        ids = [i for b in a[e * bpe:(e + 1) * bpe] for i in b if i]
        assert sorted(ids) == sorted(u.id for u in small)
    unshuffled = [tuple(b["ids"]) for b in iter(make_loader(small, tok, FC, BC, seed=1, shuffle=False))]
    assert unshuffled == [tuple(b["ids"]) for b in iter(make_loader(small, tok, FC, BC, seed=9, shuffle=False))]


@settings(max_examples=60, deadline=None)
@given(bucket_of=st.lists(st.integers(-1, 3), min_size=1, max_size=120),
       sizes=st.lists(st.integers(1, 9), min_size=4, max_size=4), seed=st.integers(0, 2 ** 32 - 1),
       epoch=st.integers(0, 50), shuffle=st.booleans(), shard_count=st.integers(1, 4))
def test_plan_epoch_properties(bucket_of, sizes, seed, epoch, shuffle, shard_count):
    bucket_of = np.asarray(bucket_of)                  # -1: dropped utterances
    plan = plan_epoch(bucket_of, sizes, seed=seed, epoch=epoch, shuffle=shuffle, shard_count=shard_count)
    assert len(plan) % shard_count == 0
    # the number of batches does not depend on the seed or epoch (so a global index maps to one epoch)
    other = plan_epoch(bucket_of, sizes, seed=seed + 1, epoch=epoch + 1, shuffle=shuffle, shard_count=shard_count)
    assert len(other) == len(plan)
    got = np.sort(np.concatenate([idx for _, idx in plan] + [np.zeros(0, np.int64)]))
    np.testing.assert_array_equal(got, np.flatnonzero(bucket_of >= 0))     # each kept utterance once
    for b, idx in plan:
        assert len(idx) <= sizes[b] and np.all(bucket_of[idx] == b)
    again = plan_epoch(bucket_of, sizes, seed=seed, epoch=epoch, shuffle=shuffle, shard_count=shard_count)
    assert all(x[0] == y[0] and np.array_equal(x[1], y[1]) for x, y in zip(plan, again))


def test_multi_host_shards_partition_each_epoch(small, tok):
    shards = [make_loader(small, tok, FC, BC, seed=7, num_epochs=1, shard_index=i, shard_count=3)
              for i in range(3)]
    steps = {ld.steps_per_epoch for ld in shards}
    assert len(steps) == 1
    ids = []
    for ld in shards:
        batches = _collect(iter(ld))
        assert len(batches) == ld.steps_per_epoch
        for b in batches:
            assert (b["features"].shape[0], b["features"].shape[1], b["labels"].shape[1]) in ld.bucket_shapes
            ids += [i for i in b["ids"] if i]
    assert sorted(ids) == sorted(u.id for u in small)
    import grain.python as grain
    via_options = make_loader(small, tok, FC, BC, seed=7, num_epochs=1,
                              shard_options=grain.ShardOptions(shard_index=1, shard_count=3))
    _assert_same(_collect(iter(via_options)), _collect(iter(shards[1])))


def test_wrong_manifest_duration_is_reported(small, tok):
    import dataclasses
    lying = [dataclasses.replace(u, duration=0.09) if i == 0 else u for i, u in enumerate(small)]
    loader = make_loader(lying, tok, FC, dataclass_replace(BC, bucket_boundaries=(0.1, 2.0)), seed=0,
                         shuffle=False)
    with pytest.raises(Exception, match=f"{small[0].id}.*manifest duration"):
        _collect(iter(loader))


def test_corrupt_audio_is_reported_with_its_path(small, tok, tmp_path):
    import dataclasses
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF....WAVEfmt " + bytes(40))
    utts = [dataclasses.replace(small[0], audio_path=str(bad))] + small[1:4]
    loader = make_loader(utts, tok, FC, BC, seed=0, shuffle=False)
    with pytest.raises(Exception, match="broken.wav"):
        _collect(iter(loader))


def test_label_buckets_audio_output_and_whisper(small, tok):
    bc = BatchConfig(max_frames=1200, num_buckets=2, label_bucket_boundaries=(4, 8), output="audio")
    ld = make_loader(small, tok, FC, bc, seed=0, shuffle=False)
    shapes = set()
    for b in iter(ld):
        shapes.add((b["audio"].shape[0], b["audio"].shape[1], b["labels"].shape[1]))
        r = 0
        u = next(x for x in small if x.id == b["ids"][r])
        n = int((1 - b["audio_paddings"][r]).sum())
        np.testing.assert_array_equal(b["audio"][r, :n], load_audio(u.audio_path, 16000))
    assert shapes <= set(ld.bucket_shapes) and {s[2] for s in shapes} <= {4, 8}
    wl = make_loader(small[:6], tok, FeatureConfig(kind="whisper", whisper_pad_or_trim=True),
                     BatchConfig(max_frames=9000), seed=0)
    assert len(wl.bucket_shapes) == 1             # one shape: 30 s windows, B = 9000 // 3000
    assert [b["features"].shape for b in iter(wl)] == [(3, 3000, 80)] * 2


def test_loader_errors(small, tok, tmp_path):
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        make_loader(small, CharTokenizer.from_texts(["ZERO"]), FC, BC)
    with pytest.raises(ValueError, match=r"longer than the model.s output frames they must align with"):
        make_loader(small, tok, FC, dataclass_replace(BC, subsampling=16))
    ld = make_loader(small, tok, FC, dataclass_replace(BC, subsampling=16, drop_unfit=True))
    assert ld.dropped and ld.num_utterances == len(small) - len(ld.dropped)
    with pytest.raises(ValueError, match="longer than the last bucket edge"):
        make_loader(small, tok, FC, dataclass_replace(BC, bucket_boundaries=(0.3,)))
    with pytest.raises(ValueError, match="CMVN"):
        make_loader(small, tok, FeatureConfig(normalize="global"), BC)


def dataclass_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)
