"""Long audio in bounded memory: streamed audio and features, a chunked CTC encoder, silence segmentation for AED.

Everything here is a pure function or generator over numpy arrays; memory is bounded by the block, chunk and
segment sizes, not by the length of the file:

* :func:`iter_audio_blocks` reads a file block by block as mono float32 at the model's rate (soxr's streaming
  resampler, so the samples equal :func:`jasr.audio.load_audio`'s up to the resampler's float error).
* :func:`iter_features` turns sample blocks into Kaldi fbank / MFCC frames [t, F] equal to
  :func:`jasr.features.compute_features` of the whole waveform (frames are computed independently, so the blocks
  give the same numbers; ``snip_edges=False`` reflects at both ends as the whole-file code does).
  :func:`stream_features` adds normalisation: ``"utterance"`` needs the statistics of the whole file, so it reads
  the audio twice (pass 1 accumulates mean / std in float64, pass 2 normalises), ``"global"`` uses CMVN stats.
* :func:`iter_chunked_log_probs` runs a CTC model over fixed-shape windows ``left + chunk + right`` input frames
  (or samples) wide, keeps each window's central output frames and yields them in order. One window shape means
  one compiled program; the last window is padded and its padding masked (paddings 1.0). Windows start on
  multiples of the model's subsampling, so that a window's output frame j is the file's output frame
  ``start / subsampling + j``. Where the context covers the model's receptive field (convolutions, masked or local
  attention) the result equals whole-file log-probs up to float error; with full self-attention it approximates
  them (bench/results/long_audio.md measures how closely).
* :func:`split_on_silence` cuts a waveform for an attention encoder-decoder (which has no frame alignment to merge
  overlapping windows with) at the quietest point of a search window before each ``max_seconds`` limit; the
  segments cover every sample exactly once. :func:`decode_segments` decodes them in fixed-shape batches and
  :func:`join_segments` joins their texts with time offsets.

:func:`task_log_probs_fn` and :func:`task_segment_decoder` build the per-window / per-segment functions from a
:class:`jasr.tasks.Task` (its ``ctc_log_probs``, ``greedy_decode`` and ``beam_decode``).
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence

import jax
import numpy as np
import soundfile as sf
import soxr

from jasr.audio import AudioError, load_audio, to_mono
from jasr.cmvn import CmvnStats, accumulate_cmvn, apply_cmvn
from jasr.features import FeatureConfig, compute_features, compute_features_jax, level_gain, num_frames

__all__ = ["array_blocks", "chunked_ctc_log_probs", "decode_segments", "frame_energy_db", "iter_audio_blocks",
           "iter_chunked_log_probs", "iter_features", "join_segments", "segment_reader", "split_on_silence",
           "split_points", "stream_energy_db", "stream_features", "task_log_probs_fn", "task_segment_decoder"]


# ------------------------------------------------------------------------------------------------------------
# audio

def iter_audio_blocks(path: str, sample_rate: int | None, *, block_seconds: float = 30.0) -> Iterator[np.ndarray]:
    """Mono float32 blocks of the audio file `path` at `sample_rate` (None: the file's rate), about
    `block_seconds` each (the resampler's delay makes the first shorter). Raises AudioError naming the file."""
    if block_seconds <= 0:
        raise ValueError(f"block_seconds must be > 0, got {block_seconds}")
    try:
        f = sf.SoundFile(path)
    except Exception as e:   # soundfile raises LibsndfileError / RuntimeError / TypeError
        raise AudioError(f"cannot read audio file {path}: {e}") from e
    with f:
        sr = int(f.samplerate)
        out_sr = sr if sample_rate is None else int(sample_rate)
        stream = soxr.ResampleStream(sr, out_sr, 1, dtype="float32", quality="HQ") if out_sr != sr else None
        n = max(int(block_seconds * sr), 1)
        while True:
            try:
                data = f.read(frames=n, dtype="float32", always_2d=True)
            except Exception as e:
                raise AudioError(f"cannot decode audio file {path}: {e}") from e
            last = data.shape[0] < n
            x = to_mono(data)
            if not np.all(np.isfinite(x)):
                raise AudioError(f"audio file {path} decodes to non-finite samples")
            if stream is not None:
                x = stream.resample_chunk(x, last=last)
            if x.shape[0]:
                yield np.asarray(x, np.float32)
            if last:
                return


def array_blocks(x: np.ndarray, block: int) -> Iterator[np.ndarray]:
    """`x` in consecutive pieces of `block` rows along axis 0 (the last may be shorter)."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    for i in range(0, x.shape[0], block):
        yield x[i:i + block]


# ------------------------------------------------------------------------------------------------------------
# features

def _check_stream_config(config: FeatureConfig) -> None:
    if config.kind not in ("fbank", "mfcc"):
        raise ValueError(f"streamed features are Kaldi fbank or MFCC, got kind {config.kind!r} (Whisper log-mel "
                         f"clamps to the whole file's maximum)")
    if config.dither != 0.0:
        raise ValueError("streamed features need dither=0.0 (decoding is deterministic)")


def iter_features(blocks: Iterable[np.ndarray], config: FeatureConfig) -> Iterator[np.ndarray]:
    """Un-normalised Kaldi fbank / MFCC frames of a waveform given as consecutive 1-D sample blocks:
    yields float32 [t_i, F] whose concatenation equals ``compute_features(whole, config)`` with
    ``normalize="none"`` (``num_frames(S, config)`` frames in all). Holds O(block + window) samples."""
    _check_stream_config(config)
    cfg = FeatureConfig(**{**config.__dict__, "normalize": "none", "snip_edges": True, "cmvn_path": None})
    win, shift = config.window_length, config.window_shift
    c = 0 if config.snip_edges else shift // 2 - win // 2      # first sample of frame t: t * shift + c
    head = np.zeros(0, np.float64)                             # the first `win` samples (reflection at the start)
    buf, buf0, seen, t_next = np.zeros(0, np.float64), 0, 0, 0

    def frames(t0: int, t1: int, n: int | None) -> np.ndarray:
        idx = t0 * shift + c + np.arange((t1 - t0 - 1) * shift + win)
        idx = np.where(idx < 0, -idx - 1, idx)
        if n is not None:
            idx = np.where(idx >= n, 2 * n - 1 - idx, idx)
        if idx.size and (idx.min() < 0 or (n is not None and idx.max() >= n)):
            raise ValueError(f"snip_edges=False: {n} samples are too few to reflect a {win}-sample window at the "
                             f"edges")
        from_head = idx < buf0
        sig = np.empty(idx.shape, np.float64)
        sig[from_head] = head[idx[from_head]]
        sig[~from_head] = buf[idx[~from_head] - buf0]
        return compute_features(sig, cfg)

    for block in blocks:
        b = np.asarray(block)
        if b.ndim != 1 or not np.issubdtype(b.dtype, np.floating):
            raise ValueError(f"audio blocks must be 1-D floating point, got shape {b.shape} dtype {b.dtype}")
        if head.shape[0] < win:
            head = np.concatenate([head, b[:win - head.shape[0]].astype(np.float64)])
        buf = np.concatenate([buf, b.astype(np.float64)])
        seen += b.shape[0]
        t_end = (seen - c - win) // shift + 1 if seen - c - win >= 0 else 0
        if t_end > t_next:
            yield frames(t_next, t_end, None)
            t_next = t_end
            keep = max(t_next * shift + c, 0)
            buf, buf0 = buf[keep - buf0:], keep
    total = num_frames(seen, config)
    if total > t_next:
        yield frames(t_next, total, seen)


def stream_features(open_blocks: Callable[[], Iterable[np.ndarray]], config: FeatureConfig, *,
                    cmvn: CmvnStats | None = None) -> Iterator[np.ndarray]:
    """Frames [t_i, F] of a long waveform, normalised as `config` says, equal to ``compute_features(whole,
    config)`` up to float error. `open_blocks()` returns a fresh iterable of sample blocks (called twice for
    ``normalize="utterance"``: pass 1 accumulates the file's mean and std, pass 2 yields the normalised frames;
    float64 sums with the std floored at 1e-5 as utterance_cmvn does; ``"level"``: pass 1 sums the squared
    samples, pass 2 scales the blocks). ``"global"`` takes `cmvn` or the stats file ``config.cmvn_path``."""
    _check_stream_config(config)
    if config.normalize == "none":
        yield from iter_features(open_blocks(), config)
        return
    if config.normalize == "level":
        sums = np.zeros(2)
        for block in open_blocks():
            b = np.asarray(block, np.float64)
            sums += (np.dot(b, b), b.shape[0])
        gain = level_gain(*sums)
        yield from iter_features((np.asarray(b, np.float64) * gain for b in open_blocks()), config)
        return
    if config.normalize == "utterance":
        try:
            stats = accumulate_cmvn(iter_features(open_blocks(), config), min_std=1e-5)
        except ValueError:          # no frames at all: nothing to normalise
            return
    else:
        if cmvn is None and not config.cmvn_path:
            raise ValueError("normalize='global' needs CMVN stats: pass cmvn= or set FeatureConfig.cmvn_path")
        stats = cmvn if cmvn is not None else CmvnStats.load(config.cmvn_path)
    for x in iter_features(open_blocks(), config):
        yield apply_cmvn(x, stats, variance=config.normalize_variance)


# ------------------------------------------------------------------------------------------------------------
# chunked CTC encoder

def _check_chunking(chunk_frames: int, left_context: int, right_context: int, subsampling: int,
                    batch_size: int) -> None:
    if not isinstance(subsampling, (int, np.integer)) or subsampling < 1:
        raise ValueError(f"subsampling must be a positive int, got {subsampling!r}")
    for name, v, lo in (("chunk_frames", chunk_frames, 1), ("left_context", left_context, 0),
                        ("right_context", right_context, 0)):
        if not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if v % subsampling:
            raise ValueError(f"{name}={v} must be a multiple of subsampling={subsampling} (windows must start on "
                             f"an output frame)")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def iter_chunked_log_probs(log_probs_fn: Callable, blocks: Iterable[np.ndarray], *, chunk_frames: int,
                           left_context: int, right_context: int, subsampling: int,
                           batch_size: int = 1) -> Iterator[np.ndarray]:
    """CTC log-probs of a long input, chunk by chunk: yields float32 [n_k, V] whose concatenation is the file's
    [T', V] (T' as the model gives for the whole input).

    `blocks`: consecutive pieces [t_i, ...] of the input along time (feature frames [t_i, F] or samples [t_i]).
    `log_probs_fn(x [B, W, ...], paddings [B, W]) -> (log_probs [B, W', V], paddings [B, W'])` with
    ``W = left_context + chunk_frames + right_context`` (one shape: jit it once); input rows are prefix-valid,
    paddings 1.0 where padded. Chunk k covers input frames [k C, (k + 1) C) and is decoded in the window that
    starts ``max(0, k C - left_context)`` (so the first chunks have extra right context); the window's output
    frames for its chunk are kept. `subsampling`: input frames per output frame (e.g. 4 for a 4x Conformer, 320
    samples for Wav2Vec2); every size must be a multiple of it. Holds O(W * batch_size) input frames."""
    _check_chunking(chunk_frames, left_context, right_context, subsampling, batch_size)
    c, lc, s = int(chunk_frames), int(left_context), int(subsampling)
    w = lc + c + int(right_context)
    buf, buf0, seen, done = None, 0, 0, False
    pending: list[tuple[int, int, np.ndarray, bool]] = []     # (chunk k, window start, rows, window ends the file)
    it = iter(blocks)

    def run(batch) -> Iterator[np.ndarray]:
        x = np.zeros((batch_size, w) + buf.shape[1:], buf.dtype)
        pads = np.ones((batch_size, w), np.float32)
        for r, (_, _, rows, _) in enumerate(batch):
            x[r, :rows.shape[0]], pads[r, :rows.shape[0]] = rows, 0.0
        lp, out_pads = log_probs_fn(x, pads)
        lp, out_pads = np.asarray(lp), np.asarray(out_pads)
        if lp.ndim != 3 or out_pads.shape != lp.shape[:2] or lp.shape[0] != batch_size:
            raise ValueError(f"log_probs_fn must return ([B, W', V], [B, W']) for B={batch_size}, got "
                             f"{lp.shape} and {out_pads.shape}")
        for r, (k, ws, _, at_end) in enumerate(batch):
            n_out = int(np.sum(out_pads[r] < 0.5))
            lo = (k * c - ws) // s
            hi = lo + c // s
            if not at_end and hi > n_out:      # a window inside the file must give its chunk's frames
                raise ValueError(f"right_context={right_context} is too small: a window of {w} input frames gives "
                                 f"{n_out} output frames, its chunk needs {hi}")
            yield lp[r, lo:min(hi, n_out)].astype(np.float32)

    k = 0
    while True:
        ws = _start(k, lc, c)
        # one frame past the window, so that a full window tells whether the file goes on after its chunk
        while not done and (buf is None or buf0 + buf.shape[0] <= ws + w):
            try:
                b = np.asarray(next(it))
            except StopIteration:
                done = True
                break
            if b.ndim == 0 or b.shape[0] == 0:
                continue
            if buf is not None and b.shape[1:] != buf.shape[1:]:
                raise ValueError(f"input blocks changed shape from {buf.shape[1:]} to {b.shape[1:]}")
            buf = b if buf is None else np.concatenate([buf, b])
            seen += b.shape[0]
        if buf is None or k * c >= seen:
            break
        last = done and (k + 1) * c >= seen
        pending.append((k, ws, buf[ws - buf0:ws - buf0 + w], done and ws + w >= seen))
        if len(pending) == batch_size or last:
            yield from run(pending)
            pending = []
        if last:
            return
        k += 1
        keep = _start(k, lc, c)
        buf, buf0 = buf[keep - buf0:], keep
    if pending:
        yield from run(pending)


def _start(k: int, left: int, chunk: int) -> int:
    """Input frame where the window of chunk k starts."""
    return max(0, k * chunk - left)


def chunked_ctc_log_probs(log_probs_fn: Callable, features: np.ndarray, *, chunk_frames: int, left_context: int,
                          right_context: int, subsampling: int, batch_size: int = 1) -> np.ndarray:
    """:func:`iter_chunked_log_probs` of a whole input array [T, ...] -> float32 [T', V]."""
    x = np.asarray(features)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(f"features must have at least one frame along axis 0, got shape {x.shape}")
    parts = list(iter_chunked_log_probs(log_probs_fn, array_blocks(x, max(int(chunk_frames), 1)),
                                        chunk_frames=chunk_frames, left_context=left_context,
                                        right_context=right_context, subsampling=subsampling,
                                        batch_size=batch_size))
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def task_log_probs_fn(task, state, *, raw_audio: bool) -> Callable:
    """The jitted window function of a task with a CTC head for :func:`iter_chunked_log_probs`: (x, paddings) ->
    (log_probs float32, paddings) through ``task.ctc_log_probs`` with batch keys ``audio`` / ``audio_paddings``
    (`raw_audio`: a waveform model, which normalises each window on its own) or ``features`` / ``feature_paddings``
    (features computed and normalised by the caller, e.g. :func:`stream_features`: the task's front end then
    passes them through). `state`: anything with ``params`` and ``model_state`` (a TrainState)."""
    if not task.has_ctc_head:
        raise ValueError(f"task {task.name!r} has no CTC head: decode it with split_on_silence + decode_segments")
    keys = ("audio", "audio_paddings") if raw_audio else ("features", "feature_paddings")

    @jax.jit
    def apply(params, model_state, x, pads):
        return task.ctc_log_probs(params, model_state, {keys[0]: x, keys[1]: pads})

    return lambda x, pads: apply(state.params, state.model_state, x, pads)


# ------------------------------------------------------------------------------------------------------------
# silence segmentation (attention encoder-decoders)

def frame_energy_db(samples: np.ndarray, frame_samples: int) -> np.ndarray:
    """Mean-square energy in dB (floored at -100) of consecutive `frame_samples`-sample frames: [S] ->
    [ceil(S / frame_samples)] float64 (the last frame may be shorter)."""
    x = np.asarray(samples, np.float64)
    if x.ndim != 1:
        raise ValueError(f"samples must be 1-D, got shape {x.shape}")
    if frame_samples < 1:
        raise ValueError(f"frame_samples must be >= 1, got {frame_samples}")
    n = -(-x.shape[0] // frame_samples)
    sq = np.zeros(n * frame_samples)
    sq[:x.shape[0]] = x * x
    counts = np.minimum(frame_samples, x.shape[0] - np.arange(n) * frame_samples)
    return 10.0 * np.log10(np.maximum(sq.reshape(n, frame_samples).sum(1) / np.maximum(counts, 1), 1e-10))


def stream_energy_db(blocks: Iterable[np.ndarray], frame_samples: int) -> tuple[np.ndarray, int]:
    """(:func:`frame_energy_db` of a waveform given as consecutive 1-D sample blocks of any sizes, its sample count
    S): the same [ceil(S / frame_samples)] float64 energies, holding one block at a time plus the energies."""
    if frame_samples < 1:
        raise ValueError(f"frame_samples must be >= 1, got {frame_samples}")
    out, rest, total = [], np.zeros(0, np.float64), 0
    for b in blocks:
        total += len(b)
        x = np.concatenate([rest, np.asarray(b, np.float64)])
        n = x.shape[0] // frame_samples * frame_samples
        if n:
            out.append(frame_energy_db(x[:n], frame_samples))
        rest = x[n:]
    if rest.shape[0]:
        out.append(frame_energy_db(rest, frame_samples))
    return (np.concatenate(out) if out else np.zeros(0)), total


def segment_reader(path: str, sample_rate: int) -> Callable[[int, int], np.ndarray]:
    """read(start, end) -> float32 samples [start, end) of an audio file at `sample_rate` (positions at that rate;
    each segment is read and resampled on its own, for :func:`decode_segments`)."""
    def read(start: int, end: int) -> np.ndarray:
        x = load_audio(path, sample_rate, offset=start / sample_rate, duration=(end - start) / sample_rate)
        return x[:end - start]
    return read


def split_points(energy_db: np.ndarray, frame_samples: int, num_samples: int, *, max_samples: int,
                 search_samples: int, smooth_frames: int = 11) -> list[tuple[int, int]]:
    """Segments [(start, end)) of `num_samples` samples, each at most `max_samples` long, from per-frame energies
    (:func:`frame_energy_db` of `frame_samples`-sample frames): while more than `max_samples` remain after the
    current start, cut at the centre of the frame of least smoothed energy (moving mean over `smooth_frames`
    frames; the latest on ties) whose centre lies in the last `search_samples` before the limit. The segments are
    consecutive and cover every sample exactly once."""
    e = np.asarray(energy_db, np.float64)
    if not 0 < search_samples <= max_samples:
        raise ValueError(f"search_samples must be in (0, max_samples={max_samples}], got {search_samples}")
    if max_samples < 2 * frame_samples:
        raise ValueError(f"max_samples={max_samples} must be at least two energy frames ({2 * frame_samples})")
    if e.shape != (-(-num_samples // frame_samples),):
        raise ValueError(f"energy_db has shape {e.shape}; {num_samples} samples in frames of {frame_samples} "
                         f"need {-(-num_samples // frame_samples)}")
    if smooth_frames > 1 and e.size:
        pad = smooth_frames // 2
        ep = np.pad(e, (pad, smooth_frames - 1 - pad), mode="edge")
        e = np.convolve(ep, np.ones(smooth_frames) / smooth_frames, mode="valid")
    centres = np.arange(e.shape[0]) * frame_samples + frame_samples // 2
    out, pos = [], 0
    while num_samples - pos > max_samples:
        limit = pos + max_samples
        lo, hi = np.searchsorted(centres, [limit - search_samples, limit], side="left")
        hi = min(hi + (hi < len(centres) and centres[hi] == limit), len(centres))
        cand = np.arange(lo, hi)
        cand = cand[(centres[cand] > pos) & (centres[cand] <= limit)]
        cut = limit if cand.size == 0 else int(centres[cand[::-1][np.argmin(e[cand[::-1]])]])
        out.append((pos, cut))
        pos = cut
    out.append((pos, num_samples))
    return out


def split_on_silence(samples: np.ndarray, sample_rate: int, *, max_seconds: float, search_seconds: float | None = None,
                     frame_ms: float = 10.0, smooth_ms: float = 110.0) -> list[tuple[int, int]]:
    """Segments [(start, end)) in samples of a waveform [S], each at most `max_seconds`, cut at the quietest
    smoothed point (frames of `frame_ms`, moving mean over `smooth_ms`) within the last `search_seconds`
    (default: half of `max_seconds`) before each limit; see :func:`split_points`."""
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"samples must be 1-D [num_samples], got shape {x.shape}")
    if sample_rate <= 0 or max_seconds <= 0:
        raise ValueError(f"sample_rate and max_seconds must be > 0, got {sample_rate}, {max_seconds}")
    fs = max(int(round(frame_ms * 1e-3 * sample_rate)), 1)
    search = max_seconds / 2 if search_seconds is None else search_seconds
    return split_points(frame_energy_db(x, fs), fs, x.shape[0], max_samples=int(max_seconds * sample_rate),
                        search_samples=max(int(search * sample_rate), 1),
                        smooth_frames=max(int(round(smooth_ms / frame_ms)), 1))


def decode_segments(decode_fn: Callable, read: Callable[[int, int], np.ndarray] | np.ndarray,
                    segments: Sequence[tuple[int, int]], *, sample_rate: int, pad_samples: int,
                    batch_size: int = 4) -> list[dict]:
    """Decodes segments of a waveform in fixed-shape batches: ``decode_fn(audio [B, pad_samples], paddings [B,
    pad_samples]) -> token id lists`` (one per row; padding rows are all-padded and ignored). `read(start, end)`
    returns the samples of [start, end) (or pass the waveform array itself). Returns [{"start", "end" (seconds),
    "tokens"}] in order; holds one batch of samples at a time."""
    if callable(read):
        reader = read
    else:
        wave = np.asarray(read)
        reader = lambda a, b: wave[a:b]   # noqa: E731
    for a, b in segments:
        if not 0 <= a < b or b - a > pad_samples:
            raise ValueError(f"segment ({a}, {b}) is empty or longer than pad_samples={pad_samples}")
    out = []
    for i in range(0, len(segments), batch_size):
        part = list(segments[i:i + batch_size])
        audio = np.zeros((batch_size, pad_samples), np.float32)
        pads = np.ones((batch_size, pad_samples), np.float32)
        for r, (a, b) in enumerate(part):
            x = np.asarray(reader(a, b), np.float32)
            audio[r, :x.shape[0]], pads[r, :x.shape[0]] = x, 0.0
        toks = decode_fn(audio, pads)
        for r, (a, b) in enumerate(part):
            out.append({"start": a / sample_rate, "end": b / sample_rate, "tokens": [int(t) for t in toks[r]]})
    return out


def join_segments(pieces: Sequence[dict], decode_text: Callable[[list[int]], str]) -> dict:
    """{"text": the segments' texts joined by spaces, "segments": [{"start", "end", "text"}]} of
    :func:`decode_segments`' output (`decode_text`: token ids -> text, e.g. a tokenizer's decode)."""
    segs = [{"start": round(p["start"], 3), "end": round(p["end"], 3),
             "text": " ".join(decode_text(p["tokens"]).split())} for p in pieces]
    return {"text": " ".join(s["text"] for s in segs if s["text"]), "segments": segs}


def task_segment_decoder(task, state, feature_config: FeatureConfig | None, *, options=None,
                         cmvn: CmvnStats | None = None) -> Callable:
    """A jitted segment decoder of a task for :func:`decode_segments`: audio [B, S] + paddings -> token id lists,
    through ``task.beam_decode`` (with `options`, a SearchOptions) or ``task.greedy_decode``. With a
    `feature_config`, features are computed on device per segment (normalised per segment, as training
    utterances are) and passed as ``features``; without, the batch carries raw ``audio`` (waveform models)."""
    @jax.jit
    def apply(params, model_state, audio, pads):
        if feature_config is not None:
            feats, fpads = compute_features_jax(audio, pads, feature_config, cmvn=cmvn)
            batch = {"features": feats, "feature_paddings": fpads}
        else:
            batch = {"audio": audio, "audio_paddings": pads}
        if options is not None:
            out = task.beam_decode(params, model_state, batch, options)
            return out["ids"][:, 0], out["lengths"][:, 0]
        return task.greedy_decode(params, model_state, batch)

    def decode(audio, pads):
        ids, lengths = jax.device_get(apply(state.params, state.model_state, audio, pads))
        return [ids[r, :int(lengths[r])].tolist() for r in range(ids.shape[0])]
    return decode
