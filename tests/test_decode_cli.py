"""decode.py as a transcriber (issue 23), on one tiny Conformer-CTC run trained for two steps on FSDD digits (module
fixture, through jasr.training.train with configs/fsdd.py's decode section: digit lexicon + one-word grammar):
every method runs, outputs parse (JSONL, text, SRT/WebVTT with monotone times, CTM), results come back in input
order, the config's decode settings are the default and flags override them, bad flags are one-line exit-2 errors."""
import json
import os
import re
import shutil

import jiwer
import numpy as np
import pytest
import soundfile as sf

from decode_cli_runner import read_jsonl, run_decode as decode
from jasr.audio import load_audio
from jasr.config import apply_override, load_config_file
from jasr.training import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")
DIGITS = {"ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"}



@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, manifest path, utterance ids in manifest order) of a tiny FSDD run."""
    d = tmp_path_factory.mktemp("decode_cli")
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    picked = [r for r in recs if r["id"].endswith(("_george_0", "_george_1"))]   # the 10 digits, twice
    picked = picked[::-1]            # not sorted by id or length: the order must come back as given
    rows = [{**r, "audio": os.path.abspath(os.path.join(FSDD, r["audio"]))} for r in picked]
    manifest = str(d / "digits.jsonl")
    with open(manifest, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    for k, v in {"data.train_manifest": manifest, "data.dev_manifest": manifest, "data.speakers_dev": "()",
                 "data.speed_perturb": "()", "data.gain_db": "()", "data.spec_augment": "False",
                 "data.max_frames": "2400", "data.num_buckets": "1", "model.d_model": "32", "model.num_layers": "1",
                 "model.num_heads": "2", "model.ff_mult": "2", "model.conv_kernel": "7",
                 "model.subsampling_channels": "8", "optim.warmup_steps": "0", "optim.schedule": "constant",
                 "train.num_steps": "2", "train.log_every": "1", "train.eval_every": "2",
                 "train.checkpoint_every": "2", "train.progress": "False", "train.tensorboard": "False",
                 "train.async_checkpoint": "False", "train.ema_decay": "0.0",
                 "data.normalize": "utterance"}.items():   # a 2-step model: with CMVN every file keeps a word path
        apply_override(cfg, k, v)
    workdir = str(d / "run")
    train(cfg, workdir, root=ROOT)
    return workdir, manifest, [r["id"] for r in rows]




def test_config_decode_section_is_the_default_and_flags_override(run, tmp_path, capsys):
    workdir, manifest, ids = run
    out_path = tmp_path / "lex.jsonl"
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path)
    assert rc == 0, err
    assert "method: lexicon (CTC prefix beam search, beam 8, constrained to 10 lexicon words, word 2-gram LM " \
           "fsdd_grammar.arpa" in out
    res = read_jsonl(out_path)
    assert [r["id"] for r in res] == ids                                   # input order, not length order
    for r in res:         # lexicon words only (a two-step model is no good: the grammar's penalty comes too late)
        assert set(r["hyp"].split()) <= DIGITS and [w["word"] for w in r["words"]] == r["hyp"].split()
        times = [t for w in r["words"] for t in (w["start"], w["end"])]
        assert times == sorted(times) and all(0 <= t <= r["duration"] + 1e-6 for t in times)
    assert "WER" in out and "RTF" in out and os.path.exists(tmp_path / "lex.errors.txt") == ("worst" in out)
    rc, out, _ = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                        "--method", "greedy")
    assert rc == 0 and "method: greedy (CTC best path)" in out
    assert [r["id"] for r in read_jsonl(out_path)] == ids


def test_beam_nbest_and_lm_beam(run, tmp_path, capsys):
    workdir, manifest, ids = run
    out_path = tmp_path / "beam.jsonl"
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                          "--method", "beam", "--beam", "4", "--nbest", "3", "--hotwords", "ONE,TWO")
    assert rc == 0, err
    res = read_jsonl(out_path)
    assert [r["id"] for r in res] == ids
    for r in res:
        scores = [h["score"] for h in r.get("nbest", [{"score": r["score"]}])]
        assert scores == sorted(scores, reverse=True) and len(scores) <= 3
        assert r["nbest"][0]["text"] == r["hyp"] if "nbest" in r else True
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                          "--method", "beam", "--lm", os.path.join(ROOT, "configs", "fsdd_grammar.arpa"),
                          "--lexicon", "", "--lm-weight", "2.0")
    assert rc == 0, err
    assert "10 lexicon words, word 2-gram LM fsdd_grammar.arpa x 2" in out   # the LM's words spell its words


def test_graph_method(run, tmp_path, capsys):
    workdir, manifest, ids = run
    out_path = tmp_path / "graph.jsonl"
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                          "--method", "graph")                 # the config's lexicon and grammar
    assert rc == 0, err
    assert "graph (HLG of 10 lexicon words and fsdd_grammar.arpa" in out
    res = read_jsonl(out_path)
    assert [r["id"] for r in res] == ids
    for r in res:             # HLG holds the grammar: one digit word (or nothing where no path survives)
        assert r["hyp"] in DIGITS | {""} and [w["word"] for w in r["words"]] == r["hyp"].split()
        assert all(0 <= w["start"] < w["end"] <= r["duration"] + 1e-6 for w in r["words"])


def test_formats_files_in_order_and_an_unreadable_file(run, tmp_path, capsys):
    workdir, manifest, ids = run
    rows = read_jsonl(manifest)
    files = [r["audio"] for r in rows[:4]][::-1]
    broken = tmp_path / "broken.wav"
    shutil.copy(files[0], broken)
    with open(broken, "r+b") as f:
        f.truncate(30)                                          # not even a whole header
    args = ("--workdir", workdir, *files, str(broken))
    want = [os.path.splitext(os.path.basename(p))[0] for p in files]

    rc, out, err = decode(capsys, *args, "--output", tmp_path / "out.txt")
    assert rc == 0, err
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == want + ["broken"]
    assert "failed: broken" in out

    rc, out, err = decode(capsys, *args, "--output", tmp_path / "out.ctm")
    assert rc == 0, err
    ctm = [line.split() for line in (tmp_path / "out.ctm").read_text().splitlines()]
    assert [c[0] for c in ctm] == sorted([c[0] for c in ctm], key=want.index)    # digit words, files in order
    assert set(c[0] for c in ctm) == set(want)
    for uid, ch, start, dur, word in ctm:
        assert ch == "1" and float(start) >= 0 and float(dur) >= 0 and word in DIGITS

    def seconds(stamp):
        h, m, s = stamp.replace(",", ".").split(":")
        return 3600 * int(h) + 60 * int(m) + float(s)

    for fmt in ("srt", "vtt"):
        rc, out, err = decode(capsys, *args, "--output", tmp_path / fmt, "--format", fmt)
        assert rc == 0, err
        for uid in want:
            text = (tmp_path / fmt / f"{uid}.{fmt}").read_text()
            assert text.startswith("WEBVTT") == (fmt == "vtt")
            stamps = re.findall(r"(\d\d:\d\d:\d\d[.,]\d{3}) --> (\d\d:\d\d:\d\d[.,]\d{3})", text)
            assert stamps and ("," in stamps[0][0]) == (fmt == "srt")
            times = [seconds(t) for pair in stamps for t in pair]
            assert times == sorted(times)
    rc, out, err = decode(capsys, "--workdir", workdir, files[0], "--output", tmp_path / "one.srt")
    assert rc == 0 and (tmp_path / "one.srt").read_text().startswith("1\n00:00:0")


@pytest.mark.parametrize("args, match", [
    (("--method", "viterbi"), "invalid choice: 'viterbi'"),
    (("--beam", "0"), "decode setting 'beam' must be >= 1"),
    (("--beam", "2", "--nbest", "3"), "decode setting 'nbest' must be in [1, beam=2]"),
    (("--lm", "missing.arpa"), "decode setting 'lm': 'missing.arpa' does not exist"),
    (("--method", "lexicon", "--lexicon", ""), "decode setting 'lexicon' is needed by method 'lexicon'"),
    (("--format", "ctm", "--method", "greedy", "--beam", "x"), "invalid int value: 'x'"),
])
def test_bad_flags_are_exit_2(run, capsys, args, match):
    workdir, manifest, _ = run
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, *args)
    assert rc == 2 and match in err and err.startswith("decode.py: error:") and len(err.strip().splitlines()) == 1
    rc, _, err = decode(capsys, "--manifest", manifest)
    assert rc == 2 and "--workdir" in err


# ------------------------------------------------------------------------------------------------------------
# --hf-model: transformers directories decoded as they are

LJ = os.path.join(ROOT, "..", "shared", "data", "ljspeech_sample")
W2V_TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                conv_dim=(16, 16, 16, 16), conv_stride=(5, 4, 4, 4), conv_kernel=(10, 4, 4, 4),
                num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, do_stable_layer_norm=False,
                mask_time_prob=0.0, layerdrop=0.0)


def _lj_files():
    with open(os.path.join(LJ, "manifest.jsonl")) as f:
        recs = {json.loads(line)["id"]: json.loads(line) for line in f}
    return [os.path.abspath(os.path.join(LJ, recs[i]["audio"])) for i in ("LJ001-0008", "LJ001-0002")]


def test_hf_wav2vec2_ctc_directory(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, **{c: 5 + i for i, c in enumerate("ETAONIHS")}}
    torch.manual_seed(0)
    hf = transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(vocab_size=len(vocab), pad_token_id=0,
                                                                 **W2V_TINY)).eval()
    with torch.no_grad():                        # favour "E" and the delimiter over the blank: a non-empty text
        hf.lm_head.bias.copy_(torch.tensor([0.0, -9, -9, -9, 1.5, 2.0] + [-9.0] * 7))
    d = tmp_path / "w2v"
    hf.save_pretrained(str(d))
    (d / "vocab.json").write_text(json.dumps(vocab))
    files = _lj_files()
    rc, out, err = decode(capsys, "--hf-model", d, *files, "--method", "beam", "--beam", "4", "--output",
                          tmp_path / "w2v.jsonl")
    assert rc == 0, err
    res = read_jsonl(tmp_path / "w2v.jsonl")
    assert [r["id"] for r in res] == ["LJ001-0008", "LJ001-0002"] and all(set(r["hyp"]) <= set("E ") for r in res)
    assert any(r["hyp"] for r in res) and "wav2vec2_ctc model" in out
    # greedy equals transformers' argmax path on the same (normalised) waveform
    rc, out, err = decode(capsys, "--hf-model", d, files[1], "--method", "greedy", "--output", tmp_path / "g.jsonl")
    assert rc == 0, err
    wav = load_audio(files[1], 16000)
    wav = (wav - wav.mean()) / np.sqrt(wav.var() + 1e-7)
    with torch.no_grad():
        best = hf(torch.from_numpy(wav[None].astype(np.float32))).logits[0].argmax(-1).numpy()
    keep = (best != 0) & (best != np.concatenate([[-1], best[:-1]]))
    chars = {i: (" " if t == "|" else t) for t, i in vocab.items()}
    want = " ".join("".join(chars[i] for i in best[keep] if i > 4 or i == 4).split())
    assert read_jsonl(tmp_path / "g.jsonl")[0]["hyp"] == want
    rc, _, err = decode(capsys, "--hf-model", d, "--split", "dev")
    assert rc == 2 and "--split" in err


def test_hf_whisper_directory(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    c = transformers.WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=32, encoder_layers=1,
                                   encoder_attention_heads=4, encoder_ffn_dim=64, decoder_layers=1,
                                   decoder_attention_heads=4, decoder_ffn_dim=64, max_source_positions=1500,
                                   max_target_positions=24, pad_token_id=50257, bos_token_id=50257,
                                   eos_token_id=50257, decoder_start_token_id=50258)
    d = tmp_path / "whisper"
    transformers.WhisperForConditionalGeneration(c).eval().save_pretrained(str(d))
    rc, out, err = decode(capsys, "--hf-model", d, *_lj_files()[:1], "--method", "beam", "--beam", "2",
                          "--output", tmp_path / "w.txt")
    assert rc == 0 and "attention beam search, beam 2" in out, err     # Task.beam_decode, the KV-cache search
    assert "whisper model" in out and (tmp_path / "w.txt").read_text().startswith("LJ001-0008\t")
    rc, _, err = decode(capsys, "--hf-model", d, *_lj_files()[:1], "--method", "lexicon", "--lexicon",
                        os.path.join(ROOT, "configs", "fsdd_lexicon.txt"))
    assert rc == 2 and "needs a CTC model" in err


# ------------------------------------------------------------------------------------------------------------
# graph decoding methods (icefall's): one best, n-best, n-best / whole-lattice LM rescoring

def test_graph_decoding_methods(run, tmp_path, capsys):
    workdir, manifest, ids = run
    grammar = os.path.join(ROOT, "configs", "fsdd_grammar.arpa")

    def graph(name, *args):
        path = tmp_path / f"{name}.jsonl"
        rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", path,
                              "--method", "graph", *args)
        assert rc == 0, err
        res = read_jsonl(path)
        assert [r["id"] for r in res] == ids
        return out, res

    out, best = graph("one_best", "--graph-decoding", "one_best", "--lm-scales", "1.0,0.5")
    assert "lm_scale" not in out and not any("rescored" in r for r in best)      # scales are for rescoring only
    # the whole lattice rescored with the graph's own LM at the graph's scale (the config's lm_weight 1.0): the
    # same best paths
    out, whole = graph("whole", "--graph-decoding", "whole_lattice_rescoring", "--rescore-lm", grammar)
    assert "whole lattice rescored by fsdd_grammar.arpa at lm scale 1.0" in out
    assert [r["hyp"] for r in whole] == [r["hyp"] for r in best]
    assert [r["score"] for r in whole] == pytest.approx([r["score"] for r in best], rel=1e-5, abs=1e-4)
    # n-best with many sampled paths finds the best path's words; its list is sorted, the transcript first
    out, nb = graph("nbest", "--graph-decoding", "nbest", "--num-paths", "200", "--nbest", "3")
    assert "n-best of 200 sampled paths" in out
    assert [r["hyp"] for r in nb] == [r["hyp"] for r in best]
    for r in nb:
        scores = [h["score"] for h in r.get("nbest", [{"score": r["score"]}])]
        assert scores == sorted(scores, reverse=True) and len(scores) <= 3
        assert "nbest" not in r or (r["nbest"][0]["text"] == r["hyp"] and len({h["text"] for h in r["nbest"]}) ==
                                    len(r["nbest"]))
    # n-best rescoring with the graph's LM at the graph's scale keeps the n-best's choice; two scales, two WERs
    out, res = graph("rescore", "--graph-decoding", "nbest_rescoring", "--num-paths", "200", "--lm-scales",
                     "1.0,0.3")
    assert "lm_scale_1.0: WER" in out and "lm_scale_0.3: WER" in out
    assert [r["hyp"] for r in res] == [r["hyp"] for r in nb]
    assert all(r["rescored"]["lm_scale_1.0"]["text"] == r["hyp"] for r in res)
    # attention-decoder rescoring needs an attention decoder
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--method", "graph",
                          "--graph-decoding", "attention_rescoring")
    assert rc == 2 and "needs an attention decoder" in err
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--method", "graph",
                          "--lm-scales", "1,x")
    assert rc == 2 and "comma-separated numbers" in err


def test_manifest_order_with_unreadable_entries(run, tmp_path, capsys):
    """Unreadable entries (one without a duration, whose header cannot be read; one whose audio is truncated) come
    back at their place in the manifest, with their reason, and count in WER as all deletions."""
    workdir, manifest, _ = run
    rows = read_jsonl(manifest)[:3]
    broken = tmp_path / "broken.wav"
    shutil.copy(rows[0]["audio"], broken)
    with open(broken, "r+b") as f:
        f.truncate(30)
    no_header = {"id": "no_header", "audio": str(broken), "text": "ONE TWO"}              # no duration
    truncated = {"id": "truncated", "audio": str(broken), "text": "THREE", "duration": 0.5}
    entries = [rows[0], no_header, rows[1], truncated, rows[2]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in entries))
    out_path = tmp_path / "mixed_out.jsonl"
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", path, "--output", out_path,
                          "--method", "greedy")
    assert rc == 0, err
    res = read_jsonl(out_path)
    assert [r["id"] for r in res] == [r["id"] for r in entries]
    for r, e in zip(res, entries):
        assert r["ref"] == e["text"] and ("error" in r) == (e["id"] in ("no_header", "truncated"))
    assert "failed: no_header" in out and "failed: truncated" in out and "2 files could not be read" in out
    # jiwer over every entry, an empty hypothesis for the unreadable ones ("<none>" stands in for an empty one:
    # against n reference words it costs n errors, as n deletions do)
    wer = 100 * jiwer.wer([r["ref"] for r in res], [r.get("hyp") or "<none>" for r in res])
    assert f"WER {wer:.2f}%" in out


def test_long_file_decodes_in_windows(run, tmp_path, capsys):
    """A file longer than --long-file-seconds runs through jasr.long_audio's windows; with context covering the
    whole file every window sees all of it, so greedy and lexicon decoding give the whole-file texts."""
    workdir, manifest, ids = run
    rows = read_jsonl(manifest)
    wave = np.concatenate([load_audio(r["audio"], 8000) for r in rows])          # ~12 s of digits
    path = tmp_path / "long.wav"
    sf.write(str(path), wave, 8000)
    for method in ("greedy", "lexicon"):
        whole, windows = tmp_path / f"whole_{method}.jsonl", tmp_path / f"windows_{method}.jsonl"
        rc, out, err = decode(capsys, "--workdir", workdir, path, "--method", method, "--output", whole)
        assert rc == 0, err
        rc, out, err = decode(capsys, "--workdir", workdir, path, "--method", method, "--output", windows,
                              "--long-file-seconds", "5", "--chunk-seconds", "2", "--context-seconds", "30")
        assert rc == 0, err
        a, b = read_jsonl(whole)[0], read_jsonl(windows)[0]
        assert a["hyp"] == b["hyp"] and a["tokens"] == b["tokens"], (method, a["hyp"], b["hyp"])
        assert b["duration"] == pytest.approx(len(wave) / 8000, abs=1e-3)
    rc, out, err = decode(capsys, "--workdir", workdir, path, "--method", "greedy", "--output", windows,
                          "--long-file-seconds", "5", "--chunk-seconds", "1", "--context-seconds", "0.5")
    assert rc == 0, err
    assert len(read_jsonl(windows)) == 1                            # short context: runs, the text may differ
    rc, out, err = decode(capsys, "--workdir", workdir, path, "--chunk-seconds", "0")
    assert rc == 2 and "chunk_seconds' must be > 0" in err


def test_lm_lookahead_flag(run, tmp_path, capsys):
    workdir, manifest, ids = run
    out_path = tmp_path / "la.jsonl"
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                          "--method", "lexicon", "--lm-lookahead")
    assert rc == 0, err
    assert "LM look-ahead" in out
    assert [r["id"] for r in read_jsonl(out_path)] == ids
    rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--method", "beam", "--lexicon", "",
                          "--lm-lookahead")
    assert rc == 2 and "lm_lookahead' needs a word LM" in err


def test_no_ema_flag_on_a_run_without_ema(run, tmp_path, capsys):
    """--no-ema asks load_run for the raw parameters; a run without an EMA has only those: same transcripts."""
    workdir, manifest, ids = run
    outs = []
    for extra in ((), ("--no-ema",)):
        out_path = tmp_path / f"g{len(extra)}.jsonl"
        rc, out, err = decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path,
                              "--method", "greedy", *extra)
        assert rc == 0, err
        outs.append([r["hyp"] for r in read_jsonl(out_path)])
    assert outs[0] == outs[1] and len(outs[0]) == len(ids)
