"""Tokenizers against their references: sentencepiece itself, openai-whisper's tokenizer."""
import json
import os

import numpy as np
import pytest
import sentencepiece as spm
from hypothesis import given, settings, strategies as st

from jasr.tokenizers import (CharTokenizer, SentencePieceTokenizer, TokenizerError, WhisperTokenizer,
                             load_tokenizer)

DATA = "/work/shared/data"


def _texts(name, key="text"):
    with open(os.path.join(DATA, name, "manifest.jsonl")) as f:
        return [json.loads(line).get(key) or json.loads(line)["text"] for line in f]


SENTENCES = _texts("ljspeech_sample") + _texts("librivox_sense_sensibility")
ORIGINALS = _texts("ljspeech_sample", "text_original") + _texts("librivox_sense_sensibility", "text_original")
DIGITS = sorted(set(_texts("fsdd")))


# ------------------------------------------------------------------------------------------ characters

def test_char_tokenizer_vocab_and_roundtrip(tmp_path):
    tok = CharTokenizer.from_texts(SENTENCES + DIGITS)
    chars = sorted(set("".join(SENTENCES + DIGITS)) | {" "})
    assert tok.vocab_size == len(chars) + 1 and tok.blank_id == 0 and tok.tokens[0] == "<blk>"
    assert " " in CharTokenizer.from_texts(DIGITS).chars   # space is always a token
    for t in SENTENCES:
        ids = tok.encode(t)
        assert 0 not in ids and len(ids) == len(t)
        assert [tok.tokens[i] for i in ids] == list(t)
        assert tok.decode(ids) == t
    assert tok.decode([0] + tok.encode("ZERO") + [0]) == "ZERO"
    p = tmp_path / "chars.json"
    tok.save(p)
    again = load_tokenizer(p)
    assert isinstance(again, CharTokenizer) and again.chars == tok.chars
    assert again.encode(SENTENCES[0]) == tok.encode(SENTENCES[0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(sorted(set("".join(SENTENCES)))), min_size=1, max_size=60))
def test_char_roundtrip_property(chars):
    tok = CharTokenizer.from_texts(SENTENCES)
    text = " ".join("".join(chars).split())
    ids = tok.encode(text)
    assert tok.decode(ids) == text and all(1 <= i < tok.vocab_size for i in ids)


def test_char_errors_and_case(tmp_path):
    tok = CharTokenizer.from_texts(DIGITS)
    with pytest.raises(TokenizerError, match=r"\['Q'\].*'QUIZ'"):
        tok.encode("QUIZ")
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([tok.vocab_size])
    lower = CharTokenizer.from_texts(DIGITS, case="lower")
    assert lower.decode(lower.encode("Zero  ONE")) == "zero one"
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "char"')
    with pytest.raises(TokenizerError, match="bad.json"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "missing.model")


# ------------------------------------------------------------------------------------------ sentencepiece

@pytest.fixture(scope="module")
def sp_tok():
    return SentencePieceTokenizer.train(SENTENCES, vocab_size=80)


def test_sentencepiece_ids_are_sentencepieces_own(sp_tok, tmp_path):
    p = tmp_path / "bpe.model"
    sp_tok.save(p)
    ref = spm.SentencePieceProcessor(model_file=str(p))
    assert ref.id_to_piece(0) == "<blk>" and ref.get_piece_size() == 80 == sp_tok.vocab_size
    assert ref.unk_id() == 1 and ref.bos_id() == -1 and ref.eos_id() == -1
    for t in SENTENCES:
        ids = sp_tok.encode(t)
        assert ids == ref.encode(t, out_type=int)
        assert 0 not in ids and sp_tok.decode(ids) == t
    assert isinstance(load_tokenizer(p), SentencePieceTokenizer)
    assert load_tokenizer(p).encode(SENTENCES[2]) == sp_tok.encode(SENTENCES[2])


def test_sentencepiece_is_bpe_and_deterministic(sp_tok):
    again = SentencePieceTokenizer.train(SENTENCES, vocab_size=80)
    assert [sp_tok.id_to_piece(i) for i in range(80)] == [again.id_to_piece(i) for i in range(80)]
    # BPE merges make some multi-character pieces
    assert any(len(sp_tok.id_to_piece(i).lstrip("\u2581")) > 1 for i in range(2, 80))
    assert sum(len(sp_tok.encode(t)) for t in SENTENCES) < sum(len(t) for t in SENTENCES)


def test_sentencepiece_unknown_chars_and_foreign_model(sp_tok, tmp_path):
    with pytest.raises(TokenizerError, match=r"'7'"):
        sp_tok.encode("HELLO 7")
    # a model trained without the blank slot (unk at 0) is shifted by one
    prefix = tmp_path / "foreign"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_prefix=str(prefix), vocab_size=60,
                                   model_type="bpe", character_coverage=1.0, num_threads=1, minloglevel=2)
    ref = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    tok = load_tokenizer(str(prefix) + ".model")
    assert tok.offset == 1 and tok.vocab_size == 61
    t = SENTENCES[0]
    assert tok.encode(t) == [i + 1 for i in ref.encode(t, out_type=int)]
    assert tok.decode(tok.encode(t)) == t


def test_sentencepiece_from_manifest(tmp_path):
    tok = SentencePieceTokenizer.train_from_manifest(os.path.join(DATA, "ljspeech_sample", "manifest.jsonl"), 60)
    t = _texts("ljspeech_sample")[3]
    assert tok.decode(tok.encode(t)) == t
    with pytest.raises(TokenizerError, match="no non-empty"):
        SentencePieceTokenizer.train(["", "  "], 10)


# ------------------------------------------------------------------------------------------ whisper

@pytest.fixture(scope="module")
def whisper_ref():
    import whisper.tokenizer
    return whisper.tokenizer


@pytest.mark.parametrize("multilingual,num_languages", [(True, 99), (True, 100), (False, 99)])
def test_whisper_matches_openai_whisper(whisper_ref, multilingual, num_languages):
    ours = WhisperTokenizer(multilingual, num_languages=num_languages)
    ref = whisper_ref.get_tokenizer(multilingual, num_languages=num_languages)
    assert ours.vocab_size == ref.encoding.n_vocab
    assert ours.special_tokens == ref.special_tokens
    for name in ("eot", "sot", "transcribe", "translate", "sot_lm", "sot_prev", "no_speech", "no_timestamps",
                 "timestamp_begin"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert ours.sot_sequence == ref.sot_sequence
    assert ours.sot_sequence_including_notimestamps == ref.sot_sequence_including_notimestamps
    for t in SENTENCES + ORIGINALS + [" " + o for o in ORIGINALS]:
        ids = ours.encode(t)
        assert ids == ref.encode(t)
        assert ours.decode(ids) == ref.decode(ids) == t
    with_ts = [ours.sot, ours.timestamp_begin] + ours.encode(" hello") + [ours.timestamp_begin + 25, ours.eot]
    assert ours.decode(with_ts) == ref.decode(with_ts)
    assert ours.decode_with_timestamps(with_ts) == ref.decode_with_timestamps(with_ts)


@pytest.mark.parametrize("language,task", [("fr", "translate"), ("yue", "transcribe"), ("ja", None)])
def test_whisper_language_tasks(whisper_ref, language, task):
    ours = WhisperTokenizer(True, num_languages=100, language=language, task=task)
    ref = whisper_ref.get_tokenizer(True, num_languages=100, language=language, task=task)
    assert ours.sot_sequence == ref.sot_sequence
    assert ours.language_token(language) == ref.to_language_token(language)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_whisper_ids_property(text):
    import whisper.tokenizer
    ref = whisper.tokenizer.get_tokenizer(True)
    ours = _cached_whisper()
    assert ours.encode(text) == ref.encode(text)


_CACHE = {}


def _cached_whisper():
    if "w" not in _CACHE:
        _CACHE["w"] = WhisperTokenizer(True)
    return _CACHE["w"]


def test_whisper_save_load_and_training_labels(tmp_path):
    tok = WhisperTokenizer(True, language="en")
    inp, tgt = tok.training_labels("HELLO WORLD")
    assert inp[:4] == [tok.sot, tok.language_token("en"), tok.transcribe, tok.no_timestamps]
    assert tgt[-1] == tok.eot and inp[1:] == tgt[:-1] and tok.decode(inp[4:]) == " HELLO WORLD"
    p = tmp_path / "whisper.json"
    tok.save(p)
    again = load_tokenizer(p)
    assert isinstance(again, WhisperTokenizer) and again.sot_sequence == tok.sot_sequence
    assert load_tokenizer("whisper:gpt2").vocab_size == 51864
    assert load_tokenizer("whisper:multilingual:100").vocab_size == 51866
    with pytest.raises(TokenizerError, match="language"):
        WhisperTokenizer(True, language="xx")


def test_tokenizers_pickle():
    import pickle
    for tok in (CharTokenizer.from_texts(DIGITS), SentencePieceTokenizer.train(SENTENCES, 50), _cached_whisper()):
        again = pickle.loads(pickle.dumps(tok))
        assert again.encode(SENTENCES[1]) == tok.encode(SENTENCES[1]) if not isinstance(tok, CharTokenizer) \
            else again.encode("ZERO ONE") == tok.encode("ZERO ONE")
