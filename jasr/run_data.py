"""The data side of a run config: splits and their utterances, the tokenizer, features, batch shapes and loaders.

One rule covers utterances without a transcript (self-supervised training, decoding unlabelled audio): they carry
the text :data:`NO_TRANSCRIPT`, which :func:`label_fn` turns into one dummy label (the loader needs one), and
:func:`reference_texts` maps back to "" (no WER for them).

Bad input is skipped, never silently: :func:`prepare_data` checks every train and dev file's header before
training (unreadable, empty, truncated, or not as long as its manifest says; ~0.1-0.15 ms a file) and the train
loader skips a file whose samples fail to decode on first read (non-finite samples, a damaged compressed stream:
reading every sample up front would cost ~0.8 s (WAV) to 2 s (FLAC) per hour of audio). Each skipped utterance
is a ``{"split", "id", "audio", "reason"}`` record for the run's log; more than ``data.max_bad_fraction`` of a
split is a :class:`~jasr.data.DataError` (:func:`check_bad_fraction`). Dev utterances whose transcript cannot be
a label (characters outside the tokenizer, too long for the frames) keep a placeholder label: no dev loss, but
decoded and scored in WER.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import os
import re
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from jasr.augment import AudioAugment
from jasr.data import BatchConfig, DataError, make_loader
from jasr.demo_data import DemoCorpusConfig, make_demo_corpus
from jasr.errors import ConfigError
from jasr.features import WHISPER_CHUNK_SAMPLES, WHISPER_SAMPLE_RATE, FeatureConfig, feature_dim
from jasr.manifests import Utterance, check_utterances, read_manifest
from jasr.sharding import mesh_shape
from jasr.tasks import Task, family
from jasr.tasks.base import stack_options
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
    skipped: list[dict] = dataclasses.field(default_factory=list)   # {"split", "id", "audio", "reason"}
    totals: dict = dataclasses.field(default_factory=dict)          # split -> utterances in its manifest


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
               allow_missing_transcripts: bool = False, bad: list | None = None) -> list[Utterance]:
    """Utterances of split `name`, with the speaker filters of data.speakers_train / data.speakers_dev. A missing
    transcript is an error unless `allow_missing_transcripts` (then the utterance gets NO_TRANSCRIPT). `bad`
    collects the lines whose duration must come from an unreadable audio header (see read_manifest)."""
    if name not in manifests:
        raise ValueError(f"unknown split {name!r}; this config has {sorted(manifests)}")
    utts = read_manifest(manifests[name], allow_empty_text=allow_missing_transcripts, bad=bad)
    spk_train, spk_dev = tuple(cfg.data.speakers_train), tuple(cfg.data.speakers_dev)
    if name == "train" and (spk_train or spk_dev):
        utts = [u for u in utts if (u.speaker in spk_train if spk_train else u.speaker not in spk_dev)]
    elif name == "dev" and spk_dev:
        utts = [u for u in utts if u.speaker in spk_dev]
    if not utts:
        raise ValueError(f"split {name!r} ({manifests[name]}) has no utterances after the speaker filters")
    return with_placeholder_transcripts(utts)


def split_utterances(cfg: ml_collections.ConfigDict, name: str, root: str, *, bad: list | None = None
                     ) -> list[Utterance]:
    """The utterances of split `name` of a run config, transcripts optional (for decoding); `bad` as load_split."""
    return load_split(cfg, split_manifests(cfg, root), name, allow_missing_transcripts=True, bad=bad)


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


def mesh_batch_devices(cfg: ml_collections.ConfigDict) -> int:
    """Devices the config's mesh splits a batch over (data x fsdp): batch sizes are multiples of it."""
    mesh = cfg.get("mesh")
    if mesh is None:       # a run saved before the mesh section existed
        return 1
    try:
        shape = mesh_shape(dict(mesh), jax.device_count())
    except ValueError as e:
        raise ConfigError(f"config 'mesh': {e}") from e
    return shape["data"] * shape["fsdp"]


def batch_row_multiple(cfg: ml_collections.ConfigDict) -> int:
    """What a training/eval batch's rows are a multiple of: the mesh's data x fsdp devices, times the pipeline's
    microbatches when the layer stacks are pipelined (so that no row is padded inside the pipelined step)."""
    stack = stack_options(cfg)
    return mesh_batch_devices(cfg) * (stack.num_microbatches if stack.stages > 1 else 1)


def batch_config(cfg: ml_collections.ConfigDict) -> BatchConfig:
    d = cfg.data
    return BatchConfig(max_frames=d.max_frames,
                       bucket_boundaries=tuple(d.bucket_boundaries) or None, num_buckets=d.num_buckets,
                       label_pad_multiple=d.label_pad_multiple, max_batch_size=d.max_batch_size or None,
                       batch_pad_multiple=batch_row_multiple(cfg),
                       subsampling=family(cfg.model.name).subsampling(cfg),
                       ctc_alignment=cfg.loss.type in ("ctc", "joint"),
                       drop_unfit=d.drop_unfit, drop_too_long=d.drop_too_long,
                       output="audio" if raw_audio_batches(cfg) else "features")


def check_bad_fraction(split: str, bad: list[dict], total: int, max_fraction: float) -> None:
    """DataError when more than `max_fraction` (config data.max_bad_fraction) of the `total` utterances of `split`
    are bad (the `bad` records); names the count and the first few files with their reasons."""
    if bad and len(bad) > max_fraction * total:
        first = "; ".join(f"{r['id']} ({r['audio']}): {r['reason']}" for r in bad[:3])
        raise DataError(f"{len(bad)} of {total} {split} utterances ({100 * len(bad) / max(total, 1):.1f}%) are "
                        f"unusable, more than data.max_bad_fraction={max_fraction}: {first}"
                        f"{' ...' if len(bad) > 3 else ''}")


def checked_split(cfg: ml_collections.ConfigDict, manifests: dict, name: str, *, allow_missing_transcripts: bool,
                  skipped: list[dict], totals: dict) -> list[Utterance]:
    """load_split + the header check of every file (jasr.manifests.check_utterances): the usable utterances; a record
    per skipped one is appended to `skipped`; DataError past data.max_bad_fraction."""
    no_header: list[dict] = []
    utts = load_split(cfg, manifests, name, allow_missing_transcripts=allow_missing_transcripts, bad=no_header)
    ok, unreadable = check_utterances(utts)
    bad = [{"split": name, **r} for r in no_header + unreadable]
    totals[name] = len(utts) + len(no_header)
    check_bad_fraction(name, bad, totals[name], cfg.data.max_bad_fraction)
    if not ok:
        raise DataError(f"split {name!r} ({manifests[name]}) has no usable utterance")
    skipped += bad
    return ok


def prepare_data(cfg: ml_collections.ConfigDict, workdir: str, root: str) -> RunData:
    """Reads the train and dev splits (with the header check of every file) and makes (or reloads) the
    tokenizer."""
    manifests = split_manifests(cfg, root)
    missing_ok = not family(cfg.model.name).needs_transcripts
    skipped, totals = [], {}
    train = checked_split(cfg, manifests, "train", allow_missing_transcripts=missing_ok, skipped=skipped,
                          totals=totals)
    dev = []
    if "dev" in manifests:
        dev = checked_split(cfg, manifests, "dev", allow_missing_transcripts=missing_ok, skipped=skipped,
                            totals=totals)
    tok = load_or_make_tokenizer(cfg, workdir, train, root)
    return RunData(tok, feature_config(cfg), batch_config(cfg), train, dev, label_fn(cfg, tok), skipped, totals)


def audio_augment(d: ml_collections.ConfigDict) -> AudioAugment | None:
    """The host-side waveform augmentation of config section `d` (speed/gain/noise/VTLP/EQ), or None when it has
    none."""
    if not (tuple(d.speed_perturb) or d.gain_db or d.noise_snr_db or d.vtlp or d.random_eq_db):
        return None
    return AudioAugment(speeds=tuple(d.speed_perturb) or (1.0,), gain_db=tuple(d.gain_db) or None,
                        noise_snr_db=tuple(d.noise_snr_db) or None, noise_prob=d.noise_prob,
                        vtlp=tuple(d.vtlp) or None, eq_db=float(d.random_eq_db),
                        eq_points=int(d.random_eq_points))


def make_train_loader(cfg: ml_collections.ConfigDict, data: RunData, task: Task | None = None,
                      rows: tuple[int, int] = (0, 1)):
    """Endless shuffled bucketed batches of the train split, with the config's augmentation. Transcripts the
    tokenizer cannot encode are left out (``loader.skipped``, cause "unencodable"); a file that fails to decode
    becomes a padding row named in the batch's ``errors``. Labels must fit `task`'s real output frames.
    `rows` = (index, count): this process builds row block `index` of `count` of every global batch
    (:func:`jasr.distributed.process_row_block`; its batches also carry the ``global_ids`` of all rows)."""
    bc = dataclasses.replace(data.batch_config, skip_unencodable=True, skip_bad_audio=True)
    return make_loader(data.train, data.tokenizer, data.feature_config, bc, seed=cfg.data.shuffle_seed,
                       shuffle=True, num_epochs=None, worker_count=cfg.data.num_workers, label_fn=data.label_fn,
                       augment=audio_augment(cfg.data), output_frames=_output_frames(task, data.feature_config),
                       row_index=rows[0], row_count=rows[1])


def make_eval_loader(cfg: ml_collections.ConfigDict, utts: list[Utterance], tokenizer, *, edges=None,
                     task: Task | None = None, whole_files: bool = False):
    """One ordered pass over `utts` that leaves none out. With `edges` (the training buckets' upper durations)
    batches get the training shapes, so the evaluation reuses compiled programs; longer utterances get one more
    bucket (batches of one where that exceeds data.max_frames). A transcript that cannot be a label (characters
    outside the tokenizer, more tokens than frames) gets a placeholder label (``loader.placeholders``): no loss,
    still decoded and scored; a file that fails to decode is a row named in the batch's ``errors``.
    `whole_files`: the features of the family's ``decode_feature_config`` (e.g. Whisper's log-mel of the whole
    file, not its first 30 s), for ``Task.transcribe``."""
    boundaries = None
    if edges:
        longest = max(u.duration for u in utts)
        boundaries = tuple(edges) + ((math.ceil(longest * 10) / 10 + 0.1,) if longest > edges[-1] else ())
    bc = dataclasses.replace(batch_config(cfg), drop_unfit=False, drop_too_long=False, bucket_boundaries=boundaries,
                             keep_unscorable=True, skip_bad_audio=True, allow_oversize=True)
    fc = family(cfg.model.name).decode_feature_config(cfg) if whole_files else feature_config(cfg)
    return make_loader(utts, tokenizer, fc, bc, shuffle=False, num_epochs=1, worker_count=cfg.data.num_workers,
                       label_fn=label_fn(cfg, tokenizer), output_frames=_output_frames(task, fc))


def cut_dev_summary(split: str, utts: list[Utterance], fc: FeatureConfig) -> str | None:
    """One log line about the utterances of `split` longer than the fixed input window of features `fc` (Whisper's
    30 s log-mel): evaluation decodes their first window only and scores them against the whole transcript
    (decode.py transcribes whole files); None when there are none."""
    if not (fc.kind == "whisper" and fc.whisper_pad_or_trim):
        return None
    window = WHISPER_CHUNK_SAMPLES / WHISPER_SAMPLE_RATE
    cut = [u for u in utts if u.duration > window]
    if not cut:
        return None
    return (f"{len(cut)} of {len(utts)} {split} utterances are longer than the model's {window:g} s window, e.g. "
            f"{cut[0].id} ({cut[0].duration:.1f} s): {split} WER decodes their first {window:g} s against the whole "
            f"transcript (decode.py transcribes whole files)")


def _output_frames(task: Task | None, fc: FeatureConfig):
    """samples -> the task's network output frames (for the loader's label-fit check), or None."""
    return None if task is None else functools.partial(task.output_frames, fc=fc)


_DEVICE_KEYS = ("features", "feature_paddings", "audio", "audio_paddings", "labels", "label_paddings")


def device_inputs(batch: dict) -> dict:
    """The numeric part of a loader batch, plus row_weights: the rows whose label counts in the loss (0 for padding
    rows, failed files and placeholder labels)."""
    out = {k: batch[k] for k in _DEVICE_KEYS if k in batch}
    w = batch.get("label_weights")
    out["row_weights"] = np.asarray(w if w is not None else 1.0 - batch["example_paddings"], np.float32)
    return out


_BAD_CHARS = re.compile(r"characters (\[.*?\]) of transcript")


def unencodable_summary(split: str, records: list[dict], total: int) -> str | None:
    """One log line about the transcripts of `split` that the tokenizer could not encode (from loader
    ``skipped`` / ``placeholders`` records): how many, and which characters; None when there are none."""
    recs = [r for r in records if r.get("cause") == "unencodable"]
    if not recs:
        return None
    chars: set = set()
    for r in recs:
        m = _BAD_CHARS.search(r["reason"])
        try:
            chars.update(ast.literal_eval(m.group(1)) if m else ())
        except (ValueError, SyntaxError):
            pass
    return (f"{len(recs)} of {total} {split} transcripts have characters outside the tokenizer's vocabulary"
            + (f" ({''.join(sorted(chars))!r})" if chars else "") + f", e.g. {recs[0]['id']}")


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
