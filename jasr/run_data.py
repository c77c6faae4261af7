"""The data side of a run config: splits and their utterances, the tokenizer, features, batch shapes and loaders.

One rule covers utterances without a transcript (self-supervised training, decoding unlabelled audio): they carry
the text :data:`NO_TRANSCRIPT`, which :func:`label_fn` turns into one dummy label (the loader needs one), and
:func:`reference_texts` maps back to "" (no WER for them).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import ml_collections
import numpy as np

from jasr.augment import AudioAugment
from jasr.data import BatchConfig, Utterance, make_loader, read_manifest
from jasr.demo_data import DemoCorpusConfig, make_demo_corpus
from jasr.features import FeatureConfig, feature_dim
from jasr.tasks import family
from jasr.tokenizers import CharTokenizer, load_tokenizer

NO_TRANSCRIPT = "<no transcript>"


@dataclasses.dataclass
class RunData:
    """What the training loop needs from the data side of a config."""
    tokenizer: Any
    feature_config: FeatureConfig
    batch_config: BatchConfig
    train: list[Utterance]
    dev: list[Utterance]
    label_fn: Callable[[str], list[int]]


def resolve(path: str, root: str) -> str:
    """`path` relative to `root` unless absolute (or empty)."""
    return path if not path or os.path.isabs(path) else os.path.join(root, path)


# ------------------------------------------------------------------------------------------------------------
# splits and transcripts

def split_manifests(cfg: ml_collections.ConfigDict, root: str) -> dict[str, str]:
    """Split name -> manifest path: train, dev, every data.eval_manifests entry, and the demo corpus splits
    (building the demo corpus first if data.demo)."""
    d = cfg.data
    out = {}
    if d.demo:
        out.update(make_demo_corpus(resolve(d.demo_dir, root), DemoCorpusConfig(
            num_train=d.demo_num_train, num_dev=d.demo_num_dev, num_heldout=d.demo_num_heldout,
            max_words=d.demo_max_words, sample_rate=d.sample_rate, seed=cfg.seed)))
    else:
        out["train"] = resolve(d.train_manifest, root)
        if d.dev_manifest:
            out["dev"] = resolve(d.dev_manifest, root)
        elif d.speakers_dev:
            out["dev"] = out["train"]
    for k, v in d.eval_manifests.items():
        out[k] = resolve(v, root)
    return out


def with_placeholder_transcripts(utts: list[Utterance]) -> list[Utterance]:
    """Utterances without a transcript get the text NO_TRANSCRIPT."""
    return [u if u.text.strip() else dataclasses.replace(u, text=NO_TRANSCRIPT) for u in utts]


def reference_texts(utts: list[Utterance]) -> dict[str, str]:
    """Utterance id -> reference transcript ("" where there is none)."""
    return {u.id: ("" if u.text == NO_TRANSCRIPT else u.text) for u in utts}


def load_split(cfg: ml_collections.ConfigDict, manifests: dict, name: str, *,
               allow_missing_transcripts: bool = False) -> list[Utterance]:
    """Utterances of split `name`, with the speaker filters of data.speakers_train / data.speakers_dev. A missing
    transcript is an error unless `allow_missing_transcripts` (then the utterance gets NO_TRANSCRIPT)."""
    if name not in manifests:
        raise ValueError(f"unknown split {name!r}; this config has {sorted(manifests)}")
    utts = read_manifest(manifests[name], allow_empty_text=allow_missing_transcripts)
    spk_train, spk_dev = tuple(cfg.data.speakers_train), tuple(cfg.data.speakers_dev)
    if name == "train" and (spk_train or spk_dev):
        utts = [u for u in utts if (u.speaker in spk_train if spk_train else u.speaker not in spk_dev)]
    elif name == "dev" and spk_dev:
        utts = [u for u in utts if u.speaker in spk_dev]
    if not utts:
        raise ValueError(f"split {name!r} ({manifests[name]}) has no utterances after the speaker filters")
    return with_placeholder_transcripts(utts)


def split_utterances(cfg: ml_collections.ConfigDict, name: str, root: str) -> list[Utterance]:
    """The utterances of split `name` of a run config, transcripts optional (for decoding)."""
    return load_split(cfg, split_manifests(cfg, root), name, allow_missing_transcripts=True)


def label_fn(cfg: ml_collections.ConfigDict, tokenizer) -> Callable[[str], list[int]]:
    """How the loaders turn a transcript into labels: the model family's rule (default tokenizer.encode), and
    one dummy label for NO_TRANSCRIPT."""
    encode = family(cfg.model.name).label_fn(tokenizer) or tokenizer.encode
    return lambda text: [1] if text == NO_TRANSCRIPT else encode(text)


# ------------------------------------------------------------------------------------------------------------
# tokenizer, features, batches

def load_or_make_tokenizer(cfg: ml_collections.ConfigDict, workdir: str, train_utts: list[Utterance], root: str):
    """The run's tokenizer: ``workdir/tokenizer.json`` if it exists (resume / decode), else built from config
    ("char": the characters of the train transcripts) and saved there."""
    path = os.path.join(workdir, "tokenizer.json")
    if os.path.exists(path):
        return load_tokenizer(path)
    spec = cfg.data.tokenizer
    if spec == "char":
        texts = [u.text for u in train_utts if u.text != NO_TRANSCRIPT]
        tok = CharTokenizer.from_texts(texts) if texts else CharTokenizer([" "])
    else:
        tok = load_tokenizer(spec if spec.startswith("whisper:") else resolve(spec, root))
    tok.save(path + ".tmp")   # the run keeps its own copy (decode.py, resume)
    os.replace(path + ".tmp", path)
    return tok


def feature_config(cfg: ml_collections.ConfigDict) -> FeatureConfig:
    return family(cfg.model.name).feature_config(cfg)


def raw_audio_batches(cfg: ml_collections.ConfigDict) -> bool:
    """Whether the loader yields waveforms (features computed on device, or a waveform model)."""
    return bool(cfg.data.device_features or cfg.data.feature == "raw")


def batch_config(cfg: ml_collections.ConfigDict) -> BatchConfig:
    d = cfg.data
    return BatchConfig(max_frames=d.max_frames,
                       bucket_boundaries=tuple(d.bucket_boundaries) or None, num_buckets=d.num_buckets,
                       label_pad_multiple=d.label_pad_multiple, max_batch_size=d.max_batch_size or None,
                       subsampling=family(cfg.model.name).subsampling(cfg),
                       drop_unfit=d.drop_unfit, drop_too_long=d.drop_too_long,
                       output="audio" if raw_audio_batches(cfg) else "features")


def prepare_data(cfg: ml_collections.ConfigDict, workdir: str, root: str) -> RunData:
    """Reads the train and dev splits and makes (or reloads) the tokenizer."""
    manifests = split_manifests(cfg, root)
    missing_ok = not family(cfg.model.name).needs_transcripts
    train = load_split(cfg, manifests, "train", allow_missing_transcripts=missing_ok)
    dev = load_split(cfg, manifests, "dev", allow_missing_transcripts=missing_ok) if "dev" in manifests else []
    tok = load_or_make_tokenizer(cfg, workdir, train, root)
    return RunData(tok, feature_config(cfg), batch_config(cfg), train, dev, label_fn(cfg, tok))


def audio_augment(d: ml_collections.ConfigDict) -> AudioAugment | None:
    """The host-side waveform augmentation of config section `d` (speed/gain/noise), or None when it has none."""
    if not (tuple(d.speed_perturb) or d.gain_db or d.noise_snr_db):
        return None
    return AudioAugment(speeds=tuple(d.speed_perturb) or (1.0,), gain_db=tuple(d.gain_db) or None,
                        noise_snr_db=tuple(d.noise_snr_db) or None, noise_prob=d.noise_prob)


def make_train_loader(cfg: ml_collections.ConfigDict, data: RunData):
    """Endless shuffled bucketed batches of the train split, with the config's augmentation."""
    return make_loader(data.train, data.tokenizer, data.feature_config, data.batch_config, seed=cfg.data.shuffle_seed,
                       shuffle=True, num_epochs=None, worker_count=cfg.data.num_workers, label_fn=data.label_fn,
                       augment=audio_augment(cfg.data))


def make_eval_loader(cfg: ml_collections.ConfigDict, utts: list[Utterance], tokenizer, *, edges=None):
    """One ordered pass over `utts`. With `edges` (the training buckets' upper durations) batches get the training
    shapes, so the evaluation reuses compiled programs; longer utterances get one more bucket."""
    boundaries = None
    if edges:
        longest = max(u.duration for u in utts)
        boundaries = tuple(edges) + ((math.ceil(longest * 10) / 10 + 0.1,) if longest > edges[-1] else ())
    bc = dataclasses.replace(batch_config(cfg), drop_unfit=True, drop_too_long=False, bucket_boundaries=boundaries)
    return make_loader(utts, tokenizer, feature_config(cfg), bc, shuffle=False, num_epochs=1,
                       worker_count=cfg.data.num_workers, label_fn=label_fn(cfg, tokenizer))


_DEVICE_KEYS = ("features", "feature_paddings", "audio", "audio_paddings", "labels", "label_paddings")


def device_inputs(batch: dict) -> dict:
    """The numeric part of a loader batch, plus row_weights (0 for padding rows)."""
    out = {k: batch[k] for k in _DEVICE_KEYS if k in batch}
    out["row_weights"] = 1.0 - np.asarray(batch["example_paddings"], np.float32)
    return out


def dummy_batch(shape: tuple[int, int, int], fc: FeatureConfig, raw: bool) -> dict:
    """A batch of zeros of shape (batch, frames or samples, labels) that shapes parameters and programs."""
    b, t, n = shape
    out = {"labels": np.ones((b, n), np.int32), "label_paddings": np.zeros((b, n), np.float32),
           "row_weights": np.ones((b,), np.float32)}
    if raw:
        out["audio"], out["audio_paddings"] = np.zeros((b, t), np.float32), np.zeros((b, t), np.float32)
    else:
        out["features"] = np.zeros((b, t, feature_dim(fc)), np.float32)
        out["feature_paddings"] = np.zeros((b, t), np.float32)
    return out
