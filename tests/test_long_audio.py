"""jasr.long_audio on real speech: streamed features equal whole-file features; chunked CTC log-probs equal
whole-file log-probs where the context covers the receptive field (a Conformer with its attention switched off,
a Wav2Vec2 conv feature encoder) and approach them with full attention; silence segmentation and AED segment
decoding."""
import glob
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jasr.audio import load_audio
from jasr.features import FeatureConfig, compute_features, num_frames
from jasr.long_audio import (array_blocks, chunked_ctc_log_probs, decode_segments, frame_energy_db,
                             iter_audio_blocks, iter_chunked_log_probs, join_segments, segment_reader,
                             split_on_silence, split_points, stream_energy_db, stream_features, task_log_probs_fn,
                             task_segment_decoder)
from jasr.tasks.conformer import ConformerAEDTask, ConformerCTCTask
from jasr.tasks.wav2vec2 import Wav2Vec2CTCTask
from models.aed import AEDConfig, AEDModel
from models.conformer import ConformerConfig, ConformerCTC
from models.wav2vec2 import FeatureEncoder, Wav2Vec2ForCTC
from models.wav2vec2_config import Wav2Vec2Config, feat_extract_output_lengths

DATA = "/work/shared/data"
SR = 8000


@pytest.fixture(scope="module")
def speech():
    """~7 s of read speech followed by two FSDD digits with 0.4 s of silence between them, at 8 kHz."""
    sent = load_audio(sorted(glob.glob(f"{DATA}/librivox_sense_sensibility/wavs/*"))[0], SR)
    digits = [load_audio(p, SR) for p in sorted(glob.glob(f"{DATA}/fsdd/recordings/*.wav"))[:2]]
    gap = np.zeros(int(0.4 * SR), np.float32)
    return np.concatenate([sent, gap, digits[0], gap, digits[1]])


def random_variables(init, *args, seed=0):
    """Random variables shaped like ``init(key, *args)``, without compiling ``init`` (the tests compare two ways of
    running the same weights, whatever they are); norm scales near 1."""
    shapes = nn.unbox(jax.eval_shape(init, jax.random.PRNGKey(0), *args))
    rng = np.random.default_rng(seed)

    def fill(path, s):
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return jnp.asarray(1.0 + 0.1 * np.abs(rng.standard_normal(s.shape)), s.dtype)
        fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 16
        return jnp.asarray(rng.standard_normal(s.shape) / np.sqrt(fan_in), s.dtype)

    return jax.tree_util.tree_map_with_path(fill, shapes)


# ------------------------------------------------------------------------------------------------------------
# features

@pytest.mark.parametrize("kw", [dict(kind="fbank", normalize="utterance"),
                                dict(kind="fbank", snip_edges=False, use_energy=True, normalize="none"),
                                dict(kind="mfcc", snip_edges=False, normalize="utterance", normalize_variance=False),
                                dict(kind="fbank", normalize="level"), dict(kind="mfcc", normalize="level")])
def test_streamed_features_equal_whole_file(speech, kw):
    fc = FeatureConfig(sample_rate=SR, num_mel_bins=20, **kw)
    whole = compute_features(speech, fc)
    for block in (1, 77, 200, 4001, len(speech)):
        got = np.concatenate(list(stream_features(lambda: array_blocks(speech, block), fc)))
        assert got.shape == whole.shape == (num_frames(len(speech), fc), whole.shape[1])
        np.testing.assert_allclose(got, whole, atol=2e-5, rtol=1e-5)


def test_streamed_features_short_and_bad_input(speech):
    fc = FeatureConfig(sample_rate=SR, num_mel_bins=20, snip_edges=False)
    short = speech[1000:1150]                      # fewer samples than a window: reflection needs the whole file
    np.testing.assert_allclose(np.concatenate(list(stream_features(lambda: array_blocks(short, 7), fc))),
                               compute_features(short, fc), atol=1e-5)
    assert list(stream_features(lambda: array_blocks(speech[:100], 50), FeatureConfig(sample_rate=SR))) == []
    with pytest.raises(ValueError, match="dither"):
        list(stream_features(lambda: [speech], FeatureConfig(sample_rate=SR, dither=1.0)))
    with pytest.raises(ValueError, match="whisper"):
        list(stream_features(lambda: [speech], FeatureConfig(kind="whisper")))
    with pytest.raises(ValueError, match="1-D"):
        list(stream_features(lambda: [speech[:, None]], FeatureConfig(sample_rate=SR)))


def test_audio_blocks_equal_load_audio(tmp_path):
    path = sorted(glob.glob(f"{DATA}/ljspeech_sample/wavs/*"))[0]     # 22.05 kHz FLAC -> 8 kHz, streamed
    whole = load_audio(path, SR)
    got = np.concatenate(list(iter_audio_blocks(path, SR, block_seconds=0.7)))
    assert abs(len(got) - len(whole)) <= 1
    n = min(len(got), len(whole))
    assert np.max(np.abs(got[:n] - whole[:n])) < 1e-3
    same = np.concatenate(list(iter_audio_blocks(path, None, block_seconds=1.0)))
    np.testing.assert_array_equal(same, load_audio(path, None))
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio")
    with pytest.raises(Exception, match="bad.wav"):
        list(iter_audio_blocks(str(bad), SR))


# ------------------------------------------------------------------------------------------------------------
# chunked CTC: Conformer

def _zero_attention(params):
    """The attention's output projection zeroed: each block is then feed-forward + convolution only, so the
    encoder's receptive field is finite (front end + num_layers * (conv_kernel - 1) / 2 output frames)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if any(getattr(k, "key", None) == "o_proj" for k in path) else x, params)


@pytest.fixture(scope="module", params=[(4, "conv2d"), (2, "dw_striding")])
def conformer(request, speech):
    sub, kind = request.param
    cfg = ConformerConfig.tiny(vocab_size=7, subsampling=sub, subsampling_type=kind)
    model = ConformerCTC(cfg)
    params = random_variables(model.init, jnp.zeros((1, 64, 20)), jnp.zeros((1, 64)))["params"]
    fn = jax.jit(lambda p, x, pad: (lambda o: (jax.nn.log_softmax(o[0], -1), o[1]))(model.apply({"params": p}, x,
                                                                                               pad)))
    feats = compute_features(speech, FeatureConfig(sample_rate=SR, num_mel_bins=20, normalize="utterance"))
    return cfg, params, fn, feats


REF_FRAMES = 304        # whole-file references run padded to one shape (padding is masked: same valid outputs)


def _whole(fn, params, x):
    a = np.zeros((1, REF_FRAMES) + x.shape[1:], np.float32)
    a[0, :len(x)] = x
    lp, pads = fn(params, a, (np.arange(REF_FRAMES)[None] >= len(x)).astype(np.float32))
    return np.asarray(lp[0])[np.asarray(pads[0]) < 0.5]


@settings(max_examples=5, deadline=None)
@given(t=st.integers(1, REF_FRAMES), batch=st.sampled_from([1, 3]), block=st.sampled_from([5, 64, 1000]))
def test_chunked_equals_whole_file_without_attention(conformer, t, batch, block):
    """Context (32 input frames) covers the receptive field: chunked == whole-file log-probs, for any length
    (not a multiple of the chunk, shorter than one chunk) and any block size of the input stream."""
    cfg, params, fn, feats = conformer
    p = _zero_attention(params)
    x = feats[:max(t, cfg.min_frames())]
    want = _whole(fn, p, x)
    f = lambda a, pad: fn(p, a, pad)        # noqa: E731  (one window shape: compiled once per batch size)
    parts = list(iter_chunked_log_probs(f, array_blocks(x, block), chunk_frames=32, left_context=32,
                                        right_context=32, subsampling=cfg.subsampling, batch_size=batch))
    got = np.concatenate(parts)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert all(len(q) <= 32 // cfg.subsampling for q in parts)


def test_file_ending_inside_a_right_context(conformer):
    """A file that ends 2 frames into chunk 1's right context: its window is cut short by the file's end, its chunk
    gets the frames the file has (valid convolutions give fewer), and the total is the whole file's."""
    cfg, params, fn, feats = conformer
    p = _zero_attention(params)
    x = feats[:66]
    got = chunked_ctc_log_probs(lambda a, pad: fn(p, a, pad), x, chunk_frames=32, left_context=32, right_context=32,
                                subsampling=cfg.subsampling)
    np.testing.assert_allclose(got, _whole(fn, p, x), atol=2e-5)


def test_chunked_with_attention(conformer):
    """Full self-attention (random weights: diffuse attention, the hardest case) is approximated, better with more
    context; a window that covers the whole file gives whole-file log-probs (its padding is masked)."""
    cfg, params, fn, feats = conformer
    if cfg.subsampling_type == "conv2d":
        return                                 # one front end is enough here (bookkeeping is tested above)
    x = feats[:288]
    want = _whole(fn, params, x)
    f = lambda a, pad: fn(params, a, pad)   # noqa: E731
    err = {}
    for chunk, ctx in ((64, 16), (64, 128)):
        got = chunked_ctc_log_probs(f, x, chunk_frames=chunk, left_context=ctx, right_context=ctx,
                                    subsampling=cfg.subsampling)
        assert got.shape == want.shape
        err[ctx] = np.mean(np.abs(got - want))
    assert err[128] < err[16] < 0.25          # measured 0.06-0.19 (mean |delta log-prob|, nats)
    got = chunked_ctc_log_probs(f, x, chunk_frames=288, left_context=0, right_context=32,
                                subsampling=cfg.subsampling)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_chunking_bad_arguments(conformer):
    cfg, params, fn, feats = conformer
    f = lambda a, pad: fn(params, a, pad)   # noqa: E731
    with pytest.raises(ValueError, match="multiple of subsampling"):
        chunked_ctc_log_probs(f, feats, chunk_frames=66, left_context=0, right_context=8, subsampling=4)
    with pytest.raises(ValueError, match="left_context"):
        chunked_ctc_log_probs(f, feats, chunk_frames=64, left_context=-4, right_context=8, subsampling=4)
    with pytest.raises(ValueError, match="at least one frame"):
        chunked_ctc_log_probs(f, feats[:0], chunk_frames=64, left_context=0, right_context=8, subsampling=4)
    if cfg.subsampling_type == "conv2d":       # valid convolutions: the window's last output frames are missing
        with pytest.raises(ValueError, match="right_context=0 is too small"):
            chunked_ctc_log_probs(f, feats, chunk_frames=64, left_context=0, right_context=0, subsampling=4)


def test_task_log_probs_fn_reads_features(conformer):
    """task_log_probs_fn through ConformerCTCTask.ctc_logits (features pass the front end untouched)."""
    cfg, params, fn, feats = conformer
    if cfg.subsampling_type == "conv2d":
        return
    task = ConformerCTCTask(model=ConformerCTC(cfg))
    f = task_log_probs_fn(task, types.SimpleNamespace(params=params, model_state={}), raw_audio=False)
    x, pad = feats[None, :128], np.zeros((1, 128), np.float32)
    np.testing.assert_allclose(np.asarray(f(x, pad)[0]), np.asarray(fn(params, x, pad)[0]), atol=1e-6)


# ------------------------------------------------------------------------------------------------------------
# chunked CTC: Wav2Vec2 (samples in, conv feature encoder stride)

W2V = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
           conv_dim=(16, 24, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8,
           num_conv_pos_embedding_groups=4, vocab_size=12, hidden_dropout=0.0, activation_dropout=0.0,
           attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
           feat_extract_norm="layer")


def test_wav2vec2_feature_encoder_chunked_exactly(speech):
    """The sample-domain bookkeeping (stride 20 samples, valid convolutions) with a model of finite receptive field
    (the conv feature encoder, 40 samples): chunked == whole file."""
    cfg = Wav2Vec2Config(**W2V)
    enc = FeatureEncoder(cfg)
    x = speech[:12345]
    params = random_variables(enc.init, jnp.zeros((1, 400)), seed=1)

    @jax.jit
    def f(a, pad):
        h = enc.apply(params, a)
        n = feat_extract_output_lengths(cfg, jnp.sum(1.0 - pad, axis=1).astype(jnp.int32))
        return jax.nn.log_softmax(h, -1), (jnp.arange(h.shape[1])[None] >= n[:, None]).astype(jnp.float32)

    want = np.asarray(f(x[None], np.zeros((1, len(x)), np.float32))[0][0])
    want = want[:int(feat_extract_output_lengths(cfg, len(x)))]
    got = chunked_ctc_log_probs(f, x, chunk_frames=2000, left_context=100, right_context=100, subsampling=20,
                                batch_size=2)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_wav2vec2_ctc_chunked(speech):
    """The whole Wav2Vec2-CTC through its task (each window normalised on its own, full attention): same frame
    count as the whole file, close log-probs, whole-file log-probs when one window covers the file."""
    cfg = Wav2Vec2Config(**W2V)
    task = Wav2Vec2CTCTask(model=Wav2Vec2ForCTC(cfg))
    x = speech[:3960]
    params = random_variables(task.model.init, jnp.zeros((1, 400)), jnp.zeros((1, 400)), seed=2)["params"]
    f = task_log_probs_fn(task, types.SimpleNamespace(params=params, model_state={}), raw_audio=True)
    lp, pads = f(x[None], np.zeros((1, len(x)), np.float32))
    want = np.asarray(lp[0])[np.asarray(pads[0]) < 0.5]
    got = chunked_ctc_log_probs(f, x, chunk_frames=1000, left_context=1500, right_context=1500, subsampling=20)
    assert got.shape == want.shape
    assert np.mean(np.abs(got - want)) < 0.1
    whole = chunked_ctc_log_probs(f, x, chunk_frames=3960, left_context=0, right_context=40, subsampling=20)
    np.testing.assert_allclose(whole, want, atol=2e-4)


# ------------------------------------------------------------------------------------------------------------
# segmentation and AED

@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 60000), max_s=st.floats(0.05, 3.0), frac=st.floats(0.05, 1.0))
def test_split_covers_every_sample_once(speech, n, max_s, frac):
    x = speech[:n]
    segs = split_on_silence(x, SR, max_seconds=max_s, search_seconds=max_s * frac)
    assert segs[0][0] == 0 and segs[-1][1] == n
    assert all(a < b <= a + int(max_s * SR) for a, b in segs)
    assert all(segs[i][1] == segs[i + 1][0] for i in range(len(segs) - 1))
    search = max(int(max_s * frac * SR), 1)
    assert all(b - a >= int(max_s * SR) - search for a, b in segs[:-1])


def test_streamed_energy_and_segment_reader(speech):
    """Energies of a block stream equal those of the whole waveform; segment_reader reads [start, end)."""
    want = frame_energy_db(speech, 80)
    for block in (1, 79, 80, 1000, len(speech)):
        got, n = stream_energy_db(array_blocks(speech, block), 80)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert n == len(speech)
    path = sorted(glob.glob(f"{DATA}/fsdd/recordings/*.wav"))[0]          # 8 kHz: no resampling
    whole = load_audio(path, SR)
    np.testing.assert_array_equal(segment_reader(path, SR)(100, 900), whole[100:900])
    energy, n = stream_energy_db(array_blocks(speech, 333), 80)
    segs = split_points(energy, 80, n, max_samples=SR, search_samples=SR // 2)
    assert segs == split_on_silence(speech, SR, max_seconds=1.0, frame_ms=10.0)


def test_split_cuts_in_silence(speech):
    """The 0.4 s gaps of the fixture are where the cuts go (no digit is cut)."""
    sent = len(speech) - 2 * int(0.4 * SR) - sum(len(load_audio(p, SR)) for p in
                                                  sorted(glob.glob(f"{DATA}/fsdd/recordings/*.wav"))[:2])
    gap = (sent, sent + int(0.4 * SR))
    segs = split_on_silence(speech, SR, max_seconds=(gap[1] + 0.2 * SR) / SR, search_seconds=1.5)
    assert gap[0] < segs[0][1] < gap[1]
    with pytest.raises(ValueError, match="search_samples"):
        split_on_silence(speech, SR, max_seconds=1.0, search_seconds=2.0)
    with pytest.raises(ValueError, match="1-D"):
        split_on_silence(speech[None], SR, max_seconds=1.0)


def test_aed_segments_decode_and_join(speech):
    """task_segment_decoder + decode_segments (device features per segment, fixed shape, padding rows) give the
    tokens of ConformerAEDTask.greedy_decode on host features of each segment; join_segments keeps the offsets."""
    vocab = 6
    model = AEDModel(AEDConfig.tiny(vocab + 1))
    task = ConformerAEDTask(model=model, max_decode_tokens=5)
    fc = FeatureConfig(sample_rate=SR, num_mel_bins=20, normalize="utterance")
    pad_samples = 2 * SR
    frames = num_frames(pad_samples, fc)
    variables = random_variables(model.init, jnp.zeros((1, frames, 20)), jnp.zeros((1, frames)),
                                 jnp.ones((1, 3), jnp.int32), jnp.zeros((1, 3)), seed=3)
    state = types.SimpleNamespace(params=variables["params"], model_state={})
    segs = split_on_silence(speech[:5 * SR], SR, max_seconds=2.0)
    pieces = decode_segments(task_segment_decoder(task, state, fc), speech, segs, sample_rate=SR,
                             pad_samples=pad_samples, batch_size=2)
    assert [(p["start"], p["end"]) for p in pieces] == [(a / SR, b / SR) for a, b in segs]
    greedy = jax.jit(task.greedy_decode)
    for (a, b), piece in zip(segs, pieces):
        x = np.zeros((1, frames, 20), np.float32)
        f = compute_features(speech[a:b], fc)
        x[0, :len(f)] = f
        pad = (np.arange(frames)[None] >= len(f)).astype(np.float32)
        ids, n = greedy(state.params, {}, {"features": x, "feature_paddings": pad})
        assert piece["tokens"] == np.asarray(ids[0, :int(n[0])]).tolist()
    joined = join_segments(pieces, lambda t: " ".join(map(str, t)))
    assert [s["start"] for s in joined["segments"]] == [round(a / SR, 3) for a, _ in segs]
    assert joined["text"] == " ".join(s["text"] for s in joined["segments"] if s["text"])
    with pytest.raises(ValueError, match="longer than pad_samples"):
        decode_segments(lambda a, p: [[]] * len(a), speech, [(0, pad_samples + 1)], sample_rate=SR,
                        pad_samples=pad_samples)
