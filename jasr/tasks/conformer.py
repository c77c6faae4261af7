"""Conformer families trained from scratch on fbank/MFCC features: Conformer-CTC (``conformer_ctc``) and the
attention encoder-decoder with an optional CTC head (``conformer_aed``, loss.type "attention" or "joint")."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections

from jasr import losses
from jasr.decoding import ctc_greedy_decode
from jasr.features import feature_dim, num_frames
from jasr.errors import ConfigError
from jasr.tasks.base import (Frontend, SearchOptions, Task, check_stacks, model_defaults, model_fields,
                             model_fields_with_precision, require, stack_options)
from models.aed import AEDConfig, AEDModel, beam_search, greedy_search, shift_labels
from models.conformer import ConformerConfig, ConformerCTC
from models.transformer import TransformerConfig


def _check_pipeline(options, enc: dict, dec: dict | None, enc_key: str, dec_key: str) -> None:
    """ConfigError unless the encoder (and Transformer decoder) stacks can pipeline over options.stages."""
    if options.stages == 1:
        return
    require(enc.get("conv_norm", "layer") != "batch", f"config '{enc_key}.conv_norm'='batch': a pipelined stack "
                                                      f"cannot carry batch-norm statistics (use 'layer')")
    stacks = [(f"{enc_key}.num_layers", enc["num_layers"], enc["scan_layers"])]
    if dec is not None:
        require(dec.get("type", "transformer") == "transformer", f"config '{dec_key}.type'={dec.get('type')!r}: "
                                                                 f"the LSTM decoder cannot pipeline (use a "
                                                                 f"transformer decoder, or mesh.pipeline=1)")
        stacks.append((f"{dec_key}.num_layers", dec["num_layers"], dec["scan_layers"]))
    check_stacks(options, stacks)


@dataclasses.dataclass(frozen=True)
class _FeatureTask(Task):
    """A network that reads features through a :class:`Frontend` and may carry mutable collections."""
    frontend: Frontend = Frontend()

    @classmethod
    def check_config(cls, cfg: ml_collections.ConfigDict) -> None:
        super().check_config(cfg)
        require(cfg.data.feature in ("fbank", "mfcc", "whisper"),
                f"config 'data.feature' must be 'fbank', 'mfcc' or 'whisper' for model {cls.name!r} (it reads "
                f"features), got {cfg.data.feature!r}")

    def encoder_config(self) -> ConformerConfig:
        raise NotImplementedError

    def output_frames(self, samples, fc):
        return self.encoder_config().output_length(num_frames(samples, fc))

    def apply(self, params, model_state, *args, key=None, train: bool = False, **kw):
        """model.apply with the mutable collections of `model_state` (updated when training)."""
        variables = {"params": params, **model_state}
        rngs = {"dropout": key} if (train and key is not None) else None
        if train and model_state:
            out, updates = self.model.apply(variables, *args, train=True, rngs=rngs, mutable=list(model_state),
                                            **kw)
            return out, dict(updates)
        return self.model.apply(variables, *args, train=train, rngs=rngs, **kw), model_state


@dataclasses.dataclass(frozen=True)
class ConformerCTCTask(_FeatureTask):
    """Conformer encoder + linear CTC head; loss per label token; greedy CTC decoding."""
    name = "conformer_ctc"
    loss_types = ("ctc",)

    @classmethod
    def model_config_class(cls):
        return ConformerConfig

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        _check_pipeline(stack_options(cfg), model_defaults(ConformerConfig, model_fields(cfg)), None, "model", "")

    @classmethod
    def subsampling(cls, cfg):
        return int(cfg.model.get("subsampling", 4))

    @classmethod
    def build(cls, cfg, vocab_size, fc, *, tokenizer=None, hf_dir=None):
        mcfg = ConformerConfig(**{**model_fields_with_precision(cfg), "vocab_size": vocab_size,
                                  "input_dim": feature_dim(fc)})
        stack = stack_options(cfg)
        _check_pipeline(stack, dataclasses.asdict(mcfg), None, "model", "")
        return cls(model=ConformerCTC(mcfg, stack), frontend=Frontend.from_config(cfg, fc))

    def encoder_config(self):
        return self.model.config

    def init(self, key, batch):
        k1, k2 = jax.random.split(key)
        batch = self.frontend(batch, None, False)
        return self.model.init({"params": k1, "dropout": k2}, batch["features"], batch["feature_paddings"],
                               train=False)

    def ctc_logits(self, params, model_state, batch, key=None, train=False):
        """((logits [B, T', V], paddings [B, T']), new model_state)."""
        batch = self.frontend(batch, key, train)
        return self.apply(params, model_state, batch["features"], batch["feature_paddings"], key=key, train=train)

    def loss(self, params, model_state, batch, key, train):
        (logits, pads), ms = self.ctc_logits(params, model_state, batch, key, train)
        ctc_sum, tokens, infeasible = losses.weighted_ctc_loss(logits, pads, batch["labels"],
                                                               batch["label_paddings"], batch["row_weights"],
                                                               self.blank_id)
        return ctc_sum, (jnp.maximum(tokens, 1.0), ms, {"ctc": ctc_sum, "infeasible_rows": infeasible})

    def greedy_decode(self, params, model_state, batch):
        (logits, pads), _ = self.ctc_logits(params, model_state, batch)
        return ctc_greedy_decode(logits, pads, self.blank_id)

    @property
    def has_ctc_head(self):
        return True

    def ctc_log_probs(self, params, model_state, batch):
        """log_softmax of :meth:`ctc_logits` (inference) in float32, and the output paddings."""
        (logits, pads), _ = self.ctc_logits(params, model_state, batch)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), pads


@dataclasses.dataclass(frozen=True)
class ConformerAEDTask(_FeatureTask):
    """Conformer (or Transformer) encoder, Transformer or LSTM decoder, optional CTC head.

    loss.type "attention": label-smoothed KL per target token, greedy attention decoding for dev WER;
    "joint": ``ctc_weight * CTC + (1 - ctc_weight) * attention`` per target token, greedy CTC decoding.
    The vocabulary gets one more id for sos/eos. Greedy attention decoding runs to eos or to the encoder's output
    frames of the batch's (bucket-padded) audio, capped by ``max_decode_tokens`` when that is > 0.
    """
    joint: bool = False
    ctc_weight: float = 0.3
    label_smoothing: float = 0.1
    max_decode_tokens: int = 0    # config train.max_decode_tokens; 0: the encoder's output frames
    name = "conformer_aed"
    loss_types = ("attention", "joint")

    @classmethod
    def model_config_class(cls):
        return AEDConfig

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        require(cfg.loss.type != "joint" or cfg.loss.ctc_weight > 0,
                "config 'loss.ctc_weight' must be > 0 with loss.type='joint' (it sizes the CTC head that dev "
                "decoding reads); use loss.type='attention' for no CTC head")
        fields = model_fields(cfg)
        dec = dict(fields.get("decoder", {}))
        if dec.get("type", "transformer") == "transformer":
            dec = {"type": "transformer", **model_defaults(TransformerConfig, dec)}
        _check_pipeline(stack_options(cfg), model_defaults(ConformerConfig, dict(fields.get("encoder", {}))), dec,
                        "model.encoder", "model.decoder")

    @classmethod
    def subsampling(cls, cfg):
        return int(dict(cfg.model.get("encoder", {})).get("subsampling", 4))

    @classmethod
    def build(cls, cfg, vocab_size, fc, *, tokenizer=None, hf_dir=None):
        fields = model_fields_with_precision(cfg)
        enc = dict(fields.pop("encoder", {}))
        enc["input_dim"] = feature_dim(fc)
        if "dtype" in fields:
            enc["dtype"] = fields.pop("dtype")
        joint = cfg.loss.type == "joint"
        try:
            mcfg = AEDConfig.from_dict({**fields, "encoder": enc, "vocab_size": vocab_size + 1,   # + sos/eos id
                                        "ctc_weight": cfg.loss.ctc_weight if joint else 0.0})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config 'model' for 'conformer_aed': {e}") from e
        stack = stack_options(cfg)
        dec = mcfg.to_dict()["decoder"]
        _check_pipeline(stack, dataclasses.asdict(mcfg.encoder), dec, "model.encoder", "model.decoder")
        return cls(model=AEDModel(mcfg, stack), frontend=Frontend.from_config(cfg, fc), joint=joint,
                   ctc_weight=float(cfg.loss.ctc_weight), label_smoothing=float(cfg.loss.label_smoothing),
                   max_decode_tokens=int(cfg.train.max_decode_tokens))

    def encoder_config(self):
        return self.model.config.encoder

    def init(self, key, batch):
        k1, k2 = jax.random.split(key)
        batch = self.frontend(batch, None, False)
        return self.model.init({"params": k1, "dropout": k2}, batch["features"], batch["feature_paddings"],
                               batch["labels"], batch["label_paddings"], train=False)

    def loss(self, params, model_state, batch, key, train):
        mcfg = self.model.config
        batch = self.frontend(batch, key, train)
        out, ms = self.apply(params, model_state, batch["features"], batch["feature_paddings"], batch["labels"],
                             batch["label_paddings"], key=key, train=train)
        _, targets, target_pads = shift_labels(batch["labels"], batch["label_paddings"], mcfg.sos_token,
                                               mcfg.eos_token)
        total, aux = losses.joint_ctc_attention_loss(
            out["att_logits"], out["ctc_logits"], out["enc_paddings"], targets, target_pads, batch["labels"],
            batch["label_paddings"], ctc_weight=self.ctc_weight if self.joint else 0.0,
            label_smoothing=self.label_smoothing, blank_id=self.blank_id, row_weights=batch["row_weights"],
            normalize="none")
        logged = {"att": aux["att_loss"], **{k: aux[k] for k in ("ctc_loss", "infeasible_rows") if k in aux}}
        return total, (jnp.maximum(aux["num_tokens"], 1.0), ms, logged)

    def max_tokens(self, frames: int) -> int:
        """Most tokens a hypothesis of `frames` (padded) feature frames may have: the encoder's output frames
        (static for jit: one value per audio bucket), capped by max_decode_tokens when that is > 0."""
        limit = max(int(self.encoder_config().output_length(frames)), 1)
        return min(limit, self.max_decode_tokens) if self.max_decode_tokens > 0 else limit

    def greedy_decode(self, params, model_state, batch):
        batch = self.frontend(batch, None, False)
        variables = {"params": params, **model_state}
        if self.joint:   # the CTC head's best path, over the tokenizer's ids (the sos/eos id is no CTC output)
            _, pads, logits = self.model.apply(variables, batch["features"], batch["feature_paddings"], False,
                                               method=AEDModel.encode)
            return ctc_greedy_decode(logits[..., :self.model.config.eos_token], pads, self.blank_id)
        toks, tpad, _ = greedy_search(self.model, variables, batch["features"], batch["feature_paddings"],
                                      self.max_tokens(batch["features"].shape[1]))
        return toks.astype(jnp.int32), jnp.sum(1.0 - tpad, axis=1).astype(jnp.int32)

    @property
    def has_ctc_head(self):
        return self.model.config.use_ctc

    def ctc_log_probs(self, params, model_state, batch):
        """The joint run's CTC head: log_softmax of its logits without the sos/eos id (the last id, never a CTC
        target), so that V is the tokenizer's vocabulary; None for a run without a CTC head (loss.type
        "attention")."""
        if not self.has_ctc_head:
            return None
        batch = self.frontend(batch, None, False)
        _, pads, logits = self.model.apply({"params": params, **model_state}, batch["features"],
                                           batch["feature_paddings"], False, method=AEDModel.encode)
        eos = self.model.config.eos_token
        if eos != logits.shape[-1] - 1:
            raise ValueError(f"conformer_aed: the sos/eos id {eos} must be the last of {logits.shape[-1]} ids")
        return jax.nn.log_softmax(logits[..., :eos].astype(jnp.float32), axis=-1), pads

    def sequence_log_probs(self, params, model_state, batch, tokens, token_paddings, rows):
        """Teacher-forced decoder log-probability of ``[sos, y] -> [y, eos]`` per sequence against the encoder
        output of batch row ``rows[n]`` (label-smoothing-free, float32)."""
        mcfg = self.model.config
        batch = self.frontend(batch, None, False)
        variables = {"params": params, **model_state}
        enc, enc_pads, _ = self.model.apply(variables, batch["features"], batch["feature_paddings"], False,
                                            method=AEDModel.encode)
        inputs, targets, target_pads = shift_labels(tokens, token_paddings, mcfg.sos_token, mcfg.eos_token)
        logits = self.model.apply(variables, inputs, enc[rows], enc_pads[rows], False, method=AEDModel.decode)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(target_pads > 0.5, 0.0, picked), axis=-1)

    def beam_decode(self, params, model_state, batch, options: SearchOptions):
        """models.aed_search.beam_search over the attention decoder (its KV cache / LSTM state), optionally joint
        with the CTC head's prefix scores (``options.ctc_weight`` > 0 needs loss.type "joint"); at most
        :meth:`max_tokens` tokens per hypothesis (from the audio)."""
        if options.ctc_weight > 0 and not self.model.config.use_ctc:
            raise ValueError("beam search with ctc_weight > 0 needs a CTC head (train with loss.type='joint')")
        batch = self.frontend(batch, None, False)
        variables = {"params": params, **model_state}
        res = beam_search(self.model, variables, batch["features"], batch["feature_paddings"],
                          self.max_tokens(batch["features"].shape[1]), options.beam_size,
                          length_penalty=options.length_penalty, length_norm_kind=options.length_norm,
                          ctc_weight=options.ctc_weight, ctc_candidates=options.ctc_candidates,
                          length_bonus=options.length_bonus)
        n = options.nbest
        return {"ids": res["tokens"][:, :n].astype(jnp.int32),
                "lengths": jnp.sum(1.0 - res["token_paddings"][:, :n], axis=2).astype(jnp.int32),
                "scores": res["scores"][:, :n]}
