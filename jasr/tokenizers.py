"""Text tokenizers: characters, SentencePiece BPE, Whisper's byte-level BPE (tiktoken).

Common interface: `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`, `save(path)`; CTC tokenizers
(CharTokenizer, SentencePieceTokenizer) reserve id 0 (`blank_id`) for the CTC blank and never emit it.
`load_tokenizer(path)` picks the class from the file. Text is whitespace-normalised (strip, single spaces).
"""
from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
from typing import Iterable, Sequence

import sentencepiece as spm
import tiktoken

from jasr.manifests import read_manifest

__all__ = ["TokenizerError", "CharTokenizer", "SentencePieceTokenizer", "WhisperTokenizer", "load_tokenizer",
           "normalize_whitespace", "WHISPER_LANGUAGES"]


class TokenizerError(ValueError):
    """Text the tokenizer cannot represent (characters outside its vocabulary), or a bad tokenizer file."""


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


def _check_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    out = [int(i) for i in ids]
    bad = [i for i in out if not 0 <= i < vocab_size]
    if bad:
        raise TokenizerError(f"token ids {bad[:5]} out of range [0, {vocab_size})")
    return out


class CharTokenizer:
    """One token per character; id 0 is the CTC blank `<blk>`, space is an ordinary token.

    `case`: None keeps text as is, "upper"/"lower" maps it before encoding.
    """
    type_name = "char"
    blank_id = 0
    blank_token = "<blk>"

    def __init__(self, chars: Sequence[str], *, case: str | None = None):
        chars = list(chars)
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise TokenizerError("CharTokenizer needs distinct single characters")
        if case not in (None, "upper", "lower"):
            raise TokenizerError(f"case must be None, 'upper' or 'lower', got {case!r}")
        self.case = case
        self.chars = chars
        self._index = {c: i + 1 for i, c in enumerate(chars)}

    @classmethod
    def from_texts(cls, texts: Iterable[str], *, case: str | None = None) -> "CharTokenizer":
        """Vocabulary = space + sorted set of characters in `texts` (after case mapping, whitespace normalisation)."""
        seen = set()
        for t in texts:
            seen.update(_apply_case(normalize_whitespace(t), case))
        if not seen:
            raise TokenizerError("no characters in the texts to build a CharTokenizer from")
        return cls(sorted(seen | {" "}), case=case)

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    @property
    def tokens(self) -> list[str]:
        return [self.blank_token] + self.chars

    def encode(self, text: str) -> list[int]:
        t = _apply_case(normalize_whitespace(text), self.case)
        try:
            return [self._index[c] for c in t]
        except KeyError:
            bad = sorted({c for c in t if c not in self._index})
            raise TokenizerError(f"characters {bad!r} of transcript {text!r} are not in the tokenizer's "
                                 f"vocabulary") from None

    def decode(self, ids: Sequence[int]) -> str:
        """ids -> text; blank (0) is skipped."""
        return "".join(self.chars[i - 1] for i in _check_ids(ids, self.vocab_size) if i != self.blank_id)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"type": self.type_name, "chars": self.chars, "case": self.case}, f, ensure_ascii=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CharTokenizer":
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot read tokenizer file {os.fspath(path)}: {e}") from e
        if d.get("type") != cls.type_name or not isinstance(d.get("chars"), list):
            raise TokenizerError(f"{os.fspath(path)} is not a CharTokenizer file")
        return cls(d["chars"], case=d.get("case"))

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size}, case={self.case!r})"


def _apply_case(text: str, case: str | None) -> str:
    return text.upper() if case == "upper" else text.lower() if case == "lower" else text


class SentencePieceTokenizer:
    """SentencePiece (BPE or unigram) with id 0 reserved for the CTC blank.

    Models trained by `train` put a `<blk>` piece at id 0 (sentencepiece's pad slot), so ids are the model's own.
    A foreign model without it is shifted by one (`offset = 1`).
    """
    type_name = "sentencepiece"
    blank_id = 0

    def __init__(self, model_proto: bytes, *, case: str | None = None):
        self._proto = bytes(model_proto)
        self.case = case
        self.sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.offset = 0 if self.sp.id_to_piece(0) == "<blk>" else 1
        self.unk_id = self.sp.unk_id()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, model_type: str = "bpe", case: str | None = None,
              character_coverage: float = 1.0, seed_sentencepiece_size: int = 1_000_000,
              user_defined_symbols: Sequence[str] = ()) -> "SentencePieceTokenizer":
        """Trains on `texts`. vocab_size counts blank and unk. Deterministic for given texts (single thread)."""
        texts = [_apply_case(normalize_whitespace(t), case) for t in texts]
        texts = [t for t in texts if t]
        if not texts:
            raise TokenizerError("no non-empty texts to train SentencePiece on")
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage, pad_id=0, pad_piece="<blk>", unk_id=1, bos_id=-1,
                eos_id=-1, num_threads=1, seed_sentencepiece_size=seed_sentencepiece_size,
                user_defined_symbols=list(user_defined_symbols), minloglevel=2, hard_vocab_limit=True)
        except RuntimeError as e:
            raise TokenizerError(f"SentencePiece training failed: {e}") from e
        return cls(buf.getvalue(), case=case)

    @classmethod
    def train_from_manifest(cls, manifest_path: str | os.PathLike, vocab_size: int, **kwargs):
        """Trains on the `text` fields of a JSONL manifest (see jasr.manifests.read_manifest)."""
        return cls.train([u.text for u in read_manifest(manifest_path, check_audio=False)], vocab_size, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size() + self.offset

    def encode(self, text: str) -> list[int]:
        t = _apply_case(normalize_whitespace(text), self.case)
        ids = self.sp.encode(t, out_type=int)
        if self.unk_id >= 0 and self.unk_id in ids:
            pieces = self.sp.encode(t, out_type=str)
            bad = sorted({c for c in t if c != " " and self.sp.piece_to_id(c) == self.unk_id
                          and self.sp.encode(c, out_type=int).count(self.unk_id)})
            raise TokenizerError(f"characters {bad or pieces!r} of transcript {text!r} are not in the "
                                 f"SentencePiece vocabulary")
        return [i + self.offset for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        ids = [i - self.offset for i in _check_ids(ids, self.vocab_size) if i != self.blank_id]
        return self.sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        return "<blk>" if (self.offset and i == 0) else self.sp.id_to_piece(i - self.offset)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the sentencepiece .model (the case mapping goes to a `.json` sidecar when set)."""
        with open(path, "wb") as f:
            f.write(self._proto)
        if self.case is not None:
            with open(os.fspath(path) + ".json", "w") as f:
                json.dump({"type": self.type_name, "case": self.case}, f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SentencePieceTokenizer":
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                proto = f.read()
            case = None
            if os.path.exists(path + ".json"):
                with open(path + ".json") as f:
                    case = json.load(f).get("case")
            return cls(proto, case=case)
        except (OSError, RuntimeError, ValueError) as e:
            raise TokenizerError(f"cannot load SentencePiece model {path}: {e}") from e

    def __getstate__(self):
        return {"proto": self._proto, "case": self.case}

    def __setstate__(self, state):
        self.__init__(state["proto"], case=state["case"])

    def __repr__(self):
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, offset={self.offset})"


WHISPER_LANGUAGES = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
    "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
    "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
    "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
    "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue")
_WHISPER_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _whisper_asset(name: str) -> str:
    spec = importlib.util.find_spec("whisper")   # locates openai-whisper without importing it (and torch)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(f"openai-whisper's {name}.tiktoken not found: install openai-whisper or pass vocab_path")
    path = os.path.join(list(spec.submodule_search_locations)[0], "assets", f"{name}.tiktoken")
    if not os.path.isfile(path):
        raise TokenizerError(f"Whisper vocabulary file missing: {path}")
    return path


class WhisperTokenizer:
    """Whisper's byte-level BPE with its special tokens, ids identical to openai-whisper's tokenizer.

    multilingual=True uses `multilingual.tiktoken` (num_languages 99, or 100 for large-v3), else `gpt2.tiktoken`.
    `vocab_path` overrides where the .tiktoken file is read from.
    """
    type_name = "whisper"

    def __init__(self, multilingual: bool = True, *, num_languages: int = 99, language: str | None = None,
                 task: str | None = None, vocab_path: str | None = None):
        name = "multilingual" if multilingual else "gpt2"
        self.vocab_path = vocab_path or _whisper_asset(name)
        self.multilingual, self.num_languages = multilingual, num_languages
        if not 0 < num_languages <= len(WHISPER_LANGUAGES):
            raise TokenizerError(f"num_languages must be in 1..{len(WHISPER_LANGUAGES)}, got {num_languages}")
        try:
            with open(self.vocab_path) as f:
                ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line)}
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot read tiktoken vocabulary {self.vocab_path}: {e}") from e
        self.languages = WHISPER_LANGUAGES[:num_languages]
        specials = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{lang}|>" for lang in self.languages],
                    "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                    "<|notimestamps|>", *[f"<|{i * 0.02:.2f}|>" for i in range(1501)]]
        n = len(ranks)
        self.special_tokens = {tok: n + i for i, tok in enumerate(specials)}
        self.encoding = tiktoken.Encoding(name=os.path.basename(self.vocab_path),
                                          explicit_n_vocab=n + len(specials), pat_str=_WHISPER_PAT,
                                          mergeable_ranks=ranks, special_tokens=self.special_tokens)
        if multilingual:
            language, task = (language or "en"), (task or "transcribe")
        else:
            language = task = None
        if language is not None and language not in self.languages:
            raise TokenizerError(f"unsupported Whisper language {language!r}")
        if task not in (None, "transcribe", "translate"):
            raise TokenizerError(f"task must be 'transcribe' or 'translate', got {task!r}")
        self.language, self.task = language, task
        st = self.special_tokens
        self.eot, self.sot = st["<|endoftext|>"], st["<|startoftranscript|>"]
        self.translate, self.transcribe = st["<|translate|>"], st["<|transcribe|>"]
        self.sot_lm, self.sot_prev = st["<|startoflm|>"], st["<|startofprev|>"]
        self.no_speech, self.no_timestamps = st["<|nospeech|>"], st["<|notimestamps|>"]
        self.timestamp_begin = st["<|0.00|>"]

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def language_token(self, language: str) -> int:
        tok = self.special_tokens.get(f"<|{language}|>")
        if tok is None:
            raise TokenizerError(f"language {language!r} not in this Whisper tokenizer")
        return tok

    @property
    def sot_sequence(self) -> tuple[int, ...]:
        """<|startoftranscript|> [<|lang|>] [<|transcribe|> or <|translate|>]."""
        seq = [self.sot]
        if self.language is not None:
            seq.append(self.language_token(self.language))
        if self.task is not None:
            seq.append(self.transcribe if self.task == "transcribe" else self.translate)
        return tuple(seq)

    @property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return self.sot_sequence + (self.no_timestamps,)

    def encode(self, text: str, **kwargs) -> list[int]:
        """Plain text -> BPE ids (special-token text is refused, as tiktoken's default)."""
        return self.encoding.encode(text, **kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        """ids -> text; timestamp tokens are dropped (as openai-whisper's decode)."""
        return self.encoding.decode([int(t) for t in ids if t < self.timestamp_begin])

    def decode_with_timestamps(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(t) for t in ids])

    def training_labels(self, text: str, *, timestamps: bool = False) -> tuple[list[int], list[int]]:
        """Teacher-forcing pair for the decoder: (inputs, targets) = (sot_seq + text, text + eot), no timestamps."""
        prefix = list(self.sot_sequence if timestamps else self.sot_sequence_including_notimestamps)
        body = self.encode(" " + normalize_whitespace(text))
        return prefix + body, prefix[1:] + body + [self.eot]

    def save(self, path: str | os.PathLike) -> None:
        """JSON description (the vocabulary itself stays in the .tiktoken file)."""
        with open(path, "w") as f:
            json.dump({"type": self.type_name, "multilingual": self.multilingual,
                       "num_languages": self.num_languages, "language": self.language, "task": self.task,
                       "vocab_path": os.path.abspath(self.vocab_path)}, f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WhisperTokenizer":
        with open(path) as f:
            d = json.load(f)
        vp = d.get("vocab_path")
        return cls(d["multilingual"], num_languages=d["num_languages"], language=d.get("language"),
                   task=d.get("task"), vocab_path=vp if vp and os.path.isfile(vp) else None)

    def __getstate__(self):
        return {"multilingual": self.multilingual, "num_languages": self.num_languages, "language": self.language,
                "task": self.task, "vocab_path": self.vocab_path}

    def __setstate__(self, state):
        self.__init__(state.pop("multilingual"), **state)

    def __repr__(self):
        return (f"WhisperTokenizer(multilingual={self.multilingual}, num_languages={self.num_languages}, "
                f"language={self.language!r}, task={self.task!r})")


def load_tokenizer(path: str | os.PathLike):
    """Tokenizer from a file: CharTokenizer / WhisperTokenizer JSON, a SentencePiece .model, or a .tiktoken file.

    Also accepts "whisper:multilingual", "whisper:gpt2" and "whisper:multilingual:100" (large-v3).
    """
    p = os.fspath(path)
    if p.startswith("whisper:"):
        parts = p.split(":")
        if len(parts) not in (2, 3) or parts[1] not in ("multilingual", "gpt2"):
            raise TokenizerError(f"bad Whisper tokenizer spec {p!r} (whisper:multilingual[:N] or whisper:gpt2)")
        return WhisperTokenizer(parts[1] == "multilingual", num_languages=int(parts[2]) if len(parts) == 3 else 99)
    if not os.path.isfile(p):
        raise TokenizerError(f"tokenizer file not found: {p}")
    if p.endswith(".tiktoken"):
        return WhisperTokenizer(os.path.basename(p) != "gpt2.tiktoken", vocab_path=p)
    with open(p, "rb") as f:
        head = f.read(1)
    if head == b"{":
        try:
            with open(p, encoding="utf-8") as f:
                kind = json.load(f).get("type")
        except ValueError as e:
            raise TokenizerError(f"tokenizer file {p} is not valid JSON: {e}") from e
        if kind == CharTokenizer.type_name:
            return CharTokenizer.load(p)
        if kind == WhisperTokenizer.type_name:
            return WhisperTokenizer.load(p)
        raise TokenizerError(f"tokenizer file {p}: unknown type {kind!r}")
    return SentencePieceTokenizer.load(p)
