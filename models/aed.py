"""Attention encoder-decoder (AED) speech recognizer: Conformer or Transformer encoder, Transformer or LSTM decoder,
optional CTC head on the encoder, greedy and beam attention decoding (jit-able). The joint CTC/attention training
loss is ``jasr.losses.joint_ctc_attention_loss``.

Token conventions (ESPnet / WeNet):
- one vocabulary of ``vocab_size`` ids is shared by the CTC head and the decoder; id ``blank_id = 0`` is the CTC
  blank (never a decoder target); ``sos_id`` and ``eos_id`` default to ``vocab_size - 1`` (one id for both).
- ``labels [B, U]`` hold the token ids of each utterance without sos/eos, right-padded; ``label_paddings [B, U]``
  (1.0 = padded). The decoder reads ``[sos, y_1 .. y_n]`` and is trained to emit ``[y_1 .. y_n, eos]``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.conformer import Conv2dSubsampling, ConformerConfig, ConformerEncoder, check_encoder_inputs
from models.aed_search import beam_search  # noqa: F401  (re-exported: models.aed's decoding functions)
from models.layer_stack import StackOptions
from models.lstm import LSTMDecoder, LSTMDecoderConfig
from models.transformer import (TransformerConfig, TransformerDecoder, TransformerEncoder, constrain, dense,
                                lengths_from_paddings, paddings_from_lengths)


@dataclasses.dataclass(frozen=True)
class AEDConfig:
    """``encoder`` gives the front end and encoder sizes (for ``encoder_type="transformer"`` its conformer-only fields
    - conv kernel/norm - are unused and the blocks are plain pre-norm Transformer layers with absolute sinusoidal
    positions and ``ff_mult * d_model`` ReLU FFNs). ``decoder`` is a :class:`TransformerConfig` or an
    :class:`LSTMDecoderConfig`; its vocabulary and memory size must match."""
    encoder: ConformerConfig
    decoder: Any
    vocab_size: int
    encoder_type: str = "conformer"
    ctc_weight: float = 0.3        # > 0: the encoder has a CTC head (the joint loss weights it by this)
    blank_id: int = 0
    sos_id: int | None = None      # None -> vocab_size - 1
    eos_id: int | None = None      # None -> vocab_size - 1

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"AEDConfig.{field}={getattr(self, field)!r}: {msg}")
        if self.encoder_type not in ("conformer", "transformer"):
            bad("encoder_type", "must be 'conformer' or 'transformer'")
        if not isinstance(self.encoder, ConformerConfig):
            bad("encoder", "must be a ConformerConfig")
        if isinstance(self.decoder, TransformerConfig):
            if self.decoder.d_model != self.encoder.d_model:
                bad("decoder", f"d_model {self.decoder.d_model} != encoder d_model {self.encoder.d_model}")
        elif isinstance(self.decoder, LSTMDecoderConfig):
            if self.decoder.memory_dim != self.encoder.d_model:
                bad("decoder", f"memory_dim {self.decoder.memory_dim} != encoder d_model {self.encoder.d_model}")
        else:
            bad("decoder", "must be a TransformerConfig or an LSTMDecoderConfig")
        if self.decoder.vocab_size != self.vocab_size:
            bad("vocab_size", f"the decoder's vocab_size is {self.decoder.vocab_size}")
        if self.vocab_size < 3:
            bad("vocab_size", "needs at least blank, one token and sos/eos")
        if not 0.0 <= self.ctc_weight <= 1.0:
            bad("ctc_weight", "must be in [0, 1]")
        for f in ("blank_id", "sos", "eos"):
            v = getattr(self, f) if f == "blank_id" else getattr(self, f + "_token")
            if not 0 <= v < self.vocab_size:
                raise ValueError(f"AEDConfig.{f if f == 'blank_id' else f + '_id'}={v}: outside the vocabulary")
        if self.eos_token == self.blank_id:
            bad("eos_id", "must differ from blank_id")

    @property
    def sos_token(self) -> int:
        return self.vocab_size - 1 if self.sos_id is None else self.sos_id

    @property
    def eos_token(self) -> int:
        return self.vocab_size - 1 if self.eos_id is None else self.eos_id

    @property
    def use_ctc(self) -> bool:
        return self.ctc_weight > 0.0

    def replace(self, **kw) -> "AEDConfig":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_dict(cls, fields: dict) -> "AEDConfig":
        """From plain (e.g. ml_collections) fields: ``encoder`` a dict of ConformerConfig fields, ``decoder`` a dict
        with ``type`` ("transformer" or "lstm") and that config's fields (its vocab_size and d_model/memory_dim
        default to the AED's), the rest AEDConfig fields. Inverse of :meth:`to_dict`."""
        fields = dict(fields)
        if "vocab_size" not in fields:
            raise ValueError("AEDConfig.from_dict needs 'vocab_size'")
        enc = fields.pop("encoder", {})
        enc = enc if isinstance(enc, ConformerConfig) else ConformerConfig(**{"vocab_size": 0, **dict(enc)})
        dec = fields.pop("decoder", {})
        if not isinstance(dec, (TransformerConfig, LSTMDecoderConfig)):
            dec = dict(dec)
            kind = dec.pop("type", "transformer")
            base = {"vocab_size": fields["vocab_size"]}
            if kind == "transformer":
                dec = TransformerConfig(**{**base, "d_model": enc.d_model, **dec})
            elif kind == "lstm":
                dec = LSTMDecoderConfig(**{**base, "memory_dim": enc.d_model, **dec})
            else:
                raise ValueError(f"AEDConfig decoder type must be 'transformer' or 'lstm', got {kind!r}")
        return cls(encoder=enc, decoder=dec, **fields)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["encoder"] = dataclasses.asdict(self.encoder)
        out["decoder"] = {"type": "transformer" if isinstance(self.decoder, TransformerConfig) else "lstm",
                          **dataclasses.asdict(self.decoder)}
        return out

    @classmethod
    def tiny(cls, vocab_size: int, decoder: str = "transformer", encoder_type: str = "conformer",
             **kw) -> "AEDConfig":
        """For unit tests: one encoder and one decoder layer."""
        enc = ConformerConfig.tiny(0, num_layers=1)
        dec = (TransformerConfig.tiny(vocab_size, d_model=enc.d_model, num_layers=1) if decoder == "transformer"
               else LSTMDecoderConfig.tiny(vocab_size, memory_dim=enc.d_model, num_layers=1))
        return cls(encoder=enc, decoder=dec, vocab_size=vocab_size, encoder_type=encoder_type, **kw)

    @classmethod
    def demo(cls, vocab_size: int, decoder: str = "transformer", encoder_type: str = "conformer",
             **kw) -> "AEDConfig":
        enc = ConformerConfig.demo(0)
        dec = (TransformerConfig.demo(vocab_size, d_model=enc.d_model) if decoder == "transformer"
               else LSTMDecoderConfig.demo(vocab_size, memory_dim=enc.d_model))
        return cls(encoder=enc, decoder=dec, vocab_size=vocab_size, encoder_type=encoder_type, **kw)


class TransformerAudioEncoder(nn.Module):
    """Conv2d subsampling front end + plain Transformer encoder (sizes from a ConformerConfig)."""
    config: ConformerConfig
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, features, paddings, train: bool = False):
        cfg = self.config
        check_encoder_inputs(cfg, features, paddings)
        x, out_paddings = Conv2dSubsampling(cfg, name="subsampling")(features, paddings)
        if cfg.xscale:
            x = x * math.sqrt(cfg.d_model)
        tcfg = TransformerConfig(d_model=cfg.d_model, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                                 ff_dim=cfg.ff_mult * cfg.d_model, activation="relu", dropout_rate=cfg.dropout_rate,
                                 attention_dropout_rate=cfg.attention_dropout_rate,
                                 ff_dropout_rate=cfg.ff_dropout_rate, normalize_before=True,
                                 layer_norm_eps=cfg.layer_norm_eps, use_bias=cfg.use_bias, dtype=cfg.dtype,
                                 param_dtype=cfg.param_dtype, remat=cfg.remat, scan_layers=cfg.scan_layers)
        encoder = TransformerEncoder(tcfg, self.stack, name="transformer")
        return encoder(x.astype(cfg.compute_dtype), out_paddings, train)


def shift_labels(labels, label_paddings, sos_id: int, eos_id: int):
    """``labels [B,U]`` -> decoder inputs ``[sos, y..]``, targets ``[y.., eos]`` and target paddings, all
    ``[B, U+1]`` (padded positions hold eos)."""
    labels = jnp.asarray(labels).astype(jnp.int32)
    b, u = labels.shape
    lengths = lengths_from_paddings(label_paddings)
    pos = jnp.arange(u + 1)[None, :]
    padded_labels = jnp.concatenate([labels, jnp.full((b, 1), eos_id, jnp.int32)], axis=1)
    targets = jnp.where(pos < lengths[:, None], padded_labels, eos_id)
    inputs = jnp.concatenate([jnp.full((b, 1), sos_id, jnp.int32), targets[:, :-1]], axis=1)
    target_paddings = (pos > lengths[:, None]).astype(jnp.float32)
    return inputs, targets, target_paddings


class AEDModel(nn.Module):
    """The AED network. Methods (call through ``model.apply(variables, ..., method=AEDModel.X)``):

    - ``__call__(features, feature_paddings, labels, label_paddings, train)`` -> dict ``att_logits [B,U+1,V]``,
      ``ctc_logits [B,T',V]`` (None without CTC), ``enc_paddings [B,T']``. Used by ``init`` and training.
    - ``encode(features, feature_paddings, train)`` -> ``(enc [B,T',D], enc_paddings, ctc_logits or None)``.
    - ``decode(tokens [B,U], enc, enc_paddings, train)`` -> logits ``[B,U,V]`` float32 (teacher forcing).
    - ``init_state(enc, enc_paddings, max_len)`` / ``step(tokens [B], index, state)`` -> incremental decoding.
    Decoding: :func:`greedy_search`, :func:`models.aed_search.beam_search` (re-exported here).
    ``stack`` (remat policy, pipeline stages) applies to the encoder's and the Transformer decoder's layer stacks.
    """
    config: AEDConfig
    stack: StackOptions = StackOptions()

    def setup(self):
        cfg = self.config
        self.encoder = (ConformerEncoder(cfg.encoder, self.stack) if cfg.encoder_type == "conformer"
                        else TransformerAudioEncoder(cfg.encoder, self.stack))
        self.decoder = (TransformerDecoder(cfg.decoder, self.stack) if isinstance(cfg.decoder, TransformerConfig)
                        else LSTMDecoder(cfg.decoder))
        if cfg.use_ctc:
            self.ctc_head = dense(cfg.vocab_size, ("embed", "vocab"), dtype=jnp.float32,
                                  param_dtype=cfg.encoder.params_dtype)

    def encode(self, features, feature_paddings, train: bool = False):
        enc, enc_paddings = self.encoder(features, feature_paddings, train)
        ctc_logits = None
        if self.config.use_ctc:
            ctc_logits = constrain(self.ctc_head(enc.astype(jnp.float32)), ("batch", "length", "vocab"))
        return enc, enc_paddings, ctc_logits

    def decode(self, tokens, enc, enc_paddings, train: bool = False):
        return self.decoder(tokens, enc, enc_paddings, train)

    def init_state(self, enc, enc_paddings, max_len: int):
        return self.decoder.init_state(enc, enc_paddings, max_len)

    def step(self, tokens, index, state):
        return self.decoder.step(tokens, index, state)

    def __call__(self, features, feature_paddings, labels, label_paddings, train: bool = False):
        cfg = self.config
        if labels.ndim != 2 or label_paddings.shape != labels.shape:
            raise ValueError(f"labels must be [batch, length] with label_paddings of the same shape, got "
                             f"{labels.shape} and {label_paddings.shape}")
        if labels.shape[0] != features.shape[0]:
            raise ValueError(f"labels has batch {labels.shape[0]}, features has {features.shape[0]}")
        enc, enc_paddings, ctc_logits = self.encode(features, feature_paddings, train)
        inputs, _, _ = shift_labels(labels, label_paddings, cfg.sos_token, cfg.eos_token)
        att_logits = self.decode(inputs, enc, enc_paddings, train)
        return {"att_logits": att_logits, "ctc_logits": ctc_logits, "enc_paddings": enc_paddings}


# ----------------------------------------------------------------------------------------------------------------
# Decoding (pure functions of variables; jit them with max_len / beam_size static)
# ----------------------------------------------------------------------------------------------------------------

def _encode(model, variables, features, feature_paddings):
    enc, enc_pad, _ = model.apply(variables, features, feature_paddings, False, method=AEDModel.encode)
    return enc, enc_pad


def greedy_search(model: AEDModel, variables, features, feature_paddings, max_len: int):
    """Greedy attention decoding; stops as soon as every row has emitted eos (``lax.while_loop``) or after
    ``max_len`` tokens. Returns ``tokens [B, max_len]`` (eos excluded; padded positions hold eos),
    ``token_paddings [B, max_len]`` and ``scores [B]`` (sum of log-probabilities incl. eos when emitted)."""
    cfg = model.config
    eos = cfg.eos_token
    enc, enc_pad = _encode(model, variables, features, feature_paddings)
    b = enc.shape[0]
    state = model.apply(variables, enc, enc_pad, max_len + 1, method=AEDModel.init_state)

    def body(carry):
        t, tok, st, done, score, toks = carry
        logits, st = model.apply(variables, tok, t, st, method=AEDModel.step)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nxt = jnp.argmax(logp, axis=-1).astype(jnp.int32)
        score = score + jnp.where(done, 0.0, jnp.take_along_axis(logp, nxt[:, None], -1)[:, 0])
        nxt = jnp.where(done, eos, nxt)
        toks = jax.lax.dynamic_update_slice_in_dim(toks, nxt[:, None], t, 1)
        return t + 1, nxt, st, done | (nxt == eos), score, toks

    init = (jnp.int32(0), jnp.full((b,), cfg.sos_token, jnp.int32), state, jnp.zeros((b,), bool),
            jnp.zeros((b,), jnp.float32), jnp.full((b, max_len), eos, jnp.int32))
    _, _, _, _, scores, toks = jax.lax.while_loop(lambda c: (c[0] < max_len) & ~jnp.all(c[3]), body, init)
    lengths = jnp.argmax(jnp.concatenate([toks, jnp.full((b, 1), eos, jnp.int32)], 1) == eos, axis=1)
    return toks, paddings_from_lengths(lengths, max_len), scores
