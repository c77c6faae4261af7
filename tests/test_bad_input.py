"""Bad input on the data side (issue 21): truncated, zero-length, random-bytes and NaN-sample files (made from real
FSDD recordings in tmp_path), transcripts outside the tokenizer, labels that cannot fit, a batch budget below one
utterance, and a fuzzed manifest reader. Each is an error naming the file and what is wrong, or a skip that is
named in the log and counted (training), or a failed record next to the decoded rest (decode.py)."""
import dataclasses
import json
import os
import string
import tempfile

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings, strategies as st

from jasr.audio import AudioError, audio_info, check_audio, load_audio
from jasr.data import BatchConfig, DataError, make_loader
from jasr.manifests import ManifestError, Utterance, check_utterances, read_manifest
from jasr.features import FeatureConfig
from jasr.logs import SkipLog, read_jsonl
from jasr.tokenizers import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = "/work/shared/data/fsdd"


def _rows():
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for r in rows:
        r["path"] = os.path.join(FSDD, r["audio"])
    return rows


ROWS = _rows()
BY_ID = {r["id"]: r for r in ROWS}
REAL = [BY_ID[f"{d}_george_{k}"] for d in range(4) for k in (5, 6, 7)]      # 12 real utterances, 0.2-0.6 s


def _utt(row, **kw):
    return Utterance(id=row["id"], audio_path=row["path"], text=row["text"], duration=row["duration"],
                     sample_rate=row["sample_rate"], speaker=row["speaker"], **kw)


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """Fault-injected files next to each other: {name: (path, the real row it was made from)}."""
    d = tmp_path_factory.mktemp("faults")
    out = {}
    src = BY_ID["1_george_10"]
    data = open(src["path"], "rb").read()
    (d / "truncated.wav").write_bytes(data[:len(data) // 2])            # a real WAV with half its bytes
    (d / "empty.wav").write_bytes(b"")
    (d / "random.wav").write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    x, sr = sf.read(src["path"], dtype="float32")
    x[len(x) // 3] = np.nan                                              # one NaN float sample
    sf.write(d / "nan.wav", x, sr, subtype="FLOAT")
    sf.write(d / "full.aiff", x * 0 + 0.1, sr, format="AIFF", subtype="PCM_16")
    a = (d / "full.aiff").read_bytes()
    (d / "truncated.aiff").write_bytes(a[:len(a) // 2])
    for name in ("truncated.wav", "empty.wav", "random.wav", "nan.wav", "truncated.aiff"):
        out[name] = (str(d / name), src)
    return out


# ------------------------------------------------------------------------------------------------ audio

def test_truncated_wav_and_aiff_are_errors_naming_both_lengths(faults):
    path, src = faults["truncated.wav"]
    held = (os.path.getsize(path) - 44) // 2                       # 16-bit mono PCM after a 44-byte header
    info = audio_info(path)
    assert info.declared_samples == src["num_samples"] and info.num_samples == held    # libsndfile clamps
    for f in (load_audio, check_audio):
        with pytest.raises(AudioError, match=rf"truncated\.wav is truncated.*declares {src['num_samples']} "
                                             rf"samples.*holds {held} samples"):
            f(path)
    with pytest.raises(AudioError, match=r"truncated\.aiff is truncated.*declares \d+ samples"):
        load_audio(faults["truncated.aiff"][0])
    load_audio(os.path.join(os.path.dirname(path), "full.aiff"))      # the intact one loads


def test_length_disagreeing_with_the_manifest_is_an_error():
    row = BY_ID["1_george_10"]
    dur = row["duration"]
    for f in (load_audio, check_audio):
        f(row["path"], expected_duration=dur + 0.01)               # within the tolerance (manifests round)
        with pytest.raises(AudioError, match=rf"1_george_10\.wav .*{row['num_samples']} samples.*manifest "
                                             rf"duration is {dur / 2}"):
            f(row["path"], expected_duration=dur / 2)
    with pytest.raises(AudioError, match=r"1_george_10\.wav .*segment"):
        load_audio(row["path"], offset=0.1, duration=dur)          # a segment that runs past the end
    with pytest.raises(AudioError, match=r"1_george_10\.wav .*segment"):
        check_audio(row["path"], offset=0.1, duration=dur)


def test_header_check_names_each_bad_file(faults):
    utts = [_utt(REAL[0])] + [
        Utterance(id=name, audio_path=path, text="ONE", duration=src["duration"]) for name, (path, src) in
        faults.items()]
    ok, bad = check_utterances(utts)
    # NaN samples only show when decoded (the loader's first read); the header check costs no decoding
    assert [u.id for u in ok] == [REAL[0]["id"], "nan.wav"]
    reasons = {r["id"]: r["reason"] for r in bad}
    assert set(reasons) == {"truncated.wav", "empty.wav", "random.wav", "truncated.aiff"}
    for r in bad:
        assert r["audio"] == faults[r["id"]][0] and faults[r["id"]][0] in r["reason"]
    assert "truncated" in reasons["truncated.wav"] and "cannot read" in reasons["empty.wav"]


# ------------------------------------------------------------------------------------------------ the loader

TOK = CharTokenizer.from_texts(r["text"] for r in ROWS)
FC = FeatureConfig(kind="fbank", num_mel_bins=40, sample_rate=8000)
BC = BatchConfig(max_frames=2000, num_buckets=1, frame_pad_multiple=8, label_pad_multiple=4)


def _batches(loader):
    return list(iter(loader))


def test_loader_skips_a_file_that_fails_on_first_read(faults):
    nan_path, src = faults["nan.wav"]
    utts = [_utt(r) for r in REAL[:5]] + [Utterance(id="nan", audio_path=nan_path, text="ONE",
                                                    duration=src["duration"])]
    with pytest.raises(AudioError, match=r"utterance 'nan'.*nan\.wav decodes to non-finite samples"):
        _batches(make_loader(utts, TOK, FC, BC, shuffle=False))
    (batch,) = _batches(make_loader(utts, TOK, FC, dataclasses.replace(BC, skip_bad_audio=True), shuffle=False))
    r = list(batch["ids"]).index("nan")
    assert "nan.wav decodes to non-finite samples" in batch["errors"][r]
    assert batch["example_paddings"][r] == 1.0 and batch["label_weights"][r] == 0.0
    assert batch["feature_paddings"][r].min() == 1.0 and batch["label_paddings"][r].min() == 1.0
    good = [i for i in range(len(utts)) if i != r]
    assert not any(batch["errors"][good]) and np.all(batch["label_weights"][good] == 1.0)
    assert np.isfinite(batch["features"]).all()


def test_manifest_duration_checked_on_read(faults):
    """A file shorter than its manifest says (e.g. cut by a copy) is caught when read, not batched as half an
    utterance."""
    row = REAL[0]
    lying = [_utt(r) for r in REAL[1:4]] + [dataclasses.replace(_utt(row), duration=2 * row["duration"])]
    with pytest.raises(AudioError, match=rf"utterance '{row['id']}'.*manifest duration is {2 * row['duration']}"):
        _batches(make_loader(lying, TOK, FC, BC, shuffle=False))


def test_unencodable_and_unfit_transcripts(tmp_path):
    utts = [_utt(r) for r in REAL[:4]]
    odd = dataclasses.replace(_utt(REAL[4]), text="ZERO! ÉTÉ")
    long = dataclasses.replace(_utt(REAL[5]), text="SEVEN " * 12 + "SEVEN")       # 77 tokens, ~30 frames
    with pytest.raises(ValueError, match=r"not in the tokenizer's vocabulary"):
        make_loader(utts + [odd], TOK, FC, BC)
    # training: a counted, named skip
    ld = make_loader(utts + [odd, long], TOK, FC, dataclasses.replace(BC, skip_unencodable=True, drop_unfit=True,
                                                                        subsampling=2))
    assert ld.num_utterances == 4 and ld.dropped == [odd.id, long.id]
    causes = {r["id"]: (r["cause"], r["reason"], r["audio"]) for r in ld.skipped}
    assert causes[odd.id][0] == "unencodable" and "'!'" in causes[odd.id][1] and "'É'" in causes[odd.id][1]
    assert causes[long.id][0] == "unfit" and "77 tokens" in causes[long.id][1]
    assert causes[long.id][2] == long.audio_path
    # evaluation: kept with a placeholder label (no loss) and decoded
    ev = make_loader(utts + [odd, long], TOK, FC, dataclasses.replace(BC, keep_unscorable=True, subsampling=2),
                     shuffle=False)
    assert ev.num_utterances == 6 and not ev.skipped
    assert {(r["id"], r["cause"]) for r in ev.placeholders} == {(odd.id, "unencodable"), (long.id, "unfit")}
    (batch,) = _batches(ev)
    ids = list(batch["ids"])
    for uid in (odd.id, long.id):
        r = ids.index(uid)
        assert batch["label_weights"][r] == 0.0 and batch["example_paddings"][r] == 0.0
        assert batch["label_paddings"][r].min() == 1.0 and (1 - batch["feature_paddings"][r]).sum() > 0
    assert sum(batch["label_weights"]) == 4


def test_max_frames_below_one_utterance_is_an_error():
    utts = [_utt(r) for r in REAL]
    frames = [int(np.ceil(r["duration"] * 100)) for r in REAL]       # 10 ms frames, roughly
    with pytest.raises(DataError, match=r"max_frames=16 \(config data\.max_frames\) is below.*12 of 12 "
                                        r"utterances.*need \d+ \(shortest\) to \d+ \(longest\) frames.*drop_too_long"):
        make_loader(utts, TOK, FC, dataclasses.replace(BC, max_frames=16))
    with pytest.raises(ValueError, match="every utterance was left out"):
        make_loader(utts, TOK, FC, dataclasses.replace(BC, max_frames=16, drop_too_long=True))
    # a budget between the shortest and the longest: the longer bucket's utterances go, named
    bc = dataclasses.replace(BC, max_frames=48, bucket_boundaries=(0.4, 0.7))
    ld = make_loader(utts, TOK, FC, dataclasses.replace(bc, drop_too_long=True))
    long_ids = {r["id"] for r in REAL if r["duration"] > 0.4}
    assert long_ids and {r["id"] for r in ld.skipped} == long_ids
    assert all(r["cause"] == "oversize" and "max_frames=48" in r["reason"] for r in ld.skipped)
    assert all(b * t <= 48 for b, t, _ in ld.bucket_shapes)
    # evaluation keeps them: batches of one
    ev = make_loader(utts, TOK, FC, dataclasses.replace(bc, allow_oversize=True), shuffle=False)
    assert ev.num_utterances == 12 and max(frames) > 48


# ------------------------------------------------------------------------------------------------ manifests

_KEYS = ["id", "audio", "audio_filepath", "text", "duration", "offset", "sample_rate", "num_samples", "speaker",
         "utt_id", "transcript", "path"]
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20) | st.floats(allow_nan=True)
                       | st.text(max_size=12) | st.sampled_from([REAL[0]["path"], "x.wav", "", "\x00"]),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                   max_size=3), max_leaves=6)
_LINE = st.one_of(
    st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=7).map(lambda d: json.dumps(d, allow_nan=True)),
    st.text(alphabet=string.printable, max_size=40),
    st.sampled_from(["[" * 5000, "{}", "null", "1e999", '{"audio": "%s", "text": "ONE"}' % REAL[0]["path"]]))


def _fuzz_read(content: bytes):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.jsonl")
        with open(p, "wb") as f:
            f.write(content)
        for kw in ({}, {"check_audio": False}, {"allow_empty_text": True, "bad": []}):
            try:
                utts = read_manifest(p, **kw)
            except ManifestError as e:
                assert "m.jsonl" in str(e)
                continue
            for u in utts:                        # what comes out is usable
                assert isinstance(u.id, str) and isinstance(u.text, str) and u.duration > 0
                assert np.isfinite(u.duration) and u.offset >= 0 and os.path.isabs(u.audio_path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=5), fault=st.sampled_from(["truncated.wav", "empty.wav", "random.wav"]),
       junk=st.binary(max_size=64))
def test_read_manifest_fuzz_only_manifest_errors(faults, lines, fault, junk):
    """Random JSONL lines (known keys with values of every JSON type, non-JSON text, deep nesting), random bytes
    (invalid UTF-8) and lines whose duration must come from a bad audio header: read_manifest raises
    ManifestError naming the file, or returns utterances with finite positive durations."""
    bad_header = json.dumps({"audio": faults[fault][0], "text": "ONE"})
    _fuzz_read("\n".join(lines).encode())
    _fuzz_read(("\n".join(lines + [bad_header])).encode())
    _fuzz_read(junk)


def test_read_manifest_collects_unreadable_headers(tmp_path, faults):
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps({"id": n, "audio": faults[n][0], "text": "ONE"})
                           for n in ("truncated.wav", "empty.wav")) + "\n"
                 + json.dumps({"audio": REAL[0]["path"], "text": "ZERO", "num_samples": 800, "sample_rate": 8000})
                 + "\n")
    with pytest.raises(ManifestError, match=r"m\.jsonl:2: no duration and cannot read audio file .*empty\.wav"):
        read_manifest(p)
    bad = []
    utts = read_manifest(p, bad=bad)
    assert [r["id"] for r in bad] == ["empty.wav"] and "empty.wav" in bad[0]["reason"]
    assert [u.id for u in utts] == ["truncated.wav", REAL[0]["id"]]
    assert utts[1].duration == 0.1                                     # num_samples / sample_rate


def test_skip_log_resumes_like_metrics(tmp_path):
    lines = []
    log = SkipLog(str(tmp_path), 0, echo=lines.append)
    log.add(0, "train", [{"id": "a", "audio": "/x/a.wav", "reason": "bad header"}], "skipped")
    log.add(3, "train", [{"id": "b", "audio": "/x/b.wav", "reason": "NaN"}], "skipped")
    log.add(3, "train", [{"id": "b", "audio": "/x/b.wav", "reason": "NaN"}], "skipped")     # once per utterance
    log.add(9, "dev", [{"id": "c", "audio": "/x/c.wav", "reason": "NaN"}], "skipped")
    assert lines == ["[data] skipped train utterance a (/x/a.wav): bad header",
                     "[data] skipped train utterance b (/x/b.wav): NaN",
                     "[data] skipped dev utterance c (/x/c.wav): NaN"]
    resumed = SkipLog(str(tmp_path), 5, echo=lines.append)      # resumed at step 5: c (step 9) is found again
    resumed.add(0, "train", [{"id": "a", "audio": "/x/a.wav", "reason": "bad header"}], "skipped")
    recs = read_jsonl(str(tmp_path / "skipped.jsonl"))
    assert [(r["step"], r["id"]) for r in recs] == [(0, "a"), (3, "b")]
    assert resumed.count("train", "skipped") == 2 and resumed.count("dev", "skipped") == 0


# ------------------------------------------------------------------------------------------------ training, decoding

def _write_manifest(path, entries):
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return str(path)


def _entry(row, **kw):
    return {"id": row["id"], "audio": row["path"], "text": row["text"], "duration": row["duration"], **kw}


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory, faults):
    """Manifests with every kind of bad input; returns (train manifest, dev manifest, ids by kind)."""
    d = tmp_path_factory.mktemp("bad_run")
    src = faults["truncated.wav"][1]
    bad = {n: {"id": n.split(".")[0], "audio": faults[n][0], "text": src["text"], "duration": src["duration"]}
           for n in ("truncated.wav", "empty.wav", "random.wav", "nan.wav")}
    unfit = _entry(BY_ID["6_yweweler_3"], text="SIX " * 10 + "SIX")              # 0.14 s, 43 tokens
    train = [_entry(r) for r in REAL] + list(bad.values()) + [unfit]
    dev_rows = [BY_ID[f"{d}_george_{k}"] for d, k in ((0, 8), (1, 8), (2, 8))]
    odd = _entry(BY_ID["3_george_8"], text="THREE!")                              # '!' is not in the train text
    dev_unfit = _entry(BY_ID["6_nicolas_7"], id="dev_unfit", text="SIX " * 10 + "SIX")
    dev_nan = dict(bad["nan.wav"], id="dev_nan")
    dev = [_entry(r) for r in dev_rows] + [odd, dev_unfit, dev_nan]
    ids = {"header": ["truncated", "empty", "random"], "read": ["nan"], "unfit": [unfit["id"]],
           "dev_placeholder": [odd["id"], "dev_unfit"], "dev_read": ["dev_nan"]}
    return _write_manifest(d / "train.jsonl", train), _write_manifest(d / "dev.jsonl", dev), ids


def _bad_cfg(train_manifest, dev_manifest, **overrides):
    from jasr.config import apply_override, load_config_file
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    base = {"data.train_manifest": train_manifest, "data.dev_manifest": dev_manifest, "data.speakers_dev": "()",
            "data.max_frames": "2400", "data.num_buckets": "1", "data.speed_perturb": "()", "data.gain_db": "()",
            "data.spec_augment": "False", "data.max_bad_fraction": "0.5",
            "model.d_model": "32", "model.num_layers": "1", "model.num_heads": "2", "model.ff_mult": "2",
            "model.conv_kernel": "7", "model.subsampling_channels": "8",
            "train.num_steps": "2", "train.log_every": "1", "train.eval_every": "2", "train.checkpoint_every": "2",
            "train.progress": "False", "train.tensorboard": "False", "train.async_checkpoint": "False",
            "optim.warmup_steps": "0", "optim.schedule": "constant"}
    for k, v in {**base, **overrides}.items():
        apply_override(cfg, k, str(v))
    return cfg


@pytest.mark.slow
def test_training_skips_names_and_counts_bad_input(bad_run, faults, tmp_path_factory, capsys):
    """One training run over manifests with every kind of bad input: it trains; each left-out utterance is named
    on stdout and in skipped.jsonl and counted in metrics.jsonl; dev WER scores the utterances whose labels cannot
    be losses. Then decode.py over bad files reports each and decodes the rest."""
    from jasr.training import train
    train_m, dev_m, ids = bad_run
    workdir = str(tmp_path_factory.mktemp("run") / "w")
    final = train(_bad_cfg(train_m, dev_m), workdir, root=ROOT)
    out = capsys.readouterr().out
    assert final["step"] == 2
    # the start line counts what is used: 12 real + the NaN file (it passes the header check)
    assert "13 train / 6 dev utterances (3 train skipped, 1 train dropped: see skipped.jsonl)" in out, out
    for uid in ids["header"] + ids["read"]:
        assert f"[data] skipped train utterance {uid} (" in out
    assert "truncated.wav is truncated or corrupt: its header declares" in out
    assert "nan.wav decodes to non-finite samples" in out
    assert f"[data] dropped train utterance {ids['unfit'][0]} (" in out and "43 tokens" in out
    assert "[data] skipped dev utterance dev_nan (" in out
    assert "1 of 6 dev transcripts have characters outside the tokenizer's vocabulary ('!')" in out
    assert "1 of 6 dev labels cannot fit their frames" in out

    recs = read_jsonl(os.path.join(workdir, "skipped.jsonl"))
    got = {(r["split"], r["id"], r["action"], r["step"]) for r in recs}
    assert got == ({("train", i, "skipped", 0) for i in ids["header"]} | {("train", "nan", "skipped", 1)}
                   | {("train", ids["unfit"][0], "dropped", 0), ("dev", "dev_nan", "skipped", 2)}
                   | {("dev", i, "no_loss", 0) for i in ids["dev_placeholder"]})
    assert all(r["audio"] and r["reason"] for r in recs)

    metrics = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    data = [r for r in metrics if r["kind"] == "data"]
    assert data[0]["step"] == 0 and data[0]["skipped_utterances"] == 3 and data[0]["dropped_utterances"] == 1
    assert data[0]["train_utterances"] == 13 and data[0]["train_total"] == 17
    assert data[0]["dev_no_loss_utterances"] == 2 and data[0]["dev_total"] == 6
    assert data[-1]["skipped_utterances"] == 4 and data[-1]["dev_skipped_utterances"] == 1
    (dev,) = [r for r in metrics if r["kind"] == "eval/dev"]
    assert dev["utterances"] == 5 and dev["failed"] == 1 and np.isfinite(dev["loss"]) and "wer" in dev
    assert all(np.isfinite(r["loss"]) for r in metrics if r["kind"] == "train")

    # decode.py: the dev split (placeholder labels decoded and scored), then a manifest of bad and good files
    import decode
    assert decode.main(["--workdir", workdir, "--split", "dev", "--show", "0"]) == 0
    res = {r["id"]: r for r in read_jsonl(os.path.join(workdir, "decode_dev.jsonl"))}
    assert len(res) == 6 and "error" in res["dev_nan"] and "non-finite" in res["dev_nan"]["error"]
    assert res["3_george_8"]["ref"] == "THREE!" and "hyp" in res["3_george_8"] and "hyp" in res["dev_unfit"]
    capsys.readouterr()
    m = _write_manifest(os.path.join(workdir, "mixed.jsonl"), read_jsonl(train_m)[10:16])
    assert decode.main(["--workdir", workdir, "--manifest", m, "--show", "0"]) == 0
    out = capsys.readouterr().out
    res = read_jsonl(os.path.join(workdir, "decode_mixed.jsonl"))
    assert len(res) == 6
    failed = {r["id"]: r["error"] for r in res if "error" in r}
    assert set(failed) == {"truncated", "empty", "random", "nan"}
    assert {r["id"] for r in res if "hyp" in r} == {REAL[10]["id"], REAL[11]["id"]}
    for uid, err in failed.items():
        assert f"[decode] failed: {uid}: {err}" in out
    assert "mixed: 2 utterances, WER" in out and "4 files could not be read" in out
    # audio files on the command line: a zero-length one is reported, the other decoded
    assert decode.main(["--workdir", workdir, "--output", os.path.join(workdir, "files.jsonl"),
                        REAL[0]["path"], faults["empty.wav"][0]]) == 0
    res = {r["id"]: r for r in read_jsonl(os.path.join(workdir, "files.jsonl"))}
    assert "hyp" in res[REAL[0]["id"]] and "cannot read audio file" in res["empty"]["error"]



def test_too_many_bad_files_is_a_clear_error(bad_run, tmp_path):
    from jasr.training import train
    train_m, dev_m, _ = bad_run
    with pytest.raises(DataError, match=r"3 of 17 train utterances \(17\.6%\) are unusable, more than "
                                        r"data\.max_bad_fraction=0\.1: truncated \(.*truncated\.wav\): .*; empty "):
        train(_bad_cfg(train_m, dev_m, **{"data.max_bad_fraction": "0.1"}), str(tmp_path / "w"), root=ROOT)
