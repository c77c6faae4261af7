"""Training: TrainState, pure train/eval steps for CTC, attention CE and joint CTC/attention, and the loop.

Functional core: ``train_step(state, batch, key) -> (state, metrics)`` is a pure function of pytrees (jitted with
static `task` and `tx`); the loop around it does I/O only (data, logs, checkpoints).

* Non-finite loss or gradient: the update is skipped (params, optimiser state and model state keep their values),
  ``state.skipped`` counts it and the metrics report ``skipped``.
* bf16 mixed precision: the model computes in bfloat16 (its config's ``dtype``), params and optimiser stay fp32,
  losses are computed from fp32 logits.
* Remat: the model config's ``remat`` field.
* Exact resume: the PRNG key of step s is ``fold_in(state.rng, s)``; the data iterator's state is checkpointed with
  the train state, so a resumed run sees the same batches and keys as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jasr import decoding, metrics as metrics_lib


# ------------------------------------------------------------------------------------------------------------
# state

class TrainState(struct.PyTreeNode):
    """Everything that changes during training (a pytree; checkpointed as a whole)."""
    step: jax.Array          # int32: train_step calls so far (micro-batches with gradient accumulation)
    params: Any
    model_state: Any         # non-parameter collections (e.g. batch_stats); {} if none
    opt_state: Any
    rng: jax.Array           # uint32[2] base key; step s uses fold_in(rng, s)
    skipped: jax.Array       # int32: updates skipped because the loss or a gradient was not finite


def ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id: int = 0):
    """Per-utterance CTC negative log-likelihood [B] (jasr.losses.ctc_loss; optax's until that exists)."""
    try:
        from jasr.losses import ctc_loss as _ctc
    except ImportError:  # pragma: no cover - until the fsa_ops CTC lands
        return optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=blank_id)
    return _ctc(logits, logit_paddings, labels, label_paddings, blank_id=blank_id)


# ------------------------------------------------------------------------------------------------------------
# tasks: how a model family is initialised, scored and decoded

_HF_FAMILIES = ("wav2vec2_ctc", "wav2vec2_pretrain", "whisper")   # plain (unboxed) params, HF import


def normalize_audio(audio, paddings):
    """Zero mean, unit variance over each row's valid samples (Wav2Vec2FeatureExtractor's do_normalize); padded
    samples stay 0. audio, paddings [B, S] -> [B, S]."""
    valid = 1.0 - paddings.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1.0)
    mean = jnp.sum(audio * valid, axis=-1, keepdims=True) / n
    var = jnp.sum(jnp.square((audio - mean) * valid), axis=-1, keepdims=True) / n
    return (audio - mean) / jnp.sqrt(var + 1e-7) * valid


def stop_frozen(params, frozen: tuple):
    """`params` with lax.stop_gradient on the leaves under the `frozen` path prefixes (no backward pass there)."""
    from jasr.optim import frozen_labels
    labels = frozen_labels(params, tuple(frozen))
    return jax.tree.map(lambda p, l: jax.lax.stop_gradient(p) if l == "frozen" else p, params, labels)


@dataclasses.dataclass(frozen=True)
class Task:
    """The model-specific part of training (hashable: a static argument of the jitted steps).

    ``loss(params, model_state, batch, key, train) -> (loss_sum, (weight, new_model_state, aux))``: the loss is
    ``loss_sum / weight`` (weight = label tokens, or frames/targets for pre-training).
    ``ctc_logits(params, model_state, batch) -> (logits, paddings)`` or None when the model has no CTC head.
    """
    name: str
    model: nn.Module
    loss_type: str
    ctc_weight: float = 0.3
    label_smoothing: float = 0.1
    blank_id: int = 0
    frontend: Any = None          # Frontend: on-device features / SpecAugment
    frozen: tuple = ()            # parameter path prefixes that get no gradient and no update (jasr.optim)
    prompt: tuple = ()            # whisper: decoder prompt <|startoftranscript|><|lang|><|transcribe|><|notimestamps|>
    eos_id: int = 0               # whisper: <|endoftext|> (ends the targets and greedy decoding)
    max_decode_tokens: int = 0    # whisper dev decoding: 0 = label bucket length + 8
    suppress_tokens: tuple = ()   # whisper decoding (generation_config.json of train.init_from)
    begin_suppress_tokens: tuple = ()
    gumbel: tuple = (2.0, 0.5, 0.999995)   # wav2vec2_pretrain: (max, min, decay) of the Gumbel temperature

    def init(self, key, batch) -> dict:
        variables = self._init_fn(key, self.prepare(batch, None, False))
        if self.name in _HF_FAMILIES:
            variables = nn.unbox(variables)
        return variables

    @property
    def has_decoder(self) -> bool:
        """False for self-supervised pretraining: no transcripts, dev evaluation reports the loss only."""
        return self.loss_type != "wav2vec2_pretrain"

    # -- model families ----------------------------------------------------------------------------------------
    def _init_fn(self, key, batch):
        k1, k2 = jax.random.split(key)
        rngs = {"params": k1, "dropout": k2}
        if self.name == "conformer_ctc":
            return self.model.init(rngs, batch["features"], batch["feature_paddings"], train=False)
        if self.name in ("wav2vec2_ctc", "wav2vec2_pretrain"):
            return self.model.init(rngs, batch["audio"], batch["audio_paddings"], deterministic=True)
        if self.name == "whisper":
            ids = jnp.zeros((batch["labels"].shape[0], 4), jnp.int32)
            return self.model.init(rngs, jnp.swapaxes(batch["features"], 1, 2), ids)
        if self.name == "conformer_aed":
            return self.model.init(rngs, batch["features"], batch["feature_paddings"], batch["labels"],
                                   batch["label_paddings"], train=False)
        raise ValueError(f"no init for task {self.name!r}")

    def _apply(self, params, model_state, *args, key=None, train=False, **kw):
        variables = {"params": params, **model_state}
        rngs = {"dropout": key} if (train and key is not None) else None
        if train and model_state:
            out, updates = self.model.apply(variables, *args, train=True, rngs=rngs, mutable=list(model_state),
                                            **kw)
            return out, dict(updates)
        return self.model.apply(variables, *args, train=train, rngs=rngs, **kw), model_state

    def prepare(self, batch, key, train: bool):
        if self.name in ("wav2vec2_ctc", "wav2vec2_pretrain"):
            batch = dict(batch)
            batch["audio"] = normalize_audio(batch["audio"], batch["audio_paddings"])
            return batch
        return self.frontend(batch, key, train) if self.frontend is not None else batch

    def loss(self, params, model_state, batch, key, train: bool):
        batch = self.prepare(batch, key, train)
        if self.frozen:
            params = stop_frozen(params, self.frozen)
        if self.name == "wav2vec2_ctc":
            return self._wav2vec2_ctc_loss(params, batch, key, train)
        if self.name == "wav2vec2_pretrain":
            return self._wav2vec2_pretrain_loss(params, batch, key, train)
        if self.name == "whisper":
            return self._whisper_loss(params, batch, key, train)
        if self.loss_type == "ctc":
            (logits, out_pad), ms = self._apply(params, model_state, batch["features"], batch["feature_paddings"],
                                                key=key, train=train)
            per_utt = ctc_loss(logits.astype(jnp.float32), out_pad, batch["labels"], batch["label_paddings"],
                               self.blank_id)
            row = batch["row_weights"]
            tokens = jnp.sum((1.0 - batch["label_paddings"]) * row[:, None])
            return jnp.sum(per_utt * row), (jnp.maximum(tokens, 1.0), ms, {"ctc": jnp.sum(per_utt * row)})
        if self.name == "conformer_aed" and self.loss_type in ("attention", "joint"):
            from models.aed import label_smoothed_kl, shift_labels
            mcfg = self.model.config
            out, ms = self._apply(params, model_state, batch["features"], batch["feature_paddings"],
                                  batch["labels"], batch["label_paddings"], key=key, train=train)
            _, targets, tpad = shift_labels(batch["labels"], batch["label_paddings"], mcfg.sos_token, mcfg.eos_token)
            kl, _ = label_smoothed_kl(out["att_logits"], targets, tpad, self.label_smoothing)
            row = batch["row_weights"]
            tokens = jnp.sum((1.0 - tpad) * row[:, None])
            att = jnp.sum(kl * row)
            aux = {"att": att}
            total = att
            if self.loss_type == "joint":
                nll = ctc_loss(out["ctc_logits"].astype(jnp.float32), out["enc_paddings"], batch["labels"],
                               batch["label_paddings"], self.blank_id)
                aux["ctc"] = jnp.sum(nll * row)
                total = self.ctc_weight * aux["ctc"] + (1.0 - self.ctc_weight) * att
            return total, (jnp.maximum(tokens, 1.0), ms, aux)
        raise ValueError(f"loss type {self.loss_type!r} is not available for {self.name!r}")

    # -- wav2vec2 / whisper ------------------------------------------------------------------------------------
    def _wav2vec2_ctc_loss(self, params, batch, key, train):
        """CTC on the model's own SpecAugment (time/feature masks from the 'mask' rng when training)."""
        rngs = None
        if train and key is not None:
            kd, km = jax.random.split(key)
            rngs = {"dropout": kd, "mask": km}
        out = self.model.apply({"params": params}, batch["audio"], batch["audio_paddings"], deterministic=not train,
                               rngs=rngs)
        per_utt = ctc_loss(out.logits.astype(jnp.float32), out.paddings, batch["labels"], batch["label_paddings"],
                           self.blank_id)
        row = batch["row_weights"]
        tokens = jnp.sum((1.0 - batch["label_paddings"]) * row[:, None])
        return jnp.sum(per_utt * row), (jnp.maximum(tokens, 1.0), {}, {"ctc": jnp.sum(per_utt * row)})

    def gumbel_temperature(self, step) -> jax.Array:
        """max(max_temp * decay**step, min_temp), as transformers' wav2vec2 pretraining script."""
        hi, lo, decay = self.gumbel
        return jnp.maximum(hi * jnp.power(jnp.float32(decay), jnp.asarray(step, jnp.float32)), lo)

    def _wav2vec2_pretrain_loss(self, params, batch, key, train):
        """Contrastive + diversity loss summed over masked frames; weight = masked frames (so the reported loss
        is per masked frame). Eval uses a fixed key, so the dev loss of two checkpoints is comparable."""
        from models.wav2vec2_pretrain import pretraining_loss, sample_pretraining_inputs
        mcfg = self.model.config
        audio, pads = batch["audio"], batch["audio_paddings"]
        k = key if (train and key is not None) else jax.random.PRNGKey(0)
        k_in, kd, kg = jax.random.split(k, 3)
        mask, neg = sample_pretraining_inputs(k_in, mcfg, audio.shape[0], audio.shape[1], pads)
        mask = mask & (batch["row_weights"][:, None] > 0)
        temp = self.gumbel_temperature(batch.get("_step", 0))
        out = self.model.apply({"params": params}, audio, pads, mask_time_indices=mask, deterministic=not train,
                               gumbel_temperature=temp, rngs={"dropout": kd, "gumbel": kg} if train else None)
        pl = pretraining_loss(mcfg, out, mask, neg)
        aux = {"contrastive": pl.contrastive_loss, "diversity": pl.diversity_loss,
               "perplexity": out.codevector_perplexity, "gumbel_temperature": temp}
        return pl.loss, (jnp.maximum(pl.num_masked, 1.0), {}, aux)

    def _whisper_inputs(self, batch):
        """(features [B, n_mels, 3000], decoder inputs [B, P + N - 1], targets, target weights) from loader labels
        = text tokens + <|endoftext|>: inputs = prompt + labels[:-1], loss on the text tokens and eot only."""
        labels, lpad = batch["labels"], batch["label_paddings"]
        b, n = labels.shape
        p = len(self.prompt)
        limit = self.model.config.max_target_positions
        if p + n - 1 > limit:
            raise ValueError(f"whisper: prompt ({p}) + label bucket ({n}) tokens exceed max_target_positions={limit}; "
                             f"use shorter utterances")
        full = jnp.concatenate([jnp.broadcast_to(jnp.asarray(self.prompt, jnp.int32), (b, p)),
                                labels.astype(jnp.int32)], axis=1)
        weights = jnp.concatenate([jnp.zeros((b, p - 1), jnp.float32), 1.0 - lpad], axis=1)
        weights = weights * batch["row_weights"][:, None]
        return jnp.swapaxes(batch["features"], 1, 2), full[:, :-1], full[:, 1:], weights

    def _whisper_loss(self, params, batch, key, train):
        """Label-smoothed CE on the text tokens: (1 - eps) * NLL + eps * mean over the vocabulary of -log p (the
        transformers Trainer's label smoother)."""
        feats, inputs, targets, w = self._whisper_inputs(batch)
        model = self.model.clone(deterministic=not train) if train else self.model
        rngs = {"dropout": key} if (train and key is not None) else None
        logits = model.apply({"params": params}, feats, inputs, rngs=rngs)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        eps = self.label_smoothing
        ce = (1.0 - eps) * nll - eps * jnp.mean(logp, axis=-1)
        total = jnp.sum(ce * w)
        return total, (jnp.maximum(jnp.sum(w), 1.0), {}, {"nll": jnp.sum(nll * w)})

    def _whisper_greedy(self, params, batch):
        from models.whisper_generate import DecodeOptions, generate_from_encoder
        feats = jnp.swapaxes(batch["features"], 1, 2)
        b, n = batch["labels"].shape
        p = len(self.prompt)
        max_new = min(self.max_decode_tokens or n + 8, self.model.config.max_target_positions - p)
        opts = DecodeOptions(max_new_tokens=max_new, eos_token_id=self.eos_id, pad_token_id=self.eos_id,
                             suppress_tokens=self.suppress_tokens, begin_suppress_tokens=self.begin_suppress_tokens)
        enc = self.model.apply({"params": params}, feats, method="encode")
        prompt = jnp.broadcast_to(jnp.asarray(self.prompt, jnp.int32), (b, p))
        seqs, _ = generate_from_encoder(self.model, params, enc, prompt, opts)
        gen = seqs[:, p:]
        is_eos = gen == self.eos_id
        lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), gen.shape[1])
        return gen.astype(jnp.int32), lengths.astype(jnp.int32)

    def attention_greedy(self, params, model_state, batch):
        """Greedy attention decoding -> (ids [B, L] left-aligned, lengths [B]); L = label bucket + 1."""
        from models.aed import greedy_search
        if self.name == "whisper":
            return self._whisper_greedy(params, self.prepare(batch, None, False))
        batch = self.prepare(batch, None, False)
        toks, tpad, _ = greedy_search(self.model, {"params": params, **model_state}, batch["features"],
                                      batch["feature_paddings"], batch["labels"].shape[1] + 1)
        return toks.astype(jnp.int32), jnp.sum(1.0 - tpad, axis=1).astype(jnp.int32)

    def ctc_logits(self, params, model_state, batch):
        batch = self.prepare(batch, None, False)
        if self.name == "conformer_aed":
            from models.aed import AEDModel
            _, pad, logits = self.model.apply({"params": params, **model_state}, batch["features"],
                                              batch["feature_paddings"], False, method=AEDModel.encode)
            return logits, pad
        if self.name == "wav2vec2_ctc":
            out = self.model.apply({"params": params}, batch["audio"], batch["audio_paddings"], deterministic=True)
            return out.logits, out.paddings
        (logits, out_pad), _ = self._apply(params, model_state, batch["features"], batch["feature_paddings"],
                                           train=False)
        return logits, out_pad


# ------------------------------------------------------------------------------------------------------------
# steps

def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def train_step(state: TrainState, batch: dict, key: jax.Array, *, task: Task,
               tx: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One micro-batch: loss, gradients, (accumulated) AdamW update unless anything is non-finite."""

    batch = {**batch, "_step": state.step}

    def loss_fn(params):
        loss_sum, (weight, ms, aux) = task.loss(params, state.model_state, batch, key, True)
        return loss_sum / weight, (weight, ms, aux)

    (loss, (weight, new_ms, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    ok = jnp.isfinite(loss) & _all_finite(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
    new_state = state.replace(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        model_state=keep(new_ms, state.model_state),
        skipped=state.skipped + (1 - ok.astype(jnp.int32)),
    )
    grad_norm = optax.tree.norm(grads)
    out = {"loss": jnp.where(ok, loss, jnp.nan), "grad_norm": grad_norm, "skipped": 1.0 - ok.astype(jnp.float32),
           "tokens": weight, "param_norm": optax.tree.norm(new_state.params)}
    out.update({k: aux[k] for k in _LOGGED_AUX if k in aux})
    return new_state, out


_LOGGED_AUX = ("gumbel_temperature", "perplexity")   # per-step values averaged into the train log


def eval_step(state: TrainState, batch: dict, *, task: Task) -> dict:
    """Dev loss and greedy CTC ids (when the model has a CTC head)."""
    loss_sum, (weight, _, _) = task.loss(state.params, state.model_state, batch, None, False)
    out = {"loss_sum": loss_sum, "weight": weight}
    if task.loss_type in ("ctc", "joint"):
        logits, pad = task.ctc_logits(state.params, state.model_state, batch)
        out["ids"], out["lengths"] = decoding.ctc_greedy_decode(logits, pad, task.blank_id)
    elif task.loss_type == "attention":
        out["ids"], out["lengths"] = task.attention_greedy(state.params, state.model_state, batch)
    return out


def create_train_state(key: jax.Array, task: Task, tx: optax.GradientTransformation, batch: dict,
                       params: Any = None) -> TrainState:
    """Initialises params (unless given, e.g. from a pretrained checkpoint) and the optimiser state."""
    init_key, rng = jax.random.split(key)
    variables = task.init(init_key, batch)
    variables = dict(variables)
    p = variables.pop("params") if params is None else params
    if params is not None:
        variables.pop("params", None)
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, model_state=variables, opt_state=tx.init(p),
                      rng=rng, skipped=jnp.zeros((), jnp.int32))


def step_key(state: TrainState) -> jax.Array:
    return jax.random.fold_in(state.rng, state.step)


# ------------------------------------------------------------------------------------------------------------
# data

@dataclasses.dataclass
class RunData:
    """What the loop needs from the data side of a config."""
    tokenizer: Any
    feature_config: Any            # jasr.features.FeatureConfig (or None for raw waveforms)
    batch_config: Any              # jasr.data.BatchConfig
    manifests: dict                # split name -> manifest path
    train: list                    # list[jasr.data.Utterance]
    dev: list
    label_fn: Any = None           # text -> label ids for the loaders (None: tokenizer.encode)


def resolve(path: str, root: str) -> str:
    return path if not path or os.path.isabs(path) else os.path.join(root, path)


def split_manifests(cfg, root: str) -> dict:
    """Split name -> manifest path: train, dev, every data.eval_manifests entry, and the demo corpus splits
    (building the demo corpus first if data.demo)."""
    d = cfg.data
    out = {}
    if d.demo:
        from jasr.demo_data import DemoCorpusConfig, make_demo_corpus
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


def load_split(cfg, manifests: dict, name: str) -> list:
    """Utterances of split `name`, with the speaker filters of data.speakers_train / data.speakers_dev."""
    from jasr.data import read_manifest
    if name not in manifests:
        raise ValueError(f"unknown split {name!r}; this config has {sorted(manifests)}")
    pretrain = cfg.model.name == "wav2vec2_pretrain"
    utts = read_manifest(manifests[name], allow_empty_text=pretrain)
    if pretrain:   # no transcripts needed: a placeholder keeps the loader's non-empty-text contract
        utts = [u if u.text.strip() else dataclasses.replace(u, text=PRETRAIN_TEXT) for u in utts]
    spk_train, spk_dev = tuple(cfg.data.speakers_train), tuple(cfg.data.speakers_dev)
    if name == "train" and (spk_train or spk_dev):
        utts = [u for u in utts if (u.speaker in spk_train if spk_train else u.speaker not in spk_dev)]
    elif name == "dev" and spk_dev:
        utts = [u for u in utts if u.speaker in spk_dev]
    if not utts:
        raise ValueError(f"split {name!r} ({manifests[name]}) has no utterances after the speaker filters")
    return utts


PRETRAIN_TEXT = "-"


def label_fn_for(cfg, tokenizer):
    """How the loaders turn a transcript into labels: whisper: BPE of " " + text, then <|endoftext|> (the decoder
    prompt is added in the step); wav2vec2_pretrain: a dummy [1] (no labels); else None (tokenizer.encode)."""
    if cfg.model.name == "whisper":
        from jasr.tokenizers import normalize_whitespace
        return lambda text: tokenizer.encode(" " + normalize_whitespace(text)) + [tokenizer.eot]
    if cfg.model.name == "wav2vec2_pretrain":
        return lambda text: [1]
    return None


def feature_config(cfg):
    from jasr.features import FeatureConfig
    d = cfg.data
    if d.feature == "whisper" and cfg.model.name == "whisper":   # 30 s windows, as WhisperFeatureExtractor
        return FeatureConfig(kind="whisper", sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                             normalize="none", whisper_pad_or_trim=True)
    if d.feature == "raw":
        return FeatureConfig(kind="fbank", sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins, normalize="none")
    return FeatureConfig(kind=d.feature, sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                         normalize=d.normalize)


def model_subsampling(cfg) -> int:
    name = cfg.model.name
    if name in ("conformer_ctc", "conformer_aed"):
        return int(cfg.model.get("subsampling", 4))
    if name in ("wav2vec2_ctc", "wav2vec2_pretrain"):
        return 2  # 20 ms frames vs the 10 ms frames the loader counts
    return 1


def batch_config(cfg):
    from jasr.data import BatchConfig
    d = cfg.data
    raw = d.device_features or d.feature == "raw"
    return BatchConfig(max_frames=d.max_frames,
                       bucket_boundaries=tuple(d.bucket_boundaries) or None, num_buckets=d.num_buckets,
                       label_pad_multiple=d.label_pad_multiple, max_batch_size=d.max_batch_size or None,
                       subsampling=model_subsampling(cfg),
                       drop_unfit=d.drop_unfit, drop_too_long=d.drop_too_long,
                       output="audio" if raw else "features")


def load_or_make_tokenizer(cfg, workdir: str, train_utts, root: str):
    """The run's tokenizer: ``workdir/tokenizer.json`` if it exists (resume / decode), else built from config."""
    from jasr.tokenizers import CharTokenizer, load_tokenizer
    path = os.path.join(workdir, "tokenizer.json")
    if os.path.exists(path):
        return load_tokenizer(path)
    if cfg.data.tokenizer == "char":
        tok = CharTokenizer.from_texts([u.text for u in train_utts])
        tok.save(path + ".tmp")
        os.replace(path + ".tmp", path)
        return tok
    spec = cfg.data.tokenizer
    tok = load_tokenizer(spec if spec.startswith("whisper:") else resolve(spec, root))
    tok.save(path + ".tmp")   # the run keeps its own copy (decode.py, resume)
    os.replace(path + ".tmp", path)
    return tok


def prepare_data(cfg, workdir: str, root: str) -> RunData:
    manifests = split_manifests(cfg, root)
    train = load_split(cfg, manifests, "train")
    dev = load_split(cfg, manifests, "dev") if "dev" in manifests else []
    tok = load_or_make_tokenizer(cfg, workdir, train, root)
    return RunData(tok, feature_config(cfg), batch_config(cfg), manifests, train, dev, label_fn_for(cfg, tok))


def audio_augment(d):
    """The host-side waveform augmentation of config section `d` (speed/gain/noise), or None when it has none."""
    if not (tuple(d.speed_perturb) or d.gain_db or d.noise_snr_db):
        return None
    from jasr.augment import AudioAugment
    return AudioAugment(speeds=tuple(d.speed_perturb) or (1.0,), gain_db=tuple(d.gain_db) or None,
                        noise_snr_db=tuple(d.noise_snr_db) or None, noise_prob=d.noise_prob)


def make_train_loader(cfg, data: RunData):
    from jasr.data import make_loader
    return make_loader(data.train, data.tokenizer, data.feature_config, data.batch_config, seed=cfg.data.shuffle_seed,
                       shuffle=True, num_epochs=None, worker_count=cfg.data.num_workers, label_fn=data.label_fn,
                       augment=audio_augment(cfg.data))


def make_eval_loader(cfg, utts, tokenizer, fc, bc, *, edges=None, label_fn=None):
    """One ordered pass over `utts`. With `edges` (the training buckets' upper durations) batches get the training
    shapes, so the evaluation reuses compiled programs; longer utterances get one more bucket."""
    import dataclasses as dc
    from jasr.data import make_loader
    boundaries = None
    if edges:
        longest = max(u.duration for u in utts)
        boundaries = tuple(edges) + ((math.ceil(longest * 10) / 10 + 0.1,) if longest > edges[-1] else ())
    bc = dc.replace(bc, drop_unfit=True, drop_too_long=False, bucket_boundaries=boundaries)
    return make_loader(utts, tokenizer, fc, bc, shuffle=False, num_epochs=1, worker_count=cfg.data.num_workers,
                       label_fn=label_fn)


_DEVICE_KEYS = ("features", "feature_paddings", "audio", "audio_paddings", "labels", "label_paddings")


def device_inputs(batch: dict) -> dict:
    """The numeric part of a loader batch, plus row_weights (0 for padding rows)."""
    out = {k: batch[k] for k in _DEVICE_KEYS if k in batch}
    out["row_weights"] = 1.0 - np.asarray(batch["example_paddings"], np.float32)
    return out


def dummy_batch(shape: tuple[int, int, int], fc, raw: bool) -> dict:
    from jasr.features import feature_dim
    b, t, n = shape
    out = {"labels": np.ones((b, n), np.int32), "label_paddings": np.zeros((b, n), np.float32),
           "row_weights": np.ones((b,), np.float32)}
    if raw:
        out["audio"], out["audio_paddings"] = np.zeros((b, t), np.float32), np.zeros((b, t), np.float32)
    else:
        out["features"] = np.zeros((b, t, feature_dim(fc)), np.float32)
        out["feature_paddings"] = np.zeros((b, t), np.float32)
    return out


# ------------------------------------------------------------------------------------------------------------
# model / task construction

@dataclasses.dataclass(frozen=True)
class Frontend:
    """On-device feature extraction (raw audio batches) and SpecAugment; hashable."""
    feature_config: Any = None         # FeatureConfig when batches carry raw audio to featurise on device
    spec_augment: tuple = ()           # (freq_masks, max_freq_width, time_masks, max_time_width) or ()

    def __call__(self, batch: dict, key, train: bool) -> dict:
        from jasr.features import compute_features_jax
        if self.feature_config is not None and "audio" in batch:
            feats, pads = compute_features_jax(batch["audio"], batch["audio_paddings"], self.feature_config)
            batch = {k: v for k, v in batch.items() if k not in ("audio", "audio_paddings")}
            batch["features"], batch["feature_paddings"] = feats, pads
        if train and self.spec_augment and key is not None and "features" in batch:
            from jasr.augment import spec_augment
            fm, fw, tm, tw = self.spec_augment
            batch = dict(batch)
            batch["features"] = spec_augment(jax.random.fold_in(key, 7), batch["features"],
                                             batch["feature_paddings"], num_freq_masks=fm, max_freq_width=fw,
                                             num_time_masks=tm, max_time_width=tw)
        return batch


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def init_source(cfg, workdir: str, root: str) -> str | None:
    """The folder with the HF ``config.json`` (+ ``generation_config.json``) the model architecture comes from:
    a copy of train.init_from's in ``workdir/init_from/`` (made on the first call), so that a run folder stays
    loadable (decode.py) without the original directory. None without train.init_from."""
    import shutil
    if not cfg.train.init_from:
        return None
    local = os.path.join(workdir, "init_from")
    if os.path.isfile(os.path.join(local, "config.json")):
        return local
    src = resolve(cfg.train.init_from, root)
    if not os.path.isfile(os.path.join(src, "config.json")):
        from jasr.config import ConfigError
        raise ConfigError(f"config 'train.init_from': {src} has no config.json (not a Hugging Face model folder)")
    os.makedirs(local, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(local, name))
    return local


def _build_hf_family(cfg, name: str, fields: dict, vocab_size: int, tokenizer, hf_dir: str | None) -> dict:
    """Task keyword arguments for wav2vec2_ctc / wav2vec2_pretrain / whisper (architecture from hf_dir's
    config.json when given, the model section overriding its fields)."""
    from jasr.config import ConfigError
    t, d = cfg.train, cfg.data
    hf = _read_json(os.path.join(hf_dir, "config.json")) if hf_dir else None
    if name in ("wav2vec2_ctc", "wav2vec2_pretrain"):
        from models.wav2vec2 import Wav2Vec2Config, Wav2Vec2ForCTC
        from models.wav2vec2_pretrain import Wav2Vec2ForPreTraining
        if name == "wav2vec2_ctc":
            # the head is sized to jasr's tokenizer; its blank (0) is the config's pad id, as in transformers
            fields = {**fields, "vocab_size": vocab_size, "pad_token_id": 0}
        try:
            mcfg = Wav2Vec2Config.from_hf(hf, **fields) if hf else Wav2Vec2Config(**fields)
        except (TypeError, ValueError, NotImplementedError) as e:
            raise ConfigError(f"config 'model' for {name!r}: {e}") from e
        model = Wav2Vec2ForCTC(mcfg) if name == "wav2vec2_ctc" else Wav2Vec2ForPreTraining(mcfg)
        frozen = ("wav2vec2/feature_extractor",) if t.freeze_feature_encoder else ()
        return dict(model=model, frozen=frozen, blank_id=0,
                    gumbel=(float(cfg.loss.max_gumbel_temperature), float(cfg.loss.min_gumbel_temperature),
                            float(cfg.loss.gumbel_temperature_decay)))
    from models.whisper import WhisperConfig, WhisperModel
    from jasr.tokenizers import WhisperTokenizer
    if not isinstance(tokenizer, WhisperTokenizer):
        raise ConfigError(f"config 'data.tokenizer': model 'whisper' needs a Whisper tokenizer, got {tokenizer!r}")
    dtype = fields.pop("dtype", "float32")
    remat, scan = bool(fields.pop("remat", False)), bool(fields.pop("scan_layers", False))
    try:
        mcfg = WhisperConfig.from_hf_dict({**hf, **fields}) if hf else WhisperConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config 'model' for 'whisper': {e}") from e
    if mcfg.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"config 'data.tokenizer': {tokenizer!r} has {tokenizer.vocab_size} tokens, more than the "
                          f"model's vocab_size {mcfg.vocab_size}")
    if mcfg.num_mel_bins != d.num_mel_bins:
        raise ConfigError(f"config 'data.num_mel_bins'={d.num_mel_bins} must equal the Whisper model's "
                          f"num_mel_bins={mcfg.num_mel_bins}")
    gen = {}
    if hf_dir and os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
        gen = _read_json(os.path.join(hf_dir, "generation_config.json"))
    model = WhisperModel(mcfg, dtype=jnp.dtype(dtype), remat=remat, scan_layers=scan)
    return dict(model=model, frozen=("encoder/embed_positions",),   # sinusoids, frozen as in transformers
                prompt=tuple(int(x) for x in tokenizer.sot_sequence_including_notimestamps),
                eos_id=int(tokenizer.eot), max_decode_tokens=int(t.max_decode_tokens),
                suppress_tokens=tuple(int(x) for x in (gen.get("suppress_tokens") or ())),
                begin_suppress_tokens=tuple(int(x) for x in (gen.get("begin_suppress_tokens") or ())))


def load_pretrained_params(task: Task, directory: str, key: jax.Array) -> dict:
    """The task's parameter tree from a transformers directory (strict about every tensor it uses).

    wav2vec2_ctc: the encoder from any Wav2Vec2 checkpoint (pretraining, base or CTC); the CTC head
    (``lm_head``) is always initialised fresh from `key`, since jasr's tokenizer is not the checkpoint's
    vocabulary (tensors of other heads are dropped). wav2vec2_pretrain: the pretraining heads are loaded when
    present, else initialised. whisper: every tensor.
    """
    from models.hf_io import load_state_dict
    sd = load_state_dict(directory)
    if task.name in ("wav2vec2_ctc", "wav2vec2_pretrain"):
        from models.wav2vec2_hf import params_from_hf_state_dict
        mcfg = task.model.config
        drop = ("lm_head.",) + (("quantizer.", "project_hid.", "project_q.") if task.name == "wav2vec2_ctc" else ())
        if mcfg.mask_time_prob <= 0 and mcfg.mask_feature_prob <= 0:
            drop += ("masked_spec_embed", "wav2vec2.masked_spec_embed")
        sd = {k: v for k, v in sd.items() if not k.startswith(drop)}
        return params_from_hf_state_dict(sd, mcfg, "ctc" if task.name == "wav2vec2_ctc" else "pretraining",
                                         init_missing=key)
    if task.name == "whisper":
        from models.whisper_hf import hf_to_params
        return hf_to_params(sd, task.model.config, scan_layers=task.model.scan_layers)
    raise ValueError(f"train.init_from is not supported for {task.name!r}")


def build_task(cfg, vocab_size: int, fc, *, tokenizer=None, hf_dir: str | None = None) -> Task:
    """Model + loss for the config's model.name (vocab_size and input dim are filled in from the data;
    `hf_dir`: see init_source; `tokenizer`: the run's, needed for whisper's prompt)."""
    from jasr.config import model_fields
    from jasr.features import feature_dim
    name = cfg.model.name
    fields = model_fields(cfg)
    if cfg.train.precision == "bfloat16":
        fields["dtype"] = "bfloat16"
    d = cfg.data
    frontend = Frontend(fc if (d.device_features and d.feature != "raw") else None,
                        (d.freq_masks, d.max_freq_width, d.time_masks, d.max_time_width) if d.spec_augment else ())
    if name == "conformer_ctc":
        from models.conformer import ConformerConfig, ConformerCTC
        mcfg = ConformerConfig(**{**fields, "vocab_size": vocab_size, "input_dim": feature_dim(fc)})
        model = ConformerCTC(mcfg)
    elif name == "conformer_aed":
        from models.aed import AEDConfig, AEDModel
        enc = dict(fields.pop("encoder", {}))
        enc["input_dim"] = feature_dim(fc)
        if "dtype" in fields:
            enc["dtype"] = fields.pop("dtype")
        mcfg = AEDConfig.from_dict({**fields, "encoder": enc, "vocab_size": vocab_size + 1,  # + sos/eos id
                                    "ctc_weight": cfg.loss.ctc_weight if cfg.loss.type == "joint" else 0.0,
                                    "label_smoothing": cfg.loss.label_smoothing})
        model = AEDModel(mcfg)
    elif name in _HF_FAMILIES:
        kw = _build_hf_family(cfg, name, fields, vocab_size, tokenizer, hf_dir)
        return Task(name=name, loss_type=cfg.loss.type, label_smoothing=cfg.loss.label_smoothing, **kw)
    else:
        raise ValueError(f"model {name!r} is not wired into training")
    return Task(name=name, model=model, loss_type=cfg.loss.type, ctc_weight=cfg.loss.ctc_weight,
                label_smoothing=cfg.loss.label_smoothing, frontend=frontend)


# ------------------------------------------------------------------------------------------------------------
# evaluation and inference

def evaluate(state: TrainState, eval_fn: Callable, loader, tokenizer, texts: dict, *, max_batches: int = 0,
             blank_id: int = 0) -> tuple[dict, list[dict]]:
    """Runs `eval_fn` over one pass of `loader`; returns ({loss, wer, cer, utterances}, per-utterance results).

    `texts`: utterance id -> reference transcript (None/"" for files without one: no WER for those).
    """
    loss_sum = weight = 0.0
    results = []
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        out = jax.device_get(eval_fn(state, device_inputs(batch)))
        loss_sum += float(out["loss_sum"])
        weight += float(out["weight"])
        ids = [str(x) for x in batch["ids"]]
        if "ids" in out:
            for r, uid in enumerate(ids):
                if not uid:
                    continue
                hyp_ids = out["ids"][r, :int(out["lengths"][r])].tolist()
                results.append({"id": uid, "ref": texts.get(uid) or "",
                                "hyp": " ".join(tokenizer.decode(hyp_ids).split())})
    m = {"loss": loss_sum / max(weight, 1.0), "utterances": len(results)}
    scored = [r for r in results if r["ref"]]
    if scored:
        refs, hyps = [r["ref"] for r in scored], [r["hyp"] for r in scored]
        m["wer"] = metrics_lib.wer(refs, hyps)
        m["cer"] = metrics_lib.cer(refs, hyps)
    return m, results


def _eval_jit(task: Task):
    return jax.jit(functools.partial(eval_step, task=task))


# ------------------------------------------------------------------------------------------------------------
# the loop

def commit(tree):
    """Places every array on its current sharding explicitly ("committed", as restored arrays are), so fresh and
    restored states lower to the same program."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), tree)


def _abstract_like(tree):
    """Restore targets with the live state's shardings: a restored state then lowers to the same program as a
    fresh one (so the persistent compilation cache hits on resume)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=device), tree)


def _check_resume_config(cfg, workdir: str) -> None:
    """A run may only resume with the config it started with (num_steps and display options may change)."""
    from jasr.config import ConfigError, load_saved_config
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    old = load_saved_config(path).to_dict()
    new = cfg.to_dict()
    mutable = {("train", "num_steps"), ("train", "progress"), ("train", "stop_after"), ("train", "tensorboard"),
               ("train", "async_checkpoint")}

    def flat(d, prefix=()):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, prefix + (k,))
            else:
                yield prefix + (k,), (list(v) if isinstance(v, tuple) else v)
    a, b = dict(flat(old)), dict(flat(new))
    diff = sorted(".".join(k) for k in set(a) | set(b) if k not in mutable and a.get(k) != b.get(k))
    if diff:
        raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(diff[:5])} differ); "
                          f"resume with the same config or use a new --workdir")


def train(cfg, workdir: str, *, root: str | None = None) -> dict:
    """Trains (or resumes) the run in `workdir`. Returns the final metrics (train loss, dev WER/CER, steps)."""
    from jasr.checkpoint import Checkpointer
    from jasr.config import save_config, validate_config
    from jasr.logs import TrainLogger
    from jasr.optim import make_optimizer_from_config

    root = os.path.abspath(root or os.getcwd())
    validate_config(cfg, repo_root=root)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    resuming = os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))
    if resuming:
        _check_resume_config(cfg, workdir)
    save_config(cfg, os.path.join(workdir, "config.json"))
    t, o = cfg.train, cfg.optim

    data = prepare_data(cfg, workdir, root)
    hf_dir = init_source(cfg, workdir, root)
    task = build_task(cfg, data.tokenizer.vocab_size, data.feature_config, tokenizer=data.tokenizer, hf_dir=hf_dir)
    train_loader = make_train_loader(cfg, data)
    raw = data.batch_config.output == "audio"
    tx, schedule = make_optimizer_from_config(o, t.num_steps // o.grad_accum, frozen=task.frozen)
    init_batch = dummy_batch(train_loader.bucket_shapes[0], data.feature_config, raw)
    init_fn = jax.jit(functools.partial(create_train_state, task=task, tx=tx))
    init_key = jax.random.PRNGKey(cfg.seed)
    abstract = jax.eval_shape(init_fn, init_key, batch=init_batch)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
    print(f"[train] model {cfg.model.name}: {n_params / 1e6:.2f}M parameters; vocab {data.tokenizer.vocab_size}; "
          f"{len(data.train)} train / {len(data.dev)} dev utterances; batch shapes {train_loader.bucket_shapes}",
          flush=True)

    edges = [float(b.max_duration) for b in train_loader.buckets]
    with open(os.path.join(workdir, "buckets.json"), "w") as f:
        json.dump({"bucket_boundaries": edges, "bucket_shapes": train_loader.bucket_shapes}, f)
    it = iter(train_loader)
    best_metric = _best_metric(task)
    ckpt = Checkpointer(ckpt_dir, keep_last=t.keep_last, keep_best=t.keep_best,
                        async_save=t.async_checkpoint, best_metric=best_metric)
    start = 0
    if ckpt.latest_step() is None:
        if t.init_from:
            src = resolve(t.init_from, root)
            params = load_pretrained_params(task, src, jax.random.fold_in(init_key, 1))
            _check_same_tree(params, abstract.params, src)
            state = commit(jax.jit(functools.partial(create_train_state, task=task, tx=tx))(
                init_key, batch=init_batch, params=params))
            print(f"[train] initialised from {src}", flush=True)
        else:
            state = commit(init_fn(init_key, batch=init_batch))
    else:
        state, extra = ckpt.restore(None, _abstract_like(abstract))
        it.set_state(extra["data_state"])
        start = int(state.step)
        print(f"[train] resumed from {ckpt_dir} at step {start}", flush=True)
    if start >= t.num_steps:
        print(f"[train] already at step {start} >= train.num_steps={t.num_steps}; nothing to do", flush=True)
        ckpt.close()
        return {"step": start}

    train_fn = jax.jit(functools.partial(train_step, task=task, tx=tx))
    eval_fn = _eval_jit(task)
    dev_loader = dev_texts = None
    if data.dev:
        dev_loader = make_eval_loader(cfg, data.dev, data.tokenizer, data.feature_config, data.batch_config,
                                      edges=edges, label_fn=data.label_fn)
        dev_texts = {u.id: u.text for u in data.dev}
    logger = TrainLogger(workdir, t.num_steps, start, progress=t.progress, tensorboard=t.tensorboard)
    acc, n_acc = None, 0
    step = start
    final = {}
    t0 = time.time()
    try:
        while step < t.num_steps:
            batch = next(it)
            inputs = device_inputs(batch)
            state, m = train_fn(state, inputs, step_key(state))
            step += 1
            acc = m if acc is None else jax.tree.map(jnp.add, acc, m)
            n_acc += 1
            logger.count(float(inputs["row_weights"].sum()), float(np.sum(batch["durations"])))
            if step % t.log_every == 0 or step == t.num_steps:
                host = jax.device_get(acc)
                rec = {"loss": float(host["loss"]) / n_acc, "grad_norm": float(host["grad_norm"]) / n_acc,
                       "skipped": float(host["skipped"]), "skipped_total": int(state.skipped),
                       "lr": float(schedule(step // o.grad_accum)), "param_norm": float(host["param_norm"]) / n_acc}
                rec.update({k: float(host[k]) / n_acc for k in _LOGGED_AUX if k in host})
                final.update(logger.log_train(step, rec))
                acc, n_acc = None, 0
            dev_metrics = None
            if dev_loader is not None and (step % t.eval_every == 0 or step == t.num_steps):
                dev_metrics, _ = evaluate(state, eval_fn, dev_loader, data.tokenizer, dev_texts,
                                          max_batches=t.max_eval_batches)
                logger.log_eval(step, "dev", dev_metrics)
                final.update({f"dev_{k}": v for k, v in dev_metrics.items()})
            stop_now = bool(t.stop_after) and step - start >= t.stop_after and step % t.log_every == 0
            if step % t.checkpoint_every == 0 or step == t.num_steps or stop_now:
                key = best_metric[len("dev_"):]
                ckpt_metrics = ({best_metric: float(dev_metrics[key])} if dev_metrics and key in dev_metrics
                                else None)
                ckpt.save(step, state, extra={"data_state": it.get_state(), "step": step}, metrics=ckpt_metrics)
            logger.advance(step)
            if stop_now:
                logger.write(f"[train] stopping after {step - start} steps (train.stop_after)")
                break
    finally:
        ckpt.close()
        logger.close()
    final.update({"step": step, "wall_s": time.time() - t0, "skipped_total": int(state.skipped)})
    return final


# ------------------------------------------------------------------------------------------------------------
# inference from a run folder

def _best_metric(task: Task) -> str:
    """Which dev metric picks the best checkpoint: WER, or the loss for a task without a decoder (pretraining)."""
    return "dev_wer" if task.has_decoder else "dev_loss"


def _check_same_tree(params, abstract, src: str) -> None:
    """Pretrained params must have the model's structure and shapes (a clear error instead of a jit failure)."""
    from jax.tree_util import keystr, tree_flatten_with_path
    a = {keystr(k): tuple(v.shape) for k, v in tree_flatten_with_path(params)[0]}
    b = {keystr(k): tuple(v.shape) for k, v in tree_flatten_with_path(abstract)[0]}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ValueError(f"train.init_from {src}: parameters do not fit the model ({diff[:3]}: "
                         f"{[a.get(k) for k in diff[:3]]} vs {[b.get(k) for k in diff[:3]]})")


def load_run(workdir: str, *, checkpoint: str = "best", root: str | None = None):
    """RunInfo(config, tokenizer, task, state, step, bucket_edges) of a trained run; `checkpoint`: "best", "latest" or a step."""
    from jasr.checkpoint import Checkpointer
    from jasr.config import load_saved_config
    from jasr.tokenizers import load_tokenizer

    workdir = os.path.abspath(workdir)
    cfg_path = os.path.join(workdir, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{workdir} is not a training run folder (no config.json)")
    cfg = load_saved_config(cfg_path)
    tok = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    fc = feature_config(cfg)
    hf_dir = os.path.join(workdir, "init_from")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        hf_dir = resolve(cfg.train.init_from, root or os.getcwd()) if cfg.train.init_from else None
    task = build_task(cfg, tok.vocab_size, fc, tokenizer=tok, hf_dir=hf_dir)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=cfg.train.keep_last,
                        keep_best=cfg.train.keep_best, async_save=False, best_metric=_best_metric(task))
    if checkpoint == "best":
        step = ckpt.best_step() or ckpt.latest_step()
    elif checkpoint == "latest":
        step = ckpt.latest_step()
    else:
        step = int(checkpoint)
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints")
    o = cfg.optim
    tx, _ = make_optimizer_from_config_for_restore(o, cfg.train.num_steps, task.frozen)
    raw = cfg.data.device_features or cfg.data.feature == "raw"
    shape = (1, 3000 if cfg.model.name == "whisper" else (400 if not raw else 64000), 8)
    target = jax.eval_shape(lambda: create_train_state(jax.random.PRNGKey(0), task, tx,
                                                       dummy_batch(shape, fc, raw)))
    state, _ = ckpt.restore(step, _abstract_like(target))
    ckpt.close()
    edges = None
    if os.path.exists(os.path.join(workdir, "buckets.json")):
        with open(os.path.join(workdir, "buckets.json")) as f:
            edges = json.load(f)["bucket_boundaries"]
    return RunInfo(cfg, tok, task, state, step, edges)


@dataclasses.dataclass
class RunInfo:
    """A trained run loaded for inference (see load_run)."""
    config: Any
    tokenizer: Any
    task: Task
    state: TrainState
    step: int
    bucket_edges: list | None


def make_optimizer_from_config_for_restore(o, num_steps, frozen=()):
    from jasr.optim import make_optimizer_from_config
    return make_optimizer_from_config(o, max(num_steps // o.grad_accum, 1), frozen=frozen)


def enable_compilation_cache(root: str) -> None:
    """JAX's persistent compilation cache ($JAX_COMPILATION_CACHE_DIR or <root>/.cache/jax): a resumed run and
    decode.py reuse the programs a run compiled."""
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(root, ".cache", "jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
