"""The grain input pipeline: duration buckets, dynamic batches by total frames, fixed bucket shapes (manifests are
read by :mod:`jasr.manifests`).

Batches are planned per epoch on the host as a pure function of (seed, epoch): utterances are put in duration
buckets, each bucket has a fixed batch size B_b = max_frames // T_b, so every epoch has the same number of batches
and every batch of a bucket has the same padded shape (B_b, T_b, N_b). A grain DataLoader reads batch plans by
global index (sharded round-robin across hosts) and builds them in worker processes; its iterator's
`get_state()` / `set_state()` resume at the exact batch.

    utts = read_manifest("train.jsonl")
    tok = CharTokenizer.from_texts(u.text for u in utts)
    loader = make_loader(utts, tok, FeatureConfig(), BatchConfig(max_frames=20000), seed=0, num_epochs=None,
                         worker_count=4, shard_index=jax.process_index(), shard_count=jax.process_count())
    it = iter(loader)
    batch = next(it)                 # features [B, T, F], feature_paddings [B, T], labels [B, N], ...
    state = it.get_state()           # bytes: store with the checkpoint; later it.set_state(state)

Bad input is an error that names it, or, where a BatchConfig flag asks for it, a named skip
(`jasr.manifests.check_utterances` checks every file's header up front);
`skip_bad_audio` turns a file that fails when its batch is built into a padding row with an `errors` entry;
`skip_unencodable` / `drop_unfit` / `drop_too_long` leave utterances out with a record in `loader.skipped`;
`keep_unscorable` (evaluation) keeps them with a placeholder label outside the loss. A bucket whose batch of one
would exceed `max_frames` is a DataError unless `drop_too_long` or `allow_oversize`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from typing import Any, Callable, Sequence

import grain.python as grain
import numpy as np
from absl import flags

from jasr.audio import AudioError, load_audio
from jasr.cmvn import CmvnStats, accumulate_cmvn
from jasr.features import FeatureConfig, compute_features, feature_dim, num_frames, time_major
from jasr.manifests import Utterance, read_manifest

__all__ = ["DataError", "BatchConfig", "AsrLoader", "make_loader", "plan_epoch", "compute_cmvn_stats"]


class DataError(ValueError):
    """A data set cannot be used as configured: too many unreadable files, a batch budget below one utterance, ...
    (the message names the count, the files or the config key)."""


# ----------------------------------------------------------------------------------------------------------------
# Dataset statistics.

def compute_cmvn_stats(source, config: FeatureConfig, *, max_utterances: int | None = None,
                       seed: int = 0) -> CmvnStats:
    """Global CMVN over the un-normalised features of a data set.

    source: a JSONL manifest path, a sequence of Utterance, or a sequence of audio file paths.
    max_utterances: use a seeded random subset of that many (for large manifests).
    """
    if isinstance(source, (str, os.PathLike)):
        source = read_manifest(source)
    items = list(source)
    if not items:
        raise ValueError("compute_cmvn_stats: no utterances")
    if max_utterances is not None and len(items) > max_utterances:
        pick = np.sort(np.random.default_rng(seed).choice(len(items), max_utterances, replace=False))
        items = [items[i] for i in pick]
    raw = dataclasses.replace(config, normalize="none")

    def feats():
        for it in items:
            if isinstance(it, (str, os.PathLike)):
                audio = load_audio(it, raw.sample_rate)
            else:
                audio = load_audio(it.audio_path, raw.sample_rate, offset=it.offset,
                                   duration=it.duration if it.offset else None)
            yield time_major(compute_features(audio, raw), raw)
    return accumulate_cmvn(feats())


# ----------------------------------------------------------------------------------------------------------------
# Batch planning.

@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How utterances become fixed-shape batches.

    max_frames: padded feature frames per batch (B * T); each duration bucket gets B = max_frames // T
      (floored to a multiple of batch_pad_multiple, at least batch_pad_multiple, at most max_batch_size).
    bucket_boundaries: upper duration edges in seconds (ascending); None picks `num_buckets` edges at duration
      quantiles of the data. Utterances longer than the last edge raise (or are dropped with drop_too_long).
    frame_pad_multiple / label_pad_multiple: T and N are rounded up to these.
    label_bucket_boundaries: None gives one label length N per duration bucket (its longest label); a tuple of
      lengths pads each batch's labels to the smallest boundary that fits (more shapes, less padding).
    subsampling: the model's frame rate reduction; a label must have at most (frames // subsampling) tokens
      (or as many as make_loader's `output_frames` gives), else make_loader raises (or drops with drop_unfit).
    ctc_alignment: labels are CTC targets: each pair of equal adjacent tokens needs one more frame (a blank
      between them), so a label needs tokens + repeats frames.
    output: "features" (host features) or "audio" (raw waveforms `audio [B, S]`, `audio_paddings [B, S]`, for
      features computed on device with jasr.features.compute_features_jax).
    A bucket whose padded length T exceeds max_frames (a batch of one utterance would be bigger than the budget)
    raises, or drops its utterances with drop_too_long, or is kept as batches of one with allow_oversize.
    skip_unencodable: transcripts the tokenizer cannot encode (characters outside its vocabulary) are left out
      (listed in `loader.skipped`) instead of raising.
    keep_unscorable (evaluation): such transcripts, and labels that cannot fit the frames, keep their utterance
      with an empty placeholder label (it fits any number of frames) whose `label_weights` is 0 (no loss; still
      decoded and scored against its reference text); listed in `loader.placeholders`.
    skip_bad_audio: a file that fails to load when its batch is built (undecodable, non-finite samples, a length
      that disagrees with its header or manifest duration) becomes a padding row whose `errors` entry says why,
      instead of raising.
    """
    max_frames: int = 20000
    bucket_boundaries: tuple[float, ...] | None = None
    num_buckets: int = 6
    frame_pad_multiple: int = 16
    label_pad_multiple: int = 8
    label_bucket_boundaries: tuple[int, ...] | None = None
    batch_pad_multiple: int = 1
    max_batch_size: int | None = None
    subsampling: int = 1
    ctc_alignment: bool = False
    drop_too_long: bool = False
    drop_unfit: bool = False
    output: str = "features"
    allow_oversize: bool = False
    skip_unencodable: bool = False
    keep_unscorable: bool = False
    skip_bad_audio: bool = False

    def __post_init__(self):
        if self.output not in ("features", "audio"):
            raise ValueError(f"BatchConfig.output must be 'features' or 'audio', got {self.output!r}")
        if self.max_frames <= 0 or self.batch_pad_multiple <= 0 or self.subsampling <= 0:
            raise ValueError("BatchConfig: max_frames, batch_pad_multiple and subsampling must be positive")
        if self.bucket_boundaries is not None:
            b = tuple(self.bucket_boundaries)
            if not b or any(x <= 0 for x in b) or list(b) != sorted(set(b)):
                raise ValueError(f"bucket_boundaries must be positive and strictly ascending, got {b}")


def _round_up(x: int, m: int) -> int:
    return -(-int(x) // m) * m


@dataclasses.dataclass(frozen=True)
class _Bucket:
    max_duration: float   # seconds of (possibly slowed-down) audio the bucket admits
    frames: int           # T (features) ...
    samples: int          # ... or S (raw audio), padded
    batch_size: int       # B
    label_len: int        # N (when label_bucket_boundaries is None)


_SLACK_S = 0.002   # manifest durations are rounded (e.g. to 0.1 ms) and resamplers round lengths


def _frames_for(duration: float, feature_config: FeatureConfig, *, upper: bool = True) -> int:
    """Frames of `duration` seconds of audio: an upper bound (bucket sizes) or a lower bound (label fit)."""
    sr = feature_config.sample_rate
    samples = math.ceil((duration + _SLACK_S) * sr) if upper else max(math.floor((duration - _SLACK_S) * sr), 0)
    return num_frames(samples, feature_config)


def _output_frames(duration: float, fc: FeatureConfig, bc: BatchConfig, output_frames) -> int:
    """The model's output frames for (a lower bound of) `duration` seconds of audio."""
    if output_frames is not None:
        n = output_frames(max(math.floor((duration - _SLACK_S) * fc.sample_rate), 0))
        if n is not None:
            return int(n)
    return _frames_for(duration, fc, upper=False) // bc.subsampling


def _repeats(label: Sequence[int]) -> int:
    """Adjacent equal tokens: each needs a blank frame between them in a CTC alignment."""
    return int(sum(a == b for a, b in zip(label[:-1], label[1:])))


def _bucket_lengths(edge: float, fc: FeatureConfig, bc: BatchConfig) -> tuple[int, int]:
    """Padded (frames T, samples S) of a bucket admitting `edge` seconds of audio."""
    if fc.kind == "whisper" and fc.whisper_pad_or_trim:
        t = num_frames(0, fc)   # the model's fixed 3000 frames, not rounded
    else:
        t = _round_up(max(_frames_for(edge, fc), 1), bc.frame_pad_multiple)
    s = _round_up(int(math.ceil((edge + _SLACK_S) * fc.sample_rate)), bc.frame_pad_multiple * 16)
    return t, s


def plan_epoch(bucket_of: np.ndarray, batch_sizes: Sequence[int], *, seed: int, epoch: int, shuffle: bool,
               shard_count: int = 1) -> list[tuple[int, np.ndarray]]:
    """Batches of one epoch: list of (bucket, utterance indices). Pure function of its arguments.

    Each bucket's utterances (shuffled if `shuffle`) are cut into chunks of its batch size; the batch order is
    then shuffled. With shard_count > 1 empty batches (bucket 0, no indices) pad the count to a multiple of it.
    """
    rng = np.random.default_rng([int(seed), int(epoch)])
    batches = []
    for b, bs in enumerate(batch_sizes):
        idx = np.flatnonzero(bucket_of == b)
        if shuffle:
            idx = rng.permutation(idx)
        batches += [(b, idx[i:i + bs]) for i in range(0, idx.shape[0], bs)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    while len(batches) % shard_count:
        batches.append((0, np.zeros((0,), np.int64)))
    return batches


class _BatchSampler:
    """grain Sampler: global index i -> record i with rng Philox(seed + i); finite or endless."""

    def __init__(self, batches_per_epoch: int, num_epochs: int | None, seed: int):
        self._bpe, self._num_epochs, self._seed = batches_per_epoch, num_epochs, seed
        self._len = sys.maxsize if num_epochs is None else batches_per_epoch * num_epochs

    def __len__(self):
        return self._len

    def __getitem__(self, index: int):
        if index < 0 or index >= self._len:
            raise IndexError(f"batch index {index} out of range [0, {self._len})")
        rng = np.random.Generator(np.random.Philox(key=self._seed + index))
        return grain.RecordMetadata(index=index, record_key=index, rng=rng)

    def __repr__(self):
        return (f"jasr._BatchSampler(batches_per_epoch={self._bpe}, num_epochs={self._num_epochs}, "
                f"seed={self._seed})")


class _BatchPlanSource:
    """grain RandomAccessDataSource: global batch index -> (bucket, utterance indices) of that epoch's plan."""

    def __init__(self, bucket_of, batch_sizes, batches_per_epoch, seed, shuffle, shard_count, fingerprint):
        self._bucket_of, self._batch_sizes = bucket_of, tuple(batch_sizes)
        self._bpe, self._seed, self._shuffle, self._shard_count = batches_per_epoch, seed, shuffle, shard_count
        self._fingerprint = fingerprint

    def __len__(self):
        return sys.maxsize

    @functools.lru_cache(maxsize=2)
    def _plan(self, epoch):
        return plan_epoch(self._bucket_of, self._batch_sizes, seed=self._seed, epoch=epoch, shuffle=self._shuffle,
                          shard_count=self._shard_count)

    def __getitem__(self, index: int):
        epoch, i = divmod(int(index), self._bpe)
        bucket, idx = self._plan(epoch)[i]
        return {"bucket": bucket, "indices": idx, "epoch": epoch}

    def __repr__(self):
        return (f"jasr._BatchPlanSource(batches_per_epoch={self._bpe}, seed={self._seed}, shuffle={self._shuffle}, "
                f"shard_count={self._shard_count}, data={self._fingerprint})")


# ----------------------------------------------------------------------------------------------------------------
# Batch construction (runs in grain workers).

class _BuildBatch:
    """grain RandomMapTransform: batch plan -> padded numpy batch dict (see make_loader)."""

    def __init__(self, utterances, labels, label_weights, buckets, label_buckets, feature_config, batch_config,
                 cmvn, augment, row_index=0, row_count=1):
        self.utts, self.labels, self.label_weights, self.buckets = utterances, labels, label_weights, buckets
        self.label_buckets, self.fc, self.bc, self.cmvn, self.augment = (label_buckets, feature_config,
                                                                         batch_config, cmvn, augment)
        self.row_index, self.row_count = row_index, row_count

    def random_map(self, plan, rng: np.random.Generator):
        bk = self.buckets[plan["bucket"]]
        # every row draws from its own generator, seeded by the batch's rng and the row's place in the global
        # batch: a row comes out the same whichever process builds it (row_index / row_count)
        base = int(rng.integers(2 ** 63))
        b = bk.batch_size // self.row_count
        first = self.row_index * b
        idx = plan["indices"]
        longest = max((len(self.labels[i]) for i in idx), default=0)   # of the global batch: one N everywhere
        out: dict[str, Any] = {}
        if self.row_count > 1:
            ids = [self.utts[i].id for i in idx] + [""] * (bk.batch_size - len(idx))
            out["global_ids"] = np.array(ids, dtype=np.str_)
        idx = idx[first:first + b]
        labels = [self.labels[i] for i in idx]
        if self.label_buckets is None:
            n = bk.label_len
        else:
            n = next((x for x in self.label_buckets if x >= longest), self.label_buckets[-1])
        lab = np.zeros((b, n), np.int32)
        lab_pad = np.ones((b, n), np.float32)
        for r, l in enumerate(labels):
            lab[r, :len(l)] = l
            lab_pad[r, :len(l)] = 0.0
        raw = self.bc.output == "audio"
        length = bk.samples if raw else bk.frames
        if raw:
            x = np.zeros((b, length), np.float32)
        else:
            x = np.zeros((b, length, feature_dim(self.fc)), np.float32)
        x_pad = np.ones((b, length), np.float32)
        ex_pad = np.ones((b,), np.float32)
        ex_pad[:len(idx)] = 0.0
        errors = [""] * b
        for r, i in enumerate(idx):
            u = self.utts[i]
            try:
                feats = self._features(u, length, raw, np.random.default_rng([base, first + r]))
            except (AudioError, _TooLong) as e:
                if not self.bc.skip_bad_audio:
                    raise type(e)(f"utterance {u.id!r}: {e}") from e
                errors[r] = str(e)          # a padding row: no features, no label, no weight
                ex_pad[r] = 1.0
                lab[r], lab_pad[r] = 0, 1.0
                continue
            x[r, :feats.shape[0]] = feats
            x_pad[r, :feats.shape[0]] = 0.0
        out["audio" if raw else "features"] = x
        out["audio_paddings" if raw else "feature_paddings"] = x_pad
        out["labels"] = lab
        out["label_paddings"] = lab_pad
        ids = [self.utts[i].id for i in idx] + [""] * (b - len(idx))
        out["ids"] = np.array(ids, dtype=np.str_) if ids else np.zeros((0,), np.str_)
        dur = np.zeros((b,), np.float32)
        dur[:len(idx)] = [self.utts[i].duration for i in idx]
        out["durations"] = dur
        out["example_paddings"] = ex_pad
        weights = 1.0 - ex_pad
        weights[:len(idx)] *= [self.label_weights[i] for i in idx]
        out["label_weights"] = weights
        out["errors"] = np.array(errors, dtype=np.str_) if errors else np.zeros((0,), np.str_)
        return out

    def _features(self, u: Utterance, length: int, raw: bool, rng: np.random.Generator) -> np.ndarray:
        audio = load_audio(u.audio_path, self.fc.sample_rate, offset=u.offset,
                           duration=u.duration if u.offset else None, expected_duration=u.duration)
        if self.augment is not None:
            audio = np.asarray(self.augment(audio, self.fc.sample_rate, rng), np.float32)
        if raw:
            feats = audio
        else:
            feats = compute_features(audio, self.fc, cmvn=self.cmvn, rng=rng if self.fc.dither else None)
            if self.fc.kind == "whisper":
                feats = feats.T
        if feats.shape[0] > length:
            raise _TooLong(f"{u.audio_path} gives {feats.shape[0]} {'samples' if raw else 'frames'}, more than its "
                           f"bucket's {length}: its manifest duration {u.duration} s is too short")
        return feats


class _TooLong(ValueError):
    """An utterance is longer than its manifest duration promised (its bucket cannot hold it)."""


class AsrLoader:
    """Iterable of fixed-shape batches (a configured grain DataLoader). `iter(loader)` gives a grain
    DataLoaderIterator with `get_state() -> bytes` / `set_state(bytes)`.

    Attributes: batches_per_epoch (global, all shards), steps_per_epoch (this shard), num_steps (this shard, all
    epochs; None when endless), bucket_shapes (the
    (B, T, N) shapes batches can have; T counts samples when output="audio"), buckets, num_utterances (those
    batched), skipped (a ``{"id", "audio", "cause", "reason"}`` record for each utterance left out; cause
    "too_long" or "oversize" (drop_too_long), "unfit" (drop_unfit), "unencodable" (skip_unencodable)), dropped
    (their ids), placeholders (records of the utterances batched with a placeholder label under
    keep_unscorable; cause "unencodable" or "unfit").
    """

    def __init__(self, data_loader, buckets, shapes, batches_per_epoch, shard_count, num_utterances, skipped,
                 placeholders, num_epochs):
        self.data_loader, self.buckets, self.bucket_shapes = data_loader, buckets, shapes
        self.batches_per_epoch, self.num_utterances = batches_per_epoch, num_utterances
        self.skipped, self.placeholders = skipped, placeholders
        self.dropped = [r["id"] for r in skipped]
        self.steps_per_epoch = batches_per_epoch // shard_count
        self.num_steps = None if num_epochs is None else self.steps_per_epoch * num_epochs   # None: endless

    def __iter__(self):
        return iter(self.data_loader)

    def __repr__(self):
        return (f"AsrLoader(utterances={self.num_utterances}, batches_per_epoch={self.batches_per_epoch}, "
                f"shapes={self.bucket_shapes})")


def make_loader(utterances: Sequence[Utterance], tokenizer, feature_config: FeatureConfig,
                batch_config: BatchConfig = BatchConfig(), *, seed: int = 0, shuffle: bool = True,
                num_epochs: int | None = 1, worker_count: int = 0, worker_buffer_size: int = 2,
                shard_index: int = 0, shard_count: int = 1, shard_options: grain.ShardOptions | None = None,
                row_index: int = 0, row_count: int = 1,
                augment: Callable[[np.ndarray, int, np.random.Generator], np.ndarray] | None = None,
                label_fn: Callable[[str], Sequence[int]] | None = None,
                cmvn: CmvnStats | None = None,
                output_frames: Callable[[int], int | None] | None = None) -> AsrLoader:
    """Builds the grain input pipeline. Batches are dicts of numpy arrays:

      features [B, T, F] float32, feature_paddings [B, T] (or audio [B, S], audio_paddings [B, S]),
      labels [B, N] int32 (padding 0), label_paddings [B, N], ids [B] str ("" for padding rows),
      durations [B] float32, example_paddings [B] (1.0 = padding row: all its frames and labels are padded),
      label_weights [B] (1.0 for a row whose label counts in a loss: 0 for padding rows and placeholder labels),
      errors [B] str (why a row's audio failed to load under skip_bad_audio: a padding row that keeps its id; ""
      otherwise).

    (B, T, N) is one of `loader.bucket_shapes`. Each epoch yields every utterance exactly once (across all shards).
    `augment(audio, sample_rate, rng)` (e.g. jasr.augment.AudioAugment) runs host-side with a per-row
    deterministic rng (a function of the seed, the global batch index and the row); `label_fn(text)` overrides
    `tokenizer.encode`; `output_frames(samples)` is the model's number of output frames for that many audio samples
    (exact, e.g. after its convolutional subsampling; default feature frames // subsampling): labels must fit it
    (see BatchConfig.ctc_alignment). Multi-host: pass
    shard_index=jax.process_index(), shard_count=jax.process_count(), or shard_options=grain.ShardByJaxProcess()
    (a grain ShardOptions; its drop_remainder is irrelevant: epochs are padded to a multiple of shard_count):
    each process then reads whole batches of its own. Or split every batch instead: with `row_count` > 1 every
    process iterates the same global batches and builds only rows [row_index * B / row_count, (row_index + 1) *
    B / row_count) of each (jasr.distributed.process_row_block gives the block of the process's devices; every
    bucket's B must be a multiple of row_count, see BatchConfig.batch_pad_multiple); `bucket_shapes` stay the
    global (B, T, N), the batches yielded have B / row_count rows, and the rows are those a single process would
    build (augmentation included); each batch then also carries ``global_ids`` [B], the ids of all its rows.
    """
    if not utterances:
        raise ValueError("make_loader: no utterances")
    if shard_options is not None:
        shard_index, shard_count = shard_options.shard_index, shard_options.shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if not 0 <= row_index < row_count:
        raise ValueError(f"row_index {row_index} not in [0, {row_count})")
    if num_epochs is not None and num_epochs <= 0:
        raise ValueError(f"num_epochs must be positive or None, got {num_epochs}")
    bc, fc = batch_config, feature_config
    encode = label_fn or tokenizer.encode
    if cmvn is None and fc.normalize == "global":
        if not fc.cmvn_path:
            raise ValueError("normalize='global' needs CMVN stats: pass cmvn= or set FeatureConfig.cmvn_path")
        cmvn = CmvnStats.load(fc.cmvn_path)

    labels, label_weights, skipped, placeholders = [], [], [], []
    keep = np.ones(len(utterances), bool)

    def leave_out(i, cause, reason, *, placeholder=False):
        rec = {"id": utterances[i].id, "audio": utterances[i].audio_path, "cause": cause, "reason": reason}
        if placeholder:              # kept, scored against its text, no loss (an empty label always fits)
            placeholders.append(rec)
            labels[i], label_weights[i] = np.zeros((0,), np.int32), 0.0
        else:
            skipped.append(rec)
            keep[i] = False

    for i, u in enumerate(utterances):
        if not u.text.strip():
            raise ValueError(f"utterance {u.id!r}: empty transcript")
        labels.append(np.zeros((0,), np.int32))
        label_weights.append(1.0)
        try:
            ids = np.asarray(encode(u.text), np.int32)
        except ValueError as e:              # TokenizerError: characters outside the vocabulary
            if not (bc.keep_unscorable or bc.skip_unencodable):
                raise ValueError(f"utterance {u.id!r}: {e}") from e
            leave_out(i, "unencodable", f"transcript not encodable: {e}", placeholder=bc.keep_unscorable)
            continue
        if ids.size == 0:
            raise ValueError(f"utterance {u.id!r}: transcript {u.text!r} encodes to no tokens")
        labels[i] = ids

    min_speed = float(getattr(augment, "min_speed", 1.0))
    max_speed = float(getattr(augment, "max_speed", 1.0))
    longest = np.array([u.duration / min_speed for u in utterances])
    shortest = np.array([u.duration / max_speed for u in utterances])

    if bc.bucket_boundaries is not None:
        edges = np.asarray(bc.bucket_boundaries, np.float64)
    else:
        qs = np.quantile(longest, np.linspace(0, 1, bc.num_buckets + 1)[1:])
        edges = np.unique(np.ceil(qs * 100.0) / 100.0)   # 10 ms resolution, last edge >= longest
    # edges whose padded length equals the next edge's would give the same shape: merge them
    lens = [_bucket_lengths(e, fc, bc)[1 if bc.output == "audio" else 0] for e in edges]
    edges = np.asarray([e for i, e in enumerate(edges) if i == len(edges) - 1 or lens[i] != lens[i + 1]])
    bucket_of = np.searchsorted(edges, longest - 1e-9, side="left")
    too_long = keep & (bucket_of >= len(edges))
    if too_long.any():
        bad = [utterances[i].id for i in np.flatnonzero(too_long)]
        if not bc.drop_too_long:
            raise ValueError(f"{len(bad)} utterances are longer than the last bucket edge {edges[-1]} s "
                             f"(e.g. {bad[:3]}); raise bucket_boundaries or set drop_too_long")
        for i in np.flatnonzero(too_long):
            leave_out(i, "too_long", f"{longest[i]:.3f} s is longer than the last bucket edge {edges[-1]} s "
                                     f"(drop_too_long)")
    # labels must fit the model's output frames of the shortest version of the audio (CTC: repeats need a blank)
    fit_frames = np.array([_output_frames(d, fc, bc, output_frames) for d in shortest])
    lab_len = np.array([len(l) for l in labels])
    repeats = np.array([_repeats(l) if bc.ctc_alignment else 0 for l in labels])
    unfit = keep & (lab_len + repeats > fit_frames)
    if unfit.any():
        def why(i):
            need = f"{lab_len[i]} tokens" + (f" + {repeats[i]} repeats" if repeats[i] else "")
            return f"{need} > {fit_frames[i]} model frames"
        bad = [f"{utterances[i].id} ({why(i)})" for i in np.flatnonzero(unfit)]
        if not (bc.drop_unfit or bc.keep_unscorable):
            raise ValueError(f"{len(bad)} labels are longer than the model's output frames they must align with "
                             f"(subsampling {bc.subsampling}): {bad[:3]}; set drop_unfit to leave them out")
        for i in np.flatnonzero(unfit):
            leave_out(i, "unfit", f"label of {why(i)} cannot align (subsampling {bc.subsampling})"
                                  f"{'' if bc.keep_unscorable else ' (drop_unfit)'}",
                      placeholder=bc.keep_unscorable)
        lab_len = np.array([len(l) for l in labels])
    # a bucket whose padded length exceeds max_frames would make batches of one bigger than max_frames
    frames_of = np.array([_bucket_lengths(e, fc, bc)[0] for e in edges])
    oversize = keep & (bucket_of < len(edges)) & (frames_of[np.minimum(bucket_of, len(edges) - 1)] > bc.max_frames)
    if oversize.any() and not bc.allow_oversize:
        need = np.array([_frames_for(utterances[i].duration, fc) for i in range(len(utterances))])
        which = np.flatnonzero(oversize)
        t_max = int(frames_of[bucket_of[which]].max())
        msg = (f"max_frames={bc.max_frames} (config data.max_frames) is below the padded frames of a batch of one "
               f"for {len(which)} of {int(keep.sum())} utterances (e.g. {[utterances[i].id for i in which[:3]]}; "
               f"their buckets pad to up to {t_max} frames); the utterances need {int(need.min())} (shortest) to "
               f"{int(need.max())} (longest) frames")
        if not bc.drop_too_long:
            raise DataError(f"{msg}: raise max_frames to at least {t_max}, or set drop_too_long "
                            f"(config data.drop_too_long) to leave those utterances out")
        for i in which:
            leave_out(i, "oversize", f"its bucket pads to {int(frames_of[bucket_of[i]])} frames, more than "
                                     f"max_frames={bc.max_frames} (drop_too_long)")
    if not keep.any():
        raise ValueError(f"make_loader: every utterance was left out ({len(skipped)}: e.g. "
                         f"{[r['id'] + ': ' + r['reason'] for r in skipped[:3]]})")
    bucket_of = np.where(keep, bucket_of, -1)

    buckets = []
    for b, edge in enumerate(edges):
        t, s = _bucket_lengths(edge, fc, bc)
        bs = max(bc.max_frames // t, 1)
        if bc.max_batch_size:
            bs = min(bs, bc.max_batch_size)
        bs = max(bs // bc.batch_pad_multiple, 1) * bc.batch_pad_multiple
        in_b = bucket_of == b
        n = _round_up(max(int(lab_len[in_b].max()) if in_b.any() else 1, 1), bc.label_pad_multiple)
        buckets.append(_Bucket(float(edge), t, s, bs, n))
    label_buckets = None
    if bc.label_bucket_boundaries is not None:
        label_buckets = tuple(sorted(_round_up(x, bc.label_pad_multiple) for x in bc.label_bucket_boundaries))
        if lab_len[keep].max() > label_buckets[-1]:
            raise ValueError(f"a label has {lab_len[keep].max()} tokens, more than the last label bucket "
                             f"{label_buckets[-1]}")

    used = sorted(set(bucket_of[keep].tolist()))
    shapes = set()
    for b in used:
        bk = buckets[b]
        length = bk.samples if bc.output == "audio" else bk.frames
        for n in (label_buckets or (bk.label_len,)):
            shapes.add((bk.batch_size, length, n))
    sizes = [bk.batch_size for bk in buckets]
    if any(s % row_count for s in sizes):
        raise ValueError(f"row_count={row_count}: batch sizes {sizes} do not split into {row_count} equal row "
                         f"blocks (set BatchConfig.batch_pad_multiple to a multiple of {row_count})")
    counts = [int(np.sum(bucket_of == b)) for b in range(len(buckets))]
    bpe = sum(-(-c // s) for c, s in zip(counts, sizes))
    bpe = _round_up(bpe, shard_count)
    if shard_count > 1:
        bk = buckets[0]   # empty padding batches use bucket 0
        shapes.add((bk.batch_size, bk.samples if bc.output == "audio" else bk.frames,
                    (label_buckets or (bk.label_len,))[0]))
    fingerprint = f"{len(utterances)} utts, {int(keep.sum())} kept, edges={[round(float(e), 3) for e in edges]}"
    if worker_count and worker_count > 0:
        _absl_flags_workaround()
    source = _BatchPlanSource(bucket_of, sizes, bpe, seed, shuffle, shard_count, fingerprint)
    sampler = _BatchSampler(bpe, num_epochs, seed)
    build = _BuildBatch(list(utterances), labels, np.asarray(label_weights, np.float32), buckets, label_buckets,
                        fc, bc, cmvn, augment, row_index, row_count)
    transform = _BuildBatchTransform(build)
    loader = grain.DataLoader(data_source=source, sampler=sampler, operations=[transform],
                              worker_count=worker_count, worker_buffer_size=worker_buffer_size,
                              shard_options=grain.ShardOptions(shard_index=shard_index, shard_count=shard_count,
                                                               drop_remainder=False))
    return AsrLoader(loader, buckets, sorted(shapes), bpe, shard_count, int(keep.sum()), skipped, placeholders,
                     num_epochs)


def _absl_flags_workaround():
    """grain 0.2.18 reads an absl flag when starting worker processes, which raises UnparsedFlagAccessError in
    programs that never parse absl flags (google/grain#1355, fixed upstream by #1361/#1362). Mark them parsed
    (defaults) if nobody has; a program that parses its flags with absl is unaffected."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class _BuildBatchTransform(grain.RandomMapTransform):
    """The grain operation wrapping _BuildBatch (module level, so worker processes can unpickle it)."""

    def __init__(self, build: _BuildBatch):
        self.build = build

    def random_map(self, element, rng):
        return self.build.random_map(element, rng)
