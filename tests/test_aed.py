"""Transformer encoder/decoder, LSTM decoder and the AED model against torch references (nn.TransformerEncoder /
nn.TransformerDecoder / nn.LSTM with the same weights, torch KLDivLoss label smoothing, torch ctc_loss) and
properties (KV-cache steps == teacher forcing, scan == plain stack, padding invariance, exact beam search)."""
import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jasr.losses import joint_ctc_attention_loss
from models.aed import AEDConfig, AEDModel, beam_search, greedy_search, shift_labels
from models.conformer import ConformerConfig, stack_layers
from models.lstm import LSTMDecoder, LSTMDecoderConfig
from models.transformer import TransformerConfig, TransformerDecoder, TransformerEncoder

torch.manual_seed(0)
D, H, FF = 32, 4, 64


def random_variables(init, *args, seed=0):
    """Random variables shaped like ``init(key, *args)`` without compiling ``init`` (the tests check numbers that do
    not depend on the initialisers; this keeps the suite fast)."""
    shapes = nn.unbox(jax.eval_shape(init, jax.random.PRNGKey(0), *args))
    rng = np.random.default_rng(seed)

    def fill(path, s):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']") or name.endswith("['var']"):
            return jnp.asarray(1.0 + 0.1 * np.abs(rng.standard_normal(s.shape)), s.dtype)
        fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 16
        return jnp.asarray(rng.standard_normal(s.shape) / np.sqrt(fan_in), s.dtype)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _np(t):
    return t.detach().numpy()


def _mha_params(mha):
    w, b = _np(mha.in_proj_weight), _np(mha.in_proj_bias)
    out = {}
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[name] = {"kernel": w[i * D:(i + 1) * D].T.reshape(D, H, D // H), "bias": b[i * D:(i + 1) * D].reshape(H, -1)}
    out["o_proj"] = {"kernel": _np(mha.out_proj.weight).T.reshape(H, D // H, D), "bias": _np(mha.out_proj.bias)}
    return out


def _lin(lin):
    return {"kernel": _np(lin.weight).T, "bias": _np(lin.bias)}


def _ln(norm):
    return {"scale": _np(norm.weight), "bias": _np(norm.bias)}


def _memory(seed=0, lengths=(9, 6, 4)):
    rng = np.random.default_rng(seed)
    t = max(lengths)
    mem = rng.standard_normal((len(lengths), t, D)).astype(np.float32)
    pad = (np.arange(t)[None] >= np.asarray(lengths)[:, None]).astype(np.float32)
    return mem, pad


def _torch_positions(n, d):  # "Attention is all you need" table, written independently of the model code
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return pe.float()


# ---------------------------------------------------------------------------------------------------------------
# Transformer encoder / decoder vs torch
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pre_norm", [True, False])
def test_transformer_encoder_matches_torch(pre_norm):
    layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=pre_norm)
    ref_model = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(D) if pre_norm else None,
                                            enable_nested_tensor=False).eval()
    x, pad = _memory(1)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(pad > 0)).numpy()
    params = {}
    for i, lyr in enumerate(ref_model.layers):
        params[f"layers_{i}"] = {"self_attn": _mha_params(lyr.self_attn), "norm1": _ln(lyr.norm1),
                                 "norm2": _ln(lyr.norm2),
                                 "ff": {"linear1": _lin(lyr.linear1), "linear2": _lin(lyr.linear2)}}
    if pre_norm:
        params["final_norm"] = _ln(ref_model.norm)
    cfg = TransformerConfig(d_model=D, num_heads=H, num_layers=2, ff_dim=FF, normalize_before=pre_norm,
                            positions="none", dropout_rate=0.0)
    out, out_pad = jax.jit(TransformerEncoder(cfg).apply)({"params": params}, x, pad)
    np.testing.assert_array_equal(out_pad, pad)
    valid = pad < 0.5
    np.testing.assert_allclose(np.asarray(out)[valid], ref[valid], rtol=1e-4, atol=1e-4)


def _torch_decoder(pre_norm, vocab=11):
    layer = torch.nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=pre_norm)
    dec = torch.nn.TransformerDecoder(layer, 2, norm=torch.nn.LayerNorm(D) if pre_norm else None).eval()
    emb, out = torch.nn.Embedding(vocab, D), torch.nn.Linear(D, vocab)
    params = {"embedding": _np(emb.weight), "output": _lin(out)}
    for i, lyr in enumerate(dec.layers):
        params[f"layers_{i}"] = {"self_attn": _mha_params(lyr.self_attn), "cross_attn": _mha_params(lyr.multihead_attn),
                                 "ff": {"linear1": _lin(lyr.linear1), "linear2": _lin(lyr.linear2)},
                                 "norm1": _ln(lyr.norm1), "norm2": _ln(lyr.norm2), "norm3": _ln(lyr.norm3)}
    if pre_norm:
        params["final_norm"] = _ln(dec.norm)

    def run(tokens, mem, mem_pad):
        with torch.no_grad():
            tok = torch.from_numpy(np.asarray(tokens)).long()
            x = emb(tok) * math.sqrt(D) + _torch_positions(tok.shape[1], D)[None]
            causal = torch.nn.Transformer.generate_square_subsequent_mask(tok.shape[1])
            h = dec(x, torch.from_numpy(mem), tgt_mask=causal, tgt_is_causal=True,
                    memory_key_padding_mask=torch.from_numpy(mem_pad > 0))
            return out(h).numpy()
    return run, params


@pytest.mark.parametrize("pre_norm", [True, False])
def test_transformer_decoder_matches_torch_and_kv_cache(pre_norm):
    run, params = _torch_decoder(pre_norm)
    mem, mem_pad = _memory(2)
    tokens = np.random.default_rng(0).integers(0, 11, (3, 6)).astype(np.int32)
    ref = run(tokens, mem, mem_pad)
    cfg = TransformerConfig(d_model=D, num_heads=H, num_layers=2, ff_dim=FF, normalize_before=pre_norm,
                            vocab_size=11, dropout_rate=0.0)
    dec = TransformerDecoder(cfg)
    v = {"params": params}
    logits = jax.jit(dec.apply)(v, tokens, mem, mem_pad)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-4, atol=1e-4)
    # incremental decoding with the static KV cache reproduces teacher forcing position by position
    state = dec.apply(v, mem, mem_pad, 8, method=TransformerDecoder.init_state)
    step = jax.jit(lambda tok, i, st: dec.apply(v, tok, i, st, method=TransformerDecoder.step))
    for i in range(tokens.shape[1]):
        out, state = step(jnp.asarray(tokens[:, i]), jnp.int32(i), state)
        np.testing.assert_allclose(np.asarray(out), ref[:, i], rtol=1e-4, atol=1e-4)


def test_transformer_decoder_scan_and_remat_match_plain():
    _, params = _torch_decoder(True)
    mem, mem_pad = _memory(3)
    tokens = np.random.default_rng(1).integers(0, 11, (3, 5)).astype(np.int32)
    cfg = TransformerConfig(d_model=D, num_heads=H, num_layers=2, ff_dim=FF, vocab_size=11, dropout_rate=0.0)
    sparams = {k: v for k, v in params.items() if not k.startswith("layers_")}
    sparams["layers"] = stack_layers([params["layers_0"], params["layers_1"]])
    scfg = cfg.replace(scan_layers=True, remat=True)

    def loss(c, p):
        return jnp.sum(jax.nn.log_softmax(TransformerDecoder(c).apply({"params": p}, tokens, mem, mem_pad))[..., 3])

    l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(cfg, p)))(params)
    l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(scfg, p)))(sparams)
    np.testing.assert_allclose(l0, l1, rtol=1e-5)
    g0s = stack_layers([g0["layers_0"], g0["layers_1"]])
    for a, b in zip(jax.tree_util.tree_leaves(g0s), jax.tree_util.tree_leaves(g1["layers"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
    # the scanned KV-cache path too
    dec = TransformerDecoder(scfg)
    full = jax.jit(dec.apply)({"params": sparams}, tokens, mem, mem_pad)
    state = dec.apply({"params": sparams}, mem, mem_pad, 5, method=TransformerDecoder.init_state)
    step = jax.jit(lambda tok, i, st: dec.apply({"params": sparams}, tok, i, st, method=TransformerDecoder.step))
    for i in range(5):
        out, state = step(jnp.asarray(tokens[:, i]), jnp.int32(i), state)
        np.testing.assert_allclose(np.asarray(out), np.asarray(full)[:, i], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# LSTM decoder vs torch.nn.LSTM + attention written in torch
# ---------------------------------------------------------------------------------------------------------------

def test_lstm_decoder_matches_torch():
    V, E, HS, A, L = 9, 12, 20, 16, 2
    emb = torch.nn.Embedding(V, E)
    lstm = torch.nn.LSTM(E + D, HS, num_layers=L, batch_first=True)
    wq, wk = torch.nn.Linear(HS, A, bias=False), torch.nn.Linear(D, A, bias=False)
    comb, out = torch.nn.Linear(HS + D, HS), torch.nn.Linear(HS, V)
    mem, mem_pad = _memory(4)
    tokens = np.random.default_rng(2).integers(0, V, (3, 5))
    with torch.no_grad():
        m, valid = torch.from_numpy(mem), torch.from_numpy(mem_pad < 0.5)
        keys = wk(m)
        ctx, state, ref = torch.zeros(3, D), None, []
        for u in range(tokens.shape[1]):
            x = torch.cat([emb(torch.from_numpy(tokens[:, u]).long()), ctx], -1)[:, None]
            o, state = lstm(x, state)
            s = torch.einsum("bta,ba->bt", keys, wq(o[:, 0])) / math.sqrt(A)
            a = torch.softmax(s.masked_fill(~valid, float("-inf")), -1)
            ctx = torch.einsum("bt,btd->bd", a, m)
            ref.append(out(torch.tanh(comb(torch.cat([o[:, 0], ctx], -1)))))
        ref = torch.stack(ref, 1).numpy()
    step = {"embedding": _np(emb.weight), "query_proj": {"kernel": _np(wq.weight).T}, "combine": _lin(comb),
            "output": _lin(out)}
    for i in range(L):
        step[f"lstm_{i}"] = {"ih": {"kernel": _np(getattr(lstm, f"weight_ih_l{i}")).T,
                                    "bias": _np(getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}"))},
                             "hh": {"kernel": _np(getattr(lstm, f"weight_hh_l{i}")).T}}
    v = {"params": {"key_proj": {"kernel": _np(wk.weight).T}, "step": step}}
    cfg = LSTMDecoderConfig(vocab_size=V, memory_dim=D, embed_dim=E, hidden_size=HS, num_layers=L, attention_dim=A,
                            dropout_rate=0.0)
    dec = LSTMDecoder(cfg)
    logits = jax.jit(dec.apply)(v, jnp.asarray(tokens, jnp.int32), mem, mem_pad)
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-4, atol=1e-4)
    state = dec.apply(v, mem, mem_pad, 0, method=LSTMDecoder.init_state)
    step = jax.jit(lambda tok, i, st: dec.apply(v, tok, i, st, method=LSTMDecoder.step))
    for i in range(tokens.shape[1]):
        o, state = step(jnp.asarray(tokens[:, i], jnp.int32), jnp.int32(i), state)
        np.testing.assert_allclose(np.asarray(o), ref[:, i], rtol=1e-4, atol=1e-4)
    # remat gives the same numbers
    np.testing.assert_allclose(np.asarray(jax.jit(LSTMDecoder(cfg.replace(remat=True)).apply)(
        v, jnp.asarray(tokens, jnp.int32), mem, mem_pad)), ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------------

def test_shift_labels():
    labels = jnp.array([[5, 6, 7], [8, 0, 0], [0, 0, 0]])
    pads = jnp.array([[0, 0, 0], [0, 1, 1], [1, 1, 1]], jnp.float32)
    inp, tgt, tpad = shift_labels(labels, pads, sos_id=9, eos_id=9)
    np.testing.assert_array_equal(inp, [[9, 5, 6, 7], [9, 8, 9, 9], [9, 9, 9, 9]])
    np.testing.assert_array_equal(tgt, [[5, 6, 7, 9], [8, 9, 9, 9], [9, 9, 9, 9]])
    np.testing.assert_array_equal(tpad, [[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 1]])


@pytest.mark.parametrize("normalize_length", [False, True])
def test_joint_loss_matches_torch(normalize_length):
    rng = np.random.default_rng(5)
    b, u, t, v, eps, lam = 3, 4, 12, 8, 0.1, 0.3
    lengths = np.array([4, 2, 1])
    labels = rng.integers(1, v - 1, (b, u)) * (np.arange(u)[None] < lengths[:, None])
    lpad = (np.arange(u)[None] >= lengths[:, None]).astype(np.float32)
    att = rng.standard_normal((b, u + 1, v)).astype(np.float32) * 2
    ctc = rng.standard_normal((b, t, v)).astype(np.float32) * 2
    tlen = np.array([12, 9, 5])
    cpad = (np.arange(t)[None] >= tlen[:, None]).astype(np.float32)
    _, targets, tpad = shift_labels(labels, lpad, sos_id=v - 1, eos_id=v - 1)
    normalize = "tokens" if normalize_length else "batch"
    loss, aux = jax.jit(lambda *a: joint_ctc_attention_loss(
        *a, ctc_weight=lam, label_smoothing=eps, normalize=normalize))(att, ctc, cpad, targets, tpad, labels, lpad)
    # ESPnet LabelSmoothingLoss: KLDiv(log_softmax, smoothed one-hot), summed over valid targets
    kl_sum, n_tok = 0.0, 0
    for i in range(b):
        tgt = list(labels[i, :lengths[i]]) + [v - 1]
        true = torch.full((len(tgt), v), eps / (v - 1))
        true[torch.arange(len(tgt)), torch.tensor(tgt)] = 1 - eps
        logp = torch.log_softmax(torch.from_numpy(att[i, :len(tgt)]), -1)
        kl_sum += torch.nn.KLDivLoss(reduction="sum")(logp, true).item()
        n_tok += len(tgt)
    logp = torch.log_softmax(torch.from_numpy(ctc), -1).transpose(0, 1)
    ctc_sum = torch.nn.functional.ctc_loss(logp, torch.from_numpy(labels), torch.from_numpy(tlen),
                                           torch.from_numpy(lengths), blank=0, reduction="sum").item()
    denom = n_tok if normalize_length else b
    np.testing.assert_allclose(aux["att_loss"], kl_sum / denom, rtol=1e-5)
    np.testing.assert_allclose(aux["ctc_loss"], ctc_sum / denom, rtol=1e-4)
    np.testing.assert_allclose(loss, lam * ctc_sum / denom + (1 - lam) * kl_sum / denom, rtol=1e-4)
    assert aux["num_tokens"] == n_tok
    loss_att_only, aux2 = joint_ctc_attention_loss(att, None, None, targets, tpad, labels, lpad, ctc_weight=0.0,
                                                   label_smoothing=eps, normalize=normalize)
    np.testing.assert_allclose(loss_att_only, kl_sum / denom, rtol=1e-5)
    assert "ctc_loss" not in aux2


# ---------------------------------------------------------------------------------------------------------------
# AED model: padding invariance, gradients, decoding
# ---------------------------------------------------------------------------------------------------------------

def _feats(cfg, lengths, seed=0):
    rng = np.random.default_rng(seed)
    t = max(lengths)
    x = rng.standard_normal((len(lengths), t, cfg.encoder.input_dim)).astype(np.float32)
    pad = (np.arange(t)[None] >= np.asarray(lengths)[:, None]).astype(np.float32)
    return x, pad


def _joint_loss(model, variables, x, pad, labels, lpad, train=False, rngs=None, label_smoothing=0.1):
    """The training loss of an AEDModel: its outputs scored by jasr.losses.joint_ctc_attention_loss."""
    cfg = model.config
    out = model.apply(variables, x, pad, labels, lpad, train, rngs=rngs)
    _, targets, tpad = shift_labels(labels, lpad, cfg.sos_token, cfg.eos_token)
    return joint_ctc_attention_loss(out["att_logits"], out["ctc_logits"], out["enc_paddings"], targets, tpad, labels,
                                    lpad, ctc_weight=cfg.ctc_weight, label_smoothing=label_smoothing,
                                    blank_id=cfg.blank_id)


@pytest.fixture(scope="module", params=["transformer", "lstm"])
def aed(request):
    cfg = AEDConfig.tiny(6, decoder=request.param)  # one encoder and one decoder layer
    model = AEDModel(cfg)
    x, pad = _feats(cfg, [40, 29])
    labels = jnp.array([[1, 2, 3, 4], [3, 1, 0, 0]])
    lpad = jnp.array([[0, 0, 0, 0], [0, 0, 1, 1]], jnp.float32)
    variables = random_variables(model.init, x, pad, labels, lpad)
    return cfg, model, variables, x, pad, labels, lpad


def test_aed_loss_padding_invariance_and_gradients(aed):
    cfg, model, variables, x, pad, labels, lpad = aed
    lossf = jax.jit(lambda v, *a: _joint_loss(model, v, *a))

    @jax.jit
    def value_and_grad(p):
        return jax.value_and_grad(lambda q: _joint_loss(model, {"params": q}, x, pad, labels, lpad), has_aux=True)(p)

    (loss, aux), g = value_and_grad(nn.unbox(variables)["params"])
    assert set(aux) == {"att_loss", "ctc_loss", "att_accuracy", "num_tokens", "infeasible_rows"}
    assert not np.asarray(aux["infeasible_rows"]).any()
    # more padding (frames and labels) with garbage in it changes nothing
    x2 = np.concatenate([x, np.zeros((2, 9, x.shape[2]), np.float32)], 1)
    pad2 = np.concatenate([pad, np.ones((2, 9), np.float32)], 1)
    x2[pad2 > 0] = 7.0
    labels2 = np.concatenate([np.asarray(labels), np.full((2, 3), 2)], 1)
    lpad2 = np.concatenate([np.asarray(lpad), np.ones((2, 3), np.float32)], 1)
    labels2[lpad2 > 0] = 4
    loss2, aux2 = lossf(variables, x2, pad2, labels2, lpad2)
    np.testing.assert_allclose(loss2, loss, rtol=1e-5)
    np.testing.assert_allclose(aux2["ctc_loss"], aux["ctc_loss"], rtol=1e-5)
    # the batch loss is the mean of the per-utterance losses (rows are independent)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(g))
    assert np.abs(np.asarray(g["ctc_head"]["kernel"])).max() > 0
    assert all(np.abs(np.asarray(a)).max() > 0 for a in jax.tree_util.tree_leaves(g["decoder"]))


def test_greedy_matches_teacher_forcing(aed):
    """Greedy search's tokens are the argmax of the teacher-forced distribution at every position (so it is the
    greedy path), and its score is their summed log-probability."""
    cfg, model, variables, x, pad, _, _ = aed
    max_len = 5
    toks, tpad, scores = jax.jit(lambda v, a, b: greedy_search(model, v, a, b, max_len))(variables, x, pad)
    inp = jnp.concatenate([jnp.full((2, 1), cfg.sos_token, jnp.int32), toks], 1)

    @jax.jit
    def teacher_forced(inp):
        enc, enc_pad, _ = model.apply(variables, x, pad, method=AEDModel.encode)
        return jax.nn.log_softmax(model.apply(variables, inp, enc, enc_pad, method=AEDModel.decode))

    logp = np.asarray(teacher_forced(inp))
    for i in range(x.shape[0]):
        n = int((1 - np.asarray(tpad[i])).sum())
        hyp = list(np.asarray(toks[i, :n]))
        want = hyp + ([cfg.eos_token] if n < max_len else [])
        assert list(np.argmax(logp[i, :len(want)], -1)) == want
        assert cfg.eos_token not in hyp
        np.testing.assert_allclose(scores[i], sum(logp[i, j, t] for j, t in enumerate(want)), rtol=1e-4, atol=1e-4)


def test_beam_search_is_exact_with_a_wide_beam(aed):
    """With a beam wide enough to keep every prefix, beam search must return the best of all sequences (found by
    enumeration and scored by teacher forcing) and report its score; n-best sorted best first."""
    cfg, model, variables, x, pad, _, _ = aed
    variables = jax.tree_util.tree_map(lambda a: a, nn.unbox(variables))
    dec = variables["params"]["decoder"]
    out = dec["output"] if "output" in dec else dec["step"]["output"]
    out["kernel"] = out["kernel"] * 4.0  # sharper distributions: hypotheses' scores differ a lot
    max_len, v, eos = 3, cfg.vocab_size, cfg.eos_token
    beam = (v - 1) ** (max_len - 1) * v  # every candidate of every step survives (eos is forced after max_len)
    res = jax.jit(lambda vv, a, b: beam_search(model, vv, a, b, max_len, beam))(variables, x, pad)
    toks, tpad, scores = res["tokens"], res["token_paddings"], res["scores"]
    non_eos = [t for t in range(v) if t != eos]
    hyps = [list(h) for n in range(max_len + 1) for h in itertools.product(non_eos, repeat=n)]
    inp = jnp.asarray([[cfg.sos_token] + h + [eos] * (max_len - len(h)) for h in hyps], jnp.int32)
    inp = jnp.concatenate([inp, jnp.full((len(hyps), 1), eos, jnp.int32)], 1)

    @jax.jit
    def all_scores(i):
        enc, enc_pad, _ = model.apply(variables, x, pad, method=AEDModel.encode)
        rep = lambda a: jnp.repeat(jax.lax.dynamic_slice_in_dim(a, i, 1, 0), len(hyps), 0)
        return jax.nn.log_softmax(model.apply(variables, inp, rep(enc), rep(enc_pad), method=AEDModel.decode))

    for i in range(2):
        logp = np.asarray(all_scores(i))
        best, best_h = -np.inf, None
        for r, h in enumerate(hyps):
            s = sum(logp[r, j, t] for j, t in enumerate(h)) + logp[r, len(h), eos]
            if s > best:
                best, best_h = s, h
        n = int((1 - np.asarray(tpad[i, 0])).sum())
        assert list(np.asarray(toks[i, 0, :n])) == best_h
        np.testing.assert_allclose(scores[i, 0], best, rtol=1e-4, atol=1e-4)
        assert np.all(np.diff(np.asarray(scores[i])[np.isfinite(scores[i])]) <= 1e-6)  # sorted best first


def test_transformer_encoder_aed_and_config_errors():
    cfg = AEDConfig.tiny(6, encoder_type="transformer")
    model = AEDModel(cfg)
    x, pad = _feats(cfg, [33, 20])
    labels, lpad = jnp.array([[1, 2], [3, 0]]), jnp.array([[0, 0], [0, 1]], jnp.float32)
    variables = random_variables(model.init, x, pad, labels, lpad)
    loss, aux = jax.jit(lambda v: _joint_loss(model, v, x, pad, labels, lpad, True, rngs={"dropout": jax.random.PRNGKey(0)},
                                              label_smoothing=0.0))(variables)  # train mode, dropout on
    assert np.isfinite(loss) and aux["att_loss"] > 0
    assert "transformer" in nn.unbox(variables)["params"]["encoder"]
    with pytest.raises(ValueError, match="decoder"):
        AEDConfig(encoder=cfg.encoder, decoder=TransformerConfig.tiny(6, d_model=64), vocab_size=6)
    with pytest.raises(ValueError, match="vocab_size"):
        AEDConfig(encoder=cfg.encoder, decoder=cfg.decoder, vocab_size=7)
    with pytest.raises(ValueError, match="ctc_weight"):
        cfg.replace(ctc_weight=1.5)
    with pytest.raises(ValueError, match="eos_id"):
        cfg.replace(eos_id=0)
    with pytest.raises(ValueError, match="labels"):
        model.apply(variables, x, pad, labels[0], lpad[0])


def test_config_from_dict_roundtrip():
    cfg = AEDConfig.from_dict({"vocab_size": 12, "ctc_weight": 0.5,
                               "encoder": {"input_dim": 40, "d_model": 64, "num_layers": 3, "num_heads": 4},
                               "decoder": {"type": "lstm", "hidden_size": 48, "num_layers": 1}})
    assert isinstance(cfg.decoder, LSTMDecoderConfig) and cfg.decoder.memory_dim == 64 and cfg.decoder.vocab_size == 12
    assert isinstance(cfg.encoder, ConformerConfig) and cfg.encoder.num_layers == 3 and cfg.ctc_weight == 0.5
    assert AEDConfig.from_dict(cfg.to_dict()) == cfg
    tcfg = AEDConfig.demo(12)
    assert AEDConfig.from_dict(tcfg.to_dict()) == tcfg and tcfg.sos_token == tcfg.eos_token == 11
    with pytest.raises(ValueError, match="decoder type"):
        AEDConfig.from_dict({"vocab_size": 12, "decoder": {"type": "rnn"}})


def test_lstm_decoder_bfloat16_init_and_float32_logits():
    cfg = LSTMDecoderConfig.tiny(7, memory_dim=D, dtype="bfloat16", param_dtype="bfloat16")
    mem, mem_pad = _memory(6)
    tokens = jnp.array([[1, 2, 3]] * 3, jnp.int32)
    logits, variables = jax.jit(lambda: LSTMDecoder(cfg).init_with_output(jax.random.PRNGKey(0), tokens, mem,
                                                                           mem_pad))()
    assert {a.dtype for a in jax.tree_util.tree_leaves(nn.unbox(variables))} == {jnp.dtype(jnp.bfloat16)}
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
