"""The embedded demo corpus: spoken digit strings synthesised offline with eSpeak NG.

Nothing is downloaded. The synthesiser is the shared library bundled in the PyPI wheel ``espeakng-loader``
(GPL-3.0, installed with the optional ``demo`` extra: ``pip install -e .[demo]``); it is loaded at run time
through ctypes and never vendored.

The corpus has three splits written as manifests in the format of ``shared/data`` (one JSON object per line with
``id``, ``audio``, ``text``, ``sample_rate``, ``duration``, ``num_samples``, ``channels``, ``speaker``):

* ``train`` and ``dev``: voices, speaking rates and pitches drawn from the *seen* settings;
* ``heldout``: voices (accent + variant) and rate/pitch values that never occur in ``train``/``dev``, so the
  held-out WER measures generalisation to unseen voice settings rather than memorisation.

Every utterance is a random string of 1..N digit words ("THREE ONE FOUR"), spoken with random rate, pitch,
pitch range, gain, leading/trailing silence and additive noise at a random SNR, resampled to ``sample_rate``.
Texts and voice settings are a function of the seed (eSpeak NG's waveforms can differ by a few samples from call
to call, so audio is not bit-identical between builds). The corpus is written to a temporary folder and renamed
into place, so an interrupted run never leaves a half-written corpus behind.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from typing import Sequence

import numpy as np
import soundfile as sf
import soxr

DIGIT_WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")

# eSpeak NG constants (speak_lib.h).
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH, _PARAM_RANGE = 1, 2, 3, 4
_ESPEAK_RATE = 22050

# Seen (train/dev) and unseen (heldout) voice settings. A voice is "<language>+<variant>".
TRAIN_LANGUAGES = ("en-us", "en", "en-029")
TRAIN_VARIANTS = ("m1", "m2", "m3", "m5", "m7", "f1", "f2", "f4", "klatt", "klatt3", "iven", "steph", "quincy",
                  "robert", "paul", "zac")
HELDOUT_LANGUAGES = ("en-gb-x-rp", "en-us-nyc", "en-gb-scotland")
HELDOUT_VARIANTS = ("m4", "m6", "f3", "f5", "klatt2", "iven2", "steph2", "travis", "max", "rob")
TRAIN_RATES = (130, 150, 170, 190)  # words per minute
HELDOUT_RATES = (140, 160, 180)
TRAIN_PITCHES = (30, 45, 60, 75)  # 0..100
HELDOUT_PITCHES = (38, 52, 68)


class EspeakUnavailable(RuntimeError):
    """Raised when the optional eSpeak NG library (``espeakng-loader``) cannot be loaded."""


class EspeakSynth:
    """A thin ctypes wrapper around libespeak-ng in synchronous retrieval mode (22050 Hz, 16-bit)."""

    _CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise EspeakUnavailable(
                "the demo corpus needs eSpeak NG from the optional 'demo' extra: pip install -e '.[demo]' "
                "(installs espeakng-loader, GPL-3.0, loaded at run time)") from e
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.restype = ctypes.c_int
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise EspeakUnavailable(f"espeak_Initialize failed (returned {rate}); data path "
                                    f"{espeakng_loader.get_data_path()!r}")
        self.sample_rate = rate
        self._lib = lib
        self._chunks: list[np.ndarray] = []

        def _collect(wav, n, _events):
            if n > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0  # continue synthesis

        self._callback = self._CALLBACK(_collect)  # keep a reference: the C side holds a raw pointer
        lib.espeak_SetSynthCallback(self._callback)

    def synth(self, text: str, voice: str, rate: int = 175, pitch: int = 50, pitch_range: int = 50) -> np.ndarray:
        """Speak `text` with `voice` ("en-us+f2"); returns int16 samples at ``self.sample_rate``."""
        if not text.strip():
            raise ValueError("synth: empty text")
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"synth: eSpeak NG has no voice {voice!r}")
        for param, value in ((_PARAM_RATE, rate), (_PARAM_PITCH, pitch), (_PARAM_RANGE, pitch_range),
                             (_PARAM_VOLUME, 100)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._chunks = []
        data = text.encode("utf-8")
        err = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed with code {err} for text {text!r}")
        self._lib.espeak_Synchronize()
        if not self._chunks:
            raise RuntimeError(f"espeak_Synth produced no audio for {text!r} with voice {voice!r}")
        return np.concatenate(self._chunks).astype(np.int16)


_SYNTH: EspeakSynth | None = None


def get_synth() -> EspeakSynth:
    """The process's synthesiser (libespeak-ng keeps global state, so there is one per process)."""
    global _SYNTH
    if _SYNTH is None:
        _SYNTH = EspeakSynth()
    return _SYNTH


@dataclasses.dataclass(frozen=True)
class DemoCorpusConfig:
    num_train: int = 2000
    num_dev: int = 200
    num_heldout: int = 300
    min_words: int = 1
    max_words: int = 4
    sample_rate: int = 16000
    snr_db: tuple[float, float] = (10.0, 40.0)  # additive white/brown noise, uniform in dB
    seed: int = 0

    def validate(self):
        for name in ("num_train", "num_dev", "num_heldout"):
            if getattr(self, name) < 0:
                raise ValueError(f"demo corpus: {name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"demo corpus: need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")
        if self.sample_rate not in (8000, 16000, 22050):
            raise ValueError(f"demo corpus: sample_rate must be 8000, 16000 or 22050, got {self.sample_rate}")
        lo, hi = self.snr_db
        if not lo <= hi:
            raise ValueError(f"demo corpus: snr_db must be (low, high) with low <= high, got {self.snr_db}")

    def fingerprint(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True) + _settings_blob()
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _settings_blob() -> str:
    return json.dumps([TRAIN_LANGUAGES, TRAIN_VARIANTS, HELDOUT_LANGUAGES, HELDOUT_VARIANTS, TRAIN_RATES,
                       HELDOUT_RATES, TRAIN_PITCHES, HELDOUT_PITCHES, DIGIT_WORDS, 3])


def sample_utterance_spec(rng: np.random.Generator, split: str, cfg: DemoCorpusConfig) -> dict:
    """Draws text and voice settings for one utterance of `split` ("train"/"dev" seen, "heldout" unseen)."""
    if split in ("train", "dev"):
        langs, variants, rates, pitches = TRAIN_LANGUAGES, TRAIN_VARIANTS, TRAIN_RATES, TRAIN_PITCHES
    elif split == "heldout":
        langs, variants, rates, pitches = HELDOUT_LANGUAGES, HELDOUT_VARIANTS, HELDOUT_RATES, HELDOUT_PITCHES
    else:
        raise ValueError(f"unknown demo split {split!r}")
    n = int(rng.integers(cfg.min_words, cfg.max_words + 1))
    words = [DIGIT_WORDS[i] for i in rng.integers(0, len(DIGIT_WORDS), size=n)]
    return dict(
        text=" ".join(words),
        voice=f"{langs[rng.integers(len(langs))]}+{variants[rng.integers(len(variants))]}",
        rate=int(rates[rng.integers(len(rates))]) + int(rng.integers(-5, 6)) * (split != "heldout"),
        pitch=int(pitches[rng.integers(len(pitches))]),
        pitch_range=int(rng.integers(30, 80)),
        gain=float(10 ** (rng.uniform(-12, 0) / 20)),
        lead_s=float(rng.uniform(0.02, 0.3)),
        trail_s=float(rng.uniform(0.02, 0.3)),
        snr_db=float(rng.uniform(*cfg.snr_db)),
        brown=bool(rng.random() < 0.5),
    )


def render_utterance(spec: dict, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Synthesises `spec` and applies gain, silence padding and noise; float32 in [-1, 1] at `sample_rate`."""

    synth = get_synth()
    pcm = synth.synth(spec["text"].lower(), spec["voice"], spec["rate"], spec["pitch"], spec["pitch_range"])
    x = pcm.astype(np.float32) / 32768.0
    if synth.sample_rate != sample_rate:
        x = soxr.resample(x, synth.sample_rate, sample_rate).astype(np.float32)
    peak = float(np.max(np.abs(x))) or 1.0
    x = x / peak * 0.9 * spec["gain"]
    x = np.concatenate([np.zeros(int(spec["lead_s"] * sample_rate), np.float32), x,
                        np.zeros(int(spec["trail_s"] * sample_rate), np.float32)])
    noise = rng.standard_normal(x.shape[0]).astype(np.float32)
    if spec["brown"]:  # integrated (low-frequency heavy) noise, re-centred
        noise = np.cumsum(noise)
        noise = noise - np.convolve(noise, np.ones(401) / 401, mode="same")
    sig_pow = float(np.mean(x[x != 0] ** 2)) if np.any(x != 0) else 1e-6
    noise *= np.sqrt(sig_pow / (10 ** (spec["snr_db"] / 10)) / (float(np.mean(noise ** 2)) + 1e-12))
    return np.clip(x + noise, -1.0, 1.0).astype(np.float32)


def _split_sizes(cfg: DemoCorpusConfig) -> dict[str, int]:
    return {"train": cfg.num_train, "dev": cfg.num_dev, "heldout": cfg.num_heldout}


def make_demo_corpus(root: str, cfg: DemoCorpusConfig = DemoCorpusConfig(), *, verbose: bool = True) -> dict:
    """Builds (or reuses) the demo corpus under `root`; returns {split: manifest path}.

    Reuses an existing corpus only if its ``corpus.json`` fingerprint matches `cfg`; otherwise rebuilds it in a
    temporary sibling folder and renames it into place (atomic on POSIX).
    """

    cfg.validate()
    root = os.path.abspath(root)
    manifests = {s: os.path.join(root, f"{s}.jsonl") for s in _split_sizes(cfg)}
    info_path = os.path.join(root, "corpus.json")
    fp = cfg.fingerprint()
    if os.path.exists(info_path):
        with open(info_path) as f:
            if json.load(f).get("fingerprint") == fp and all(os.path.exists(m) for m in manifests.values()):
                return manifests
    get_synth()  # fail early with a clear message if eSpeak NG is missing
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo_corpus_tmp_", dir=parent)
    try:
        stats = {}
        for split_idx, (split, n) in enumerate(_split_sizes(cfg).items()):
            os.makedirs(os.path.join(tmp, split))
            total = 0.0
            with open(os.path.join(tmp, f"{split}.jsonl"), "w") as out:
                for i in range(n):
                    # separate streams per utterance: the texts and settings depend on the seed only
                    spec = sample_utterance_spec(np.random.default_rng([cfg.seed, split_idx, i, 0]), split, cfg)
                    audio = render_utterance(spec, np.random.default_rng([cfg.seed, split_idx, i, 1]),
                                             cfg.sample_rate)
                    uid = f"demo-{split}-{i:05d}"
                    rel = os.path.join(split, uid + ".wav")
                    sf.write(os.path.join(tmp, rel), audio, cfg.sample_rate, subtype="PCM_16")
                    dur = audio.shape[0] / cfg.sample_rate
                    total += dur
                    rec = dict(id=uid, audio=rel, text=spec["text"], sample_rate=cfg.sample_rate,
                               duration=round(dur, 4), num_samples=int(audio.shape[0]), channels=1,
                               speaker=f"{spec['voice']}@r{spec['rate']}p{spec['pitch']}",
                               voice=spec["voice"], rate=spec["rate"], pitch=spec["pitch"],
                               snr_db=round(spec["snr_db"], 2))
                    out.write(json.dumps(rec) + "\n")
            stats[split] = dict(utterances=n, hours=round(total / 3600, 4))
        with open(os.path.join(tmp, "corpus.json"), "w") as f:
            json.dump(dict(fingerprint=fp, config=dataclasses.asdict(cfg), splits=stats,
                           synthesiser="eSpeak NG via espeakng-loader (GPL-3.0)"), f, indent=1)
        if os.path.exists(root):
            old = root + f".old.{os.getpid()}"
            os.rename(root, old)
            os.rename(tmp, root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(f"[demo_data] wrote demo corpus to {root}: {stats}", flush=True)
    return manifests


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def split_settings(records: Sequence[dict]) -> set[tuple]:
    """(voice, rate, pitch) triples of a manifest, for checking that held-out settings are unseen."""
    return {(r["voice"], r["rate"], r["pitch"]) for r in records}
