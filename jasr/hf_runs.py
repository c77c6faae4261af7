"""Hugging Face model directories decoded as they are (decode.py ``--hf-model``): a Whisper
(WhisperForConditionalGeneration) or Wav2Vec2ForCTC folder as a :class:`jasr.training.RunInfo`, with the model's
own tokenizer (:class:`HFCTCTokenizer` for a CTC vocab.json) and output layer."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from jasr.config import apply_override, load_config_file
from jasr.errors import ConfigError
from jasr.run_data import feature_config
from jasr.steps import TrainState
from jasr.tasks import build_task
from jasr.tokenizers import TokenizerError, load_tokenizer
from jasr.training import RunInfo
from models.hf_io import load_state_dict
from models.wav2vec2_hf import params_from_hf_state_dict

__all__ = ["HFCTCTokenizer", "load_hf_model"]


class HFCTCTokenizer:
    """The vocabulary of a transformers Wav2Vec2CTCTokenizer (``vocab.json``: token -> id) as a character tokenizer:
    single-character tokens spell text, the word delimiter ("|") is the space, multi-character tokens (<pad>,
    <s>, </s>, <unk>) decode to nothing. ``chars[i]`` is the character of id i + 1 (jasr.lexicon's convention)."""
    type_name = "hf_ctc"

    def __init__(self, vocab: dict, vocab_size: int = 0, word_delimiter: str = "|"):
        self.vocab_size = max([vocab_size, *[i + 1 for i in vocab.values()]])
        piece = {i: t for t, i in vocab.items()}
        self.chars = [(" " if piece.get(i) == word_delimiter else piece.get(i, "")) for i in range(1, self.vocab_size)]
        self.chars = [c if len(c) == 1 else "" for c in self.chars]
        self._index = {c: i + 1 for i, c in enumerate(self.chars) if c}

    def encode(self, text: str) -> list[int]:
        missing = sorted({c for c in text if c not in self._index})
        if missing:
            raise TokenizerError(f"characters not in the model's vocabulary: {missing[:10]}")
        return [self._index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i < self.vocab_size)


def load_hf_model(directory: str, root: str) -> RunInfo:
    """A Hugging Face Whisper (WhisperForConditionalGeneration) or Wav2Vec2-CTC (Wav2Vec2ForCTC, with its vocab.json)
    directory as a RunInfo for :func:`transcribe`, with the settings of configs/whisper_finetune.py or
    configs/wav2vec2_ctc.py (features, batching) and the model's own tokenizer and output layer."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--hf-model: {directory} is not a Hugging Face model directory (no config.json)")
    with open(path) as f:
        hf = json.load(f)
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind == "whisper":
        cfg = load_config_file(os.path.join(root, "configs", "whisper_finetune.py"))
        vocab = int(hf.get("vocab_size", 51865))
        spec = "whisper:gpt2" if vocab < 51865 else ("whisper:multilingual:100" if vocab > 51865
                                                     else "whisper:multilingual")
        apply_override(cfg, "data.tokenizer", spec)
        apply_override(cfg, "data.num_mel_bins", str(int(hf.get("num_mel_bins", 80))))
        tok = load_tokenizer(spec)
        task = build_task(cfg, tok.vocab_size, feature_config(cfg), tokenizer=tok, hf_dir=directory)
        params = task.load_pretrained(directory, jax.random.PRNGKey(0))
    elif kind == "wav2vec2" and any(a.endswith("ForCTC") for a in archs):
        vpath = os.path.join(directory, "vocab.json")
        if not os.path.isfile(vpath):
            raise FileNotFoundError(f"--hf-model: {directory} has no vocab.json (the CTC tokenizer's vocabulary)")
        if int(hf.get("pad_token_id", 0)) != 0:
            raise ConfigError(f"--hf-model: jasr's CTC blank is id 0, the model's pad (blank) id is "
                              f"{hf['pad_token_id']}")
        with open(vpath) as f:
            tok = HFCTCTokenizer(json.load(f), int(hf.get("vocab_size", 0)))
        cfg = load_config_file(os.path.join(root, "configs", "wav2vec2_ctc.py"))
        for k in ("mask_time_prob", "mask_feature_prob"):     # as the checkpoint (masked_spec_embed or not)
            with cfg.model.unlocked():
                cfg.model[k] = float(hf.get(k, 0.0))
        task = build_task(cfg, tok.vocab_size, feature_config(cfg), tokenizer=tok, hf_dir=directory)
        params = params_from_hf_state_dict(load_state_dict(directory), task.model.config, "ctc")
    else:
        raise ConfigError(f"--hf-model: {directory} holds a {kind!r} model {archs}; decode.py reads Whisper "
                          f"(WhisperForConditionalGeneration) and Wav2Vec2ForCTC directories")
    apply_override(cfg, "train.init_from", directory)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state={}, opt_state=(),
                       rng=jax.random.PRNGKey(0), skipped=jnp.zeros((), jnp.int32))
    return RunInfo(cfg, tok, task, state, 0, None)
