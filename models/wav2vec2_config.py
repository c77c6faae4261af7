"""Wav2Vec2's configuration (transformers' ``Wav2Vec2Config`` fields) and the shape arithmetic of its conv feature
encoder: output frames and frame paddings for a number of samples, and input checks. The network is in
:mod:`models.wav2vec2`."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

_HF_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout", "activation_dropout", "attention_dropout", "feat_proj_dropout", "feat_quantizer_dropout",
    "final_dropout", "layerdrop", "initializer_range", "layer_norm_eps", "feat_extract_norm",
    "feat_extract_activation", "conv_dim", "conv_stride", "conv_kernel", "conv_bias", "num_conv_pos_embeddings",
    "num_conv_pos_embedding_groups", "do_stable_layer_norm", "apply_spec_augment", "mask_time_prob",
    "mask_time_length", "mask_time_min_masks", "mask_feature_prob", "mask_feature_length", "mask_feature_min_masks",
    "num_codevectors_per_group", "num_codevector_groups", "contrastive_logits_temperature", "num_negatives",
    "codevector_dim", "proj_codevector_dim", "diversity_loss_weight", "ctc_loss_reduction", "ctc_zero_infinity",
    "pad_token_id", "bos_token_id", "eos_token_id", "add_adapter", "adapter_attn_dim",
)


@dataclasses.dataclass(frozen=True)
class Wav2Vec2Config:
    """Field names and defaults as transformers' ``Wav2Vec2Config`` (facebook/wav2vec2-base), plus jasr options."""

    vocab_size: int | None = 32
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout: float = 0.1
    activation_dropout: float = 0.1
    attention_dropout: float = 0.1
    feat_proj_dropout: float = 0.0
    feat_quantizer_dropout: float = 0.0
    final_dropout: float = 0.1
    layerdrop: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    feat_extract_norm: str = "group"
    feat_extract_activation: str = "gelu"
    conv_dim: tuple[int, ...] = (512, 512, 512, 512, 512, 512, 512)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_bias: bool = False
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    do_stable_layer_norm: bool = False
    apply_spec_augment: bool = True
    mask_time_prob: float = 0.05
    mask_time_length: int = 10
    mask_time_min_masks: int = 2
    mask_feature_prob: float = 0.0
    mask_feature_length: int = 10
    mask_feature_min_masks: int = 0
    num_codevectors_per_group: int = 320
    num_codevector_groups: int = 2
    contrastive_logits_temperature: float = 0.1
    num_negatives: int = 100
    codevector_dim: int = 256
    proj_codevector_dim: int = 256
    diversity_loss_weight: float = 0.1
    ctc_loss_reduction: str = "sum"
    ctc_zero_infinity: bool = False
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    add_adapter: bool = False
    adapter_attn_dim: int | None = None
    # jasr options (not part of the Hugging Face config)
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    scan_layers: bool = False
    attention_chunk_size: int = 512  # queries per attention block (memory O(chunk * T)); 0 = unchunked

    def __post_init__(self):
        for f in ("conv_dim", "conv_stride", "conv_kernel"):
            object.__setattr__(self, f, tuple(int(v) for v in getattr(self, f)))
        if not (len(self.conv_dim) == len(self.conv_stride) == len(self.conv_kernel)) or not self.conv_dim:
            raise ValueError(f"conv_dim {self.conv_dim}, conv_stride {self.conv_stride} and conv_kernel "
                             f"{self.conv_kernel} must be non-empty and of the same length")
        if self.feat_extract_norm not in ("group", "layer"):
            raise ValueError(f"feat_extract_norm={self.feat_extract_norm!r}: expected 'group' or 'layer'")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.hidden_size % self.num_conv_pos_embedding_groups:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_conv_pos_embedding_groups "
                             f"{self.num_conv_pos_embedding_groups}")
        if self.codevector_dim % self.num_codevector_groups:
            raise ValueError(f"codevector_dim {self.codevector_dim} is not divisible by num_codevector_groups "
                             f"{self.num_codevector_groups}")
        if self.add_adapter:
            raise NotImplementedError("Wav2Vec2 with add_adapter=True (conv adapter on top) is not supported")
        if self.adapter_attn_dim is not None:
            raise NotImplementedError("Wav2Vec2 attention adapters (adapter_attn_dim, MMS) are not supported")
        if self.ctc_loss_reduction not in ("sum", "mean", "none"):
            raise ValueError(f"ctc_loss_reduction={self.ctc_loss_reduction!r}: expected 'sum', 'mean' or 'none'")
        for f in ("dtype", "param_dtype"):
            dt = jnp.dtype(getattr(self, f))
            if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
                raise ValueError(f"{f}={getattr(self, f)!r}: expected float32, bfloat16 or float16")
            object.__setattr__(self, f, dt.name)
        activation(self.hidden_act)
        activation(self.feat_extract_activation)

    # -- Hugging Face config.json ------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> "Wav2Vec2Config":
        """From a transformers ``config.json`` dict (unknown keys ignored); ``overrides`` set jasr options too."""
        mt = hf.get("model_type", "wav2vec2")
        if mt != "wav2vec2":
            raise ValueError(f"config model_type={mt!r}, expected 'wav2vec2'")
        kw = {k: hf[k] for k in _HF_FIELDS if k in hf}
        kw.update(overrides)
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _HF_FIELDS}
        for f in ("conv_dim", "conv_stride", "conv_kernel"):
            d[f] = list(d[f])
        d["num_feat_extract_layers"] = len(self.conv_dim)
        d["model_type"] = "wav2vec2"
        return d

    def replace(self, **kw) -> "Wav2Vec2Config":
        return dataclasses.replace(self, **kw)

    # -- lengths -------------------------------------------------------------------------------------------------
    @property
    def receptive_field(self) -> int:
        """Samples needed for one output frame of the conv feature encoder (400 for the base config)."""
        r, jump = 1, 1
        for k, s in zip(self.conv_kernel, self.conv_stride):
            r += (k - 1) * jump
            jump *= s
        return r

    @property
    def inputs_to_logits_ratio(self) -> int:
        return int(np.prod(self.conv_stride))


def feat_extract_output_lengths(config: Wav2Vec2Config, input_lengths):
    """Frames produced by the conv feature encoder for ``input_lengths`` samples (int, numpy or jax array)."""
    lengths = input_lengths
    for k, s in zip(config.conv_kernel, config.conv_stride):
        lengths = (lengths - k) // s + 1
    if isinstance(lengths, (int, np.integer)):
        return max(int(lengths), 0)
    return jnp.maximum(lengths, 0) if isinstance(lengths, jax.Array) else np.maximum(lengths, 0)


def frame_paddings(config: Wav2Vec2Config, paddings: jax.Array, num_frames: int) -> jax.Array:
    """Frame-level paddings ``[B, num_frames]`` (1.0 = padded) from sample-level ``paddings [B, S]``."""
    lengths = jnp.sum(1.0 - paddings.astype(jnp.float32), axis=-1).round().astype(jnp.int32)
    out = feat_extract_output_lengths(config, lengths)
    return (jnp.arange(num_frames)[None, :] >= out[:, None]).astype(jnp.float32)


def check_audio(config: Wav2Vec2Config, input_values, paddings=None) -> None:
    """Clear errors for bad audio input (shape, length below the receptive field). Per-row length checks run only on
    concrete (non-traced) paddings; fully padded rows (batch fillers) are allowed and give all-padded frames."""
    if input_values.ndim != 2:
        raise ValueError(f"input_values must be [batch, samples], got shape {tuple(input_values.shape)}")
    n = input_values.shape[1]
    if n < config.receptive_field:
        raise ValueError(f"audio of {n} samples is shorter than the receptive field of the Wav2Vec2 feature "
                         f"encoder ({config.receptive_field} samples)")
    if paddings is None:
        return
    if tuple(paddings.shape) != tuple(input_values.shape):
        raise ValueError(f"paddings shape {tuple(paddings.shape)} != input_values shape "
                         f"{tuple(input_values.shape)}")
    if isinstance(paddings, jax.core.Tracer):
        return
    lengths = np.round(np.sum(1.0 - np.asarray(paddings, np.float32), axis=-1)).astype(np.int64)
    short = np.nonzero((lengths > 0) & (lengths < config.receptive_field))[0]  # empty filler rows are fine
    if short.size:
        raise ValueError(f"rows {short.tolist()} have {lengths[short].tolist()} valid samples, fewer than the "
                         f"receptive field of the Wav2Vec2 feature encoder ({config.receptive_field} samples)")


def activation(name: str) -> Callable:
    """The activation function of a config name (transformers' ACT2FN subset)."""
    table = {
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "relu": jax.nn.relu,
        "silu": jax.nn.silu,
        "swish": jax.nn.silu,
        "tanh": jnp.tanh,
    }
    if name not in table:
        raise ValueError(f"activation {name!r} is not supported (one of {sorted(table)})")
    return table[name]
