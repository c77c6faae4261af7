"""Hugging Face checkpoints <-> jasr Wav2Vec2 parameters, and native (orbax) checkpoints.

``from_pretrained(directory)`` reads a transformers directory (``config.json`` + ``model.safetensors``, a sharded
set, or ``pytorch_model.bin`` when torch is installed) and maps every tensor onto the Flax parameter tree of
:class:`~models.wav2vec2.Wav2Vec2Model`, :class:`~models.wav2vec2.Wav2Vec2ForCTC` or
:class:`~models.wav2vec2_pretrain.Wav2Vec2ForPreTraining`. The weight-normed positional conv is read under its new
(``parametrizations.weight.original0/1``) or old (``weight_g``/``weight_v``) names. A missing tensor, or one the
model does not use, is a :class:`~models.hf_io.CheckpointKeyError` naming it. ``save_pretrained`` writes a
directory transformers loads (new weight-norm names). Both directions work on plain per-layer trees and on
``scan_layers`` trees (stacked along a leading ``layers`` axis).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from models.hf_io import CheckpointKeyError, StrictKeys, load_config, load_state_dict, save_checkpoint
from models.wav2vec2 import Wav2Vec2Config, Wav2Vec2ForCTC, Wav2Vec2Model
from models.wav2vec2_pretrain import Wav2Vec2ForPreTraining

__all__ = ["HEADS", "build_model", "abstract_params", "params_from_hf_state_dict", "params_to_hf_state_dict",
           "from_pretrained", "save_pretrained", "save_native", "load_native"]

HEADS = {"base": "Wav2Vec2Model", "ctc": "Wav2Vec2ForCTC", "pretraining": "Wav2Vec2ForPreTraining"}
_ARCH_TO_HEAD = {v: k for k, v in HEADS.items()}
_HEAD_PREFIXES = {"ctc": ("lm_head.",), "pretraining": ("quantizer.", "project_hid.", "project_q.")}
_WN_NAMES = {  # flax leaf -> (new name, old name) under ...pos_conv_embed.conv.
    "weight_g": ("parametrizations.weight.original0", "weight_g"),
    "weight_v": ("parametrizations.weight.original1", "weight_v"),
}


def build_model(config: Wav2Vec2Config, head: str = "ctc") -> nn.Module:
    if head == "base":
        return Wav2Vec2Model(config)
    if head == "ctc":
        return Wav2Vec2ForCTC(config)
    if head == "pretraining":
        return Wav2Vec2ForPreTraining(config)
    raise ValueError(f"head={head!r}: expected one of {sorted(HEADS)}")


def abstract_params(config: Wav2Vec2Config, head: str = "ctc") -> dict:
    """Shapes/dtypes (``jax.ShapeDtypeStruct``) of the parameter tree, unboxed, without allocating."""
    model = build_model(config, head)
    x = jnp.zeros((1, config.receptive_field), jnp.float32)
    shapes = jax.eval_shape(lambda k: model.init(k, x), jax.random.PRNGKey(0))
    return nn.unbox(shapes)["params"]


# ---------------------------------------------------------------------------------------------------------------------
# name and layout mapping, one flax leaf at a time
# ---------------------------------------------------------------------------------------------------------------------

def _hf_parts(parts: tuple[str, ...]) -> list[str]:
    out = []
    for p in parts:
        m = re.fullmatch(r"(conv_layers|layers)_(\d+)", p)
        out.append(f"{m[1]}.{m[2]}" if m else p)
    return out


def _leaf_rule(parts: tuple[str, ...], shape: tuple[int, ...]):
    """(hf names to try, to_flax(np) -> np, to_hf(np) -> np) for one per-layer flax leaf path."""
    leaf, parent = parts[-1], parts[-2] if len(parts) > 1 else ""
    base = ".".join(_hf_parts(parts[:-1]))
    pre = base + "." if base else ""
    ident = (lambda a: a.reshape(shape), lambda a: a)
    if parent == "pos_conv_embed":
        if leaf == "weight_g":
            return ([pre + "conv." + n for n in _WN_NAMES[leaf]],
                    lambda a: a.reshape(shape), lambda a: a.reshape(1, 1, -1))
        if leaf == "weight_v":
            return ([pre + "conv." + n for n in _WN_NAMES[leaf]],
                    lambda a: a.transpose(2, 1, 0), lambda a: a.transpose(2, 1, 0))
        return [pre + "conv." + leaf], *ident
    if leaf == "kernel":
        name = [pre + "weight"]
        if parent == "conv":  # feature-encoder Conv1d: torch [out, in, k] <-> flax [k, in, out]
            return name, lambda a: a.transpose(2, 1, 0), lambda a: a.transpose(2, 1, 0)
        n_in = 2 if parent == "out_proj" else 1  # DenseGeneral: torch [out_flat, in_flat] <-> flax [*in, *out]
        in_flat = int(np.prod(shape[:n_in]))
        return name, (lambda a: a.T.reshape(shape)), (lambda a: a.reshape(in_flat, -1).T)
    if leaf == "scale":
        return [pre + "weight"], *ident
    if leaf == "bias":
        return [pre + "bias"], (lambda a: a.reshape(shape)), (lambda a: a.reshape(-1))
    return [pre + leaf], *ident  # masked_spec_embed, codevectors


def _split_scan(parts: tuple[str, ...]):
    """('encoder', 'layers', 'layer', *rest) -> ('encoder',), rest; else None."""
    for i in range(len(parts) - 2):
        if parts[i + 1] == "layers" and parts[i + 2] == "layer":
            return parts[: i + 1], parts[i + 3:]
    return None


def _per_layer_leaves(abstract: Mapping) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], Any]]:
    """(flax leaf path, per-layer path, per-layer shape, layer index or None) for every tensor the model holds."""
    out = []
    for path, leaf in traverse_util.flatten_dict(abstract).items():
        split = _split_scan(path)
        if split is None:
            out.append((path, path, tuple(leaf.shape), None))
        else:
            head, rest = split
            for i in range(leaf.shape[0]):
                out.append((path, head + (f"layers_{i}",) + rest, tuple(leaf.shape[1:]), i))
    return out


def _strip(prefix: str, names: list[str]) -> list[str]:
    return [n[len(prefix):] if prefix and n.startswith(prefix) else n for n in names]


def params_from_hf_state_dict(state_dict: Mapping[str, np.ndarray], config: Wav2Vec2Config, head: str = "ctc",
                              *, ignore_prefixes: tuple[str, ...] = (),
                              init_missing: jax.Array | None = None) -> dict:
    """Map a transformers state dict onto the jasr parameter tree of ``head`` (strict).

    The ``wav2vec2.`` base-model prefix is optional on either side (a bare ``Wav2Vec2Model`` checkpoint loads into
    a head model and vice versa, as in transformers). Tensors whose names start with ``ignore_prefixes`` are
    dropped; when ``init_missing`` (a PRNG key) is given, tensors the checkpoint lacks are freshly initialised
    instead of being an error (e.g. a new ``lm_head`` for fine-tuning a pretrained model).
    """
    abstract = abstract_params(config, head)
    has_prefix = any(k.startswith("wav2vec2.") for k in state_dict)
    model_has_prefix = "wav2vec2" in abstract
    sd = dict(state_dict)
    if model_has_prefix and not has_prefix:
        sd = {("wav2vec2." + k if not k.startswith(tuple(p for ps in _HEAD_PREFIXES.values() for p in ps)) else k): v
              for k, v in sd.items()}
    elif not model_has_prefix and has_prefix:
        sd = {k[len("wav2vec2."):] if k.startswith("wav2vec2.") else k: v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.startswith(tuple(ignore_prefixes))}
    keys = StrictKeys(sd)
    pdt = jnp.dtype(config.param_dtype)
    fresh = None
    leaves: dict[tuple[str, ...], Any] = {}
    stacks: dict[tuple[str, ...], dict[int, np.ndarray]] = {}
    for path, layer_path, shape, idx in _per_layer_leaves(abstract):
        names, to_flax, _ = _leaf_rule(layer_path, shape)
        found = next((n for n in names if n in keys), None)
        if found is None:
            if init_missing is None:
                alt = f" (or {names[1:]})" if len(names) > 1 else ""
                raise CheckpointKeyError(f"checkpoint is missing tensor {names[0]!r}{alt}")
            if fresh is None:
                x = jnp.zeros((1, config.receptive_field), jnp.float32)
                fresh = traverse_util.flatten_dict(
                    nn.unbox(jax.jit(build_model(config, head).init)(init_missing, x))["params"])
            arr = np.asarray(fresh[path] if idx is None else fresh[path][idx], np.float32)
        else:
            raw = keys.take(found)
            try:
                arr = to_flax(np.asarray(raw, np.float32))
            except ValueError:
                arr = None
            if arr is None or arr.shape != shape:
                raise CheckpointKeyError(f"tensor {found!r} has shape {tuple(raw.shape)}, which does not fit the "
                                         f"model's {shape} (config mismatch?)")
        if idx is None:
            leaves[path] = arr
        else:
            stacks.setdefault(path, {})[idx] = arr
    keys.finish()
    for path, per in stacks.items():
        leaves[path] = np.stack([per[i] for i in range(len(per))])
    return traverse_util.unflatten_dict({p: jnp.asarray(a, pdt) for p, a in leaves.items()})


def params_to_hf_state_dict(params: Mapping, config: Wav2Vec2Config) -> dict[str, np.ndarray]:
    """The transformers state dict (float32 numpy, new weight-norm names) of a jasr parameter tree."""
    params = nn.unbox(params)
    if "params" in params and len(params) == 1:
        params = params["params"]
    flat = traverse_util.flatten_dict(params)
    shapes = traverse_util.unflatten_dict({p: jax.ShapeDtypeStruct(np.shape(v), jnp.float32) for p, v in flat.items()})
    out: dict[str, np.ndarray] = {}
    for path, layer_path, shape, idx in _per_layer_leaves(shapes):
        names, _, to_hf = _leaf_rule(layer_path, shape)
        arr = np.asarray(jnp.asarray(flat[path], jnp.float32))
        if idx is not None:
            arr = arr[idx]
        out[names[0]] = np.ascontiguousarray(to_hf(arr))
    return out


def _head_from(cfg_dict: Mapping, state_dict: Mapping) -> str:
    for arch in cfg_dict.get("architectures") or ():
        if arch in _ARCH_TO_HEAD:
            return _ARCH_TO_HEAD[arch]
    if any(k.startswith("lm_head.") for k in state_dict):
        return "ctc"
    if any(k.startswith("quantizer.") for k in state_dict):
        return "pretraining"
    return "base"


def from_pretrained(directory: str, *, head: str | None = None, init_missing: jax.Array | None = None,
                    **config_overrides) -> tuple[nn.Module, dict, Wav2Vec2Config]:
    """Load a transformers Wav2Vec2 directory: returns ``(module, params, config)``; run with
    ``module.apply({'params': params}, input_values, paddings)``.

    ``head``: 'ctc', 'pretraining' or 'base' (default: from ``architectures`` in config.json, else from the
    tensors). Loading a checkpoint into a different head (e.g. a pretraining checkpoint as 'ctc' for fine-tuning)
    drops the other head's tensors and needs ``init_missing=key`` for the new head's. ``config_overrides`` set
    config fields, e.g. ``dtype='bfloat16'``, ``scan_layers=True``, ``remat=True``, ``vocab_size=...``.
    """
    cfg_dict = load_config(directory)
    sd = load_state_dict(directory)
    ckpt_head = _head_from(cfg_dict, sd)
    head = head or ckpt_head
    if head not in HEADS:
        raise ValueError(f"head={head!r}: expected one of {sorted(HEADS)}")
    config = Wav2Vec2Config.from_hf(cfg_dict, **config_overrides)
    ignore = tuple(p for h, ps in _HEAD_PREFIXES.items() if h != head and h == ckpt_head for p in ps)
    params = params_from_hf_state_dict(sd, config, head, ignore_prefixes=ignore, init_missing=init_missing)
    return build_model(config, head), params, config


def save_pretrained(directory: str, params: Mapping, config: Wav2Vec2Config, head: str = "ctc") -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers.<HEADS[head]>.from_pretrained`` loads."""
    if head not in HEADS:
        raise ValueError(f"head={head!r}: expected one of {sorted(HEADS)}")
    hf = config.to_hf()
    hf["architectures"] = [HEADS[head]]
    hf["torch_dtype"] = "float32"
    save_checkpoint(directory, hf, params_to_hf_state_dict(params, config))


# ---------------------------------------------------------------------------------------------------------------------
# native checkpoints (orbax)
# ---------------------------------------------------------------------------------------------------------------------

def save_native(directory: str, params: Mapping, config: Wav2Vec2Config, head: str = "ctc") -> None:
    """The Flax parameter tree with orbax (``directory/params``) and the jasr config (``directory/jasr.json``)."""

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "jasr.json"), "w") as f:
        json.dump({"model": "wav2vec2", "head": head,
                   "config": {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in config.__dict__.items()}}, f, indent=2)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(directory, "params"), nn.unbox(params))


def load_native(directory: str, **config_overrides) -> tuple[nn.Module, dict, Wav2Vec2Config]:
    """Inverse of :func:`save_native`: ``(module, params, config)``; ``dtype``/``remat`` may be overridden
    (not ``param_dtype`` or ``scan_layers``, which fix the stored tree)."""

    directory = os.path.abspath(directory)
    with open(os.path.join(directory, "jasr.json")) as f:
        meta = json.load(f)
    if meta.get("model") != "wav2vec2":
        raise ValueError(f"{directory} holds a {meta.get('model')!r} checkpoint, not wav2vec2")
    config = Wav2Vec2Config(**{**meta["config"], **config_overrides})
    target = abstract_params(config, meta["head"])
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(os.path.join(directory, "params"), target)
    return build_model(config, meta["head"]), params, config
