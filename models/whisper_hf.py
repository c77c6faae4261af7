"""Whisper checkpoints: transformers directories in and out, native (orbax) checkpoints of the Flax params tree.

- :func:`from_pretrained` reads a transformers directory (``config.json`` + ``model.safetensors``, a sharded
  safetensors set, or ``pytorch_model.bin`` when torch is installed) and maps every tensor onto the Flax tree; a
  tensor the model needs but the checkpoint lacks, or one the model does not use, is a
  :class:`models.hf_io.CheckpointKeyError` naming it. ``proj_out.weight`` (the tied output projection) is accepted
  only when it equals ``model.decoder.embed_tokens.weight``.
- :func:`save_pretrained` writes a directory that ``transformers.WhisperForConditionalGeneration.from_pretrained``
  loads (and :func:`from_pretrained` reads back).
- :func:`save_native` / :func:`load_native` store the config and the params tree with orbax.
- :func:`hf_to_params` / :func:`params_to_hf` are the pure mappings between ``{torch name: array}`` and the tree.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from models.hf_io import CheckpointKeyError, StrictKeys, load_config, load_state_dict, save_checkpoint
from models.whisper import WhisperConfig, WhisperModel

Params = Any


def _param_template(config: WhisperConfig) -> dict:
    """Shapes of the unscanned params tree (no computation)."""
    model = WhisperModel(config)
    feats = jax.ShapeDtypeStruct((1, config.num_mel_bins, config.num_frames), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), feats, ids))["params"]
    return nn.unbox(shapes)


def _flatten(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, Mapping):
            yield from _flatten(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def _set(tree: dict, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _hf_name(path) -> str:
    """Flax path (unscanned layout) -> transformers tensor name."""
    parts = []
    for p in path:
        if p.startswith("layers_"):
            parts += ["layers", p[len("layers_"):]]
        elif p == "kernel":
            parts.append("weight")
        elif p == "scale":
            parts.append("weight")
        else:
            parts.append(p)
    name = "model." + ".".join(parts)
    if path[-1] == "embed_positions" or path[-1] == "embed_tokens":
        name += ".weight"
    return name


def _to_flax(path, w: np.ndarray, shape) -> np.ndarray:
    """One torch tensor -> the Flax leaf at ``path`` with ``shape``."""
    leaf, parent = path[-1], (path[-2] if len(path) > 1 else "")
    if leaf == "kernel":
        if parent in ("conv1", "conv2"):
            out = w.transpose(2, 1, 0)                                   # [out, in, k] -> [k, in, out]
        elif parent in ("q_proj", "k_proj", "v_proj"):
            out = w.T.reshape(shape)                                     # [H*Dh, D] -> [D, H, Dh]
        elif parent == "out_proj":
            out = w.T.reshape(shape)                                     # [D, H*Dh] -> [H, Dh, D]
        else:
            out = w.T                                                    # Linear [out, in] -> [in, out]
    elif leaf == "bias" and parent in ("q_proj", "v_proj"):
        out = w.reshape(shape)
    else:
        out = w
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"tensor {_hf_name(path)!r} has shape {w.shape}, which does not fit the config "
                         f"(expected {tuple(shape)} after conversion, got {out.shape})")
    return out


def _to_torch(path, a: np.ndarray) -> np.ndarray:
    leaf, parent = path[-1], (path[-2] if len(path) > 1 else "")
    if leaf == "kernel":
        if parent in ("conv1", "conv2"):
            return a.transpose(2, 1, 0)
        if parent in ("q_proj", "k_proj", "v_proj"):
            return a.reshape(a.shape[0], -1).T
        if parent == "out_proj":
            return a.reshape(-1, a.shape[-1]).T
        return a.T
    if leaf == "bias" and parent in ("q_proj", "v_proj"):
        return a.reshape(-1)
    return a


def stack_layers(params: Params) -> Params:
    """Unscanned tree (``layers_0..``) -> scanned tree (one ``layers`` entry, stacked on axis 0)."""
    out = {}
    for part, sub in params.items():
        sub = dict(sub)
        names = sorted((k for k in sub if k.startswith("layers_")), key=lambda k: int(k[len("layers_"):]))
        if names:
            layers = [sub.pop(k) for k in names]
            sub["layers"] = jax.tree_util.tree_map(lambda *a: np.stack([np.asarray(x) for x in a]), *layers)
        out[part] = sub
    return out


def unstack_layers(params: Params) -> Params:
    """Scanned tree -> unscanned tree (inverse of :func:`stack_layers`)."""
    out = {}
    for part, sub in params.items():
        sub = dict(sub)
        if "layers" in sub:
            stacked = sub.pop("layers")
            n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
            for i in range(n):
                sub[f"layers_{i}"] = jax.tree_util.tree_map(lambda a: np.asarray(a)[i], stacked)
        out[part] = sub
    return out


def hf_to_params(state_dict: Mapping[str, np.ndarray], config: WhisperConfig, *, scan_layers: bool = False,
                 param_dtype=jnp.float32) -> Params:
    """``{transformers name: array}`` -> Flax params (plain arrays). Strict: missing/unexpected tensors raise."""
    keys = StrictKeys(state_dict)
    params: dict = {}
    for path, shp in _flatten(_param_template(config)):
        w = np.asarray(keys.take(_hf_name(path)), dtype=np.float32)
        _set(params, path, _to_flax(path, w, shp.shape))
    if "proj_out.weight" in keys:
        tied = keys.take("proj_out.weight")
        if not np.array_equal(np.asarray(tied, np.float32), params["decoder"]["embed_tokens"]):
            raise CheckpointKeyError("proj_out.weight differs from model.decoder.embed_tokens.weight: untied output "
                                     "embeddings are not supported by jasr's Whisper")
    keys.finish()
    if scan_layers:
        params = stack_layers(params)
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, param_dtype), params)


def params_to_hf(params: Params) -> dict[str, np.ndarray]:
    """Flax params (scanned or not, boxed or not) -> ``{transformers name: float32 array}``."""
    params = unstack_layers(nn.unbox(params))
    return {_hf_name(path): np.ascontiguousarray(_to_torch(path, np.asarray(a, np.float32)))
            for path, a in _flatten(params)}


def from_pretrained(directory: str, *, dtype=jnp.float32, param_dtype=jnp.float32, scan_layers: bool = False,
                    remat: bool = False) -> tuple[WhisperModel, Params]:
    """Load a transformers Whisper directory -> ``(model, params)`` (params: plain arrays in ``param_dtype``).

    The generation settings (``generation_config.json``) are read by
    :meth:`models.whisper_generate.GenerationSettings.from_pretrained`.
    """
    config = WhisperConfig.from_hf_dict(load_config(directory))
    params = hf_to_params(load_state_dict(directory), config, scan_layers=scan_layers, param_dtype=param_dtype)
    model = WhisperModel(config, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, remat=remat)
    return model, params


def save_pretrained(directory: str, config: WhisperConfig, params: Params,
                    generation_config: Optional[Mapping[str, Any]] = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (+ ``generation_config.json`` when given): a directory that
    transformers' ``WhisperForConditionalGeneration.from_pretrained`` loads."""
    save_checkpoint(directory, config.to_hf_dict(), params_to_hf(params))
    if generation_config is not None:
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump(dict(generation_config), f, indent=2, sort_keys=True)


def save_native(directory: str, config: WhisperConfig, params: Params) -> None:
    """Native checkpoint: ``config.json`` plus the params tree saved by orbax under ``params/``."""

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(directory, "params"), nn.unbox(params), force=True)
    ckptr.wait_until_finished()


def load_native(directory: str, *, dtype=jnp.float32, param_dtype=None, scan_layers: Optional[bool] = None,
                remat: bool = False) -> tuple[WhisperModel, Params]:
    """Restore :func:`save_native` output -> ``(model, params)``. ``scan_layers=None`` keeps the saved layout;
    ``True``/``False`` converts it."""

    directory = os.path.abspath(directory)
    config = WhisperConfig.from_hf_dict(load_config(directory))
    params = ocp.StandardCheckpointer().restore(os.path.join(directory, "params"))
    saved_scan = "layers" in params["encoder"]
    if scan_layers is not None and scan_layers != saved_scan:
        params = stack_layers(params) if scan_layers else unstack_layers(params)
    scan = saved_scan if scan_layers is None else scan_layers
    if param_dtype is not None:
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, param_dtype), params)
    pd = param_dtype or jax.tree_util.tree_leaves(params)[0].dtype
    params = jax.tree_util.tree_map(jnp.asarray, params)
    return WhisperModel(config, dtype=dtype, param_dtype=pd, scan_layers=scan, remat=remat), params


def param_logical_axes(model: WhisperModel) -> Params:
    """The logical axis names of every parameter (a tree of ``PartitionSpec``) for sharding rules."""
    c = model.config
    feats = jax.ShapeDtypeStruct((1, c.num_mel_bins, c.num_frames), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), feats, ids))["params"]
    return nn.get_partition_spec(boxed)
