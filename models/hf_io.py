"""Reading and writing Hugging Face checkpoint directories without torch at run time.

A directory holds ``config.json`` and the weights as ``model.safetensors`` (or a sharded set with
``model.safetensors.index.json``); ``pytorch_model.bin`` is read only when torch happens to be installed.
Model modules map these flat ``{name: array}`` dicts onto Flax parameter trees with :class:`StrictKeys`,
which fails loudly on a missing or an unexpected tensor.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file


class CheckpointKeyError(KeyError):
    """A checkpoint lacks a tensor the model needs, or holds one the model does not use."""


def load_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory!r} is not a Hugging Face checkpoint: no config.json")
    with open(path) as f:
        return json.load(f)


def load_state_dict(directory: str) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint directory as float32/int numpy arrays, keyed by their PyTorch names."""
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(single):
        return dict(load_file(single))
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        out: dict[str, np.ndarray] = {}
        for shard in shards:
            out.update(load_file(os.path.join(directory, shard)))
        return out
    binary = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(binary):
        try:
            import torch  # optional: only to read legacy pickled checkpoints
        except ImportError as e:
            raise ImportError(f"{binary} is a PyTorch pickle; install torch to read it, or convert it to "
                              "model.safetensors") from e
        sd = torch.load(binary, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}
    raise FileNotFoundError(f"{directory!r} has no model.safetensors, model.safetensors.index.json or "
                            "pytorch_model.bin")


def save_checkpoint(directory: str, config: Mapping[str, Any], state_dict: Mapping[str, np.ndarray]) -> None:
    """Write ``config.json`` and ``model.safetensors`` so that transformers' ``from_pretrained`` loads them."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(config), f, indent=2, sort_keys=True)
    tensors = {k: np.ascontiguousarray(np.asarray(v)) for k, v in state_dict.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


class StrictKeys:
    """Hands out checkpoint tensors by name and remembers which were taken.

    >>> keys = StrictKeys(state_dict, ignore=("num_batches_tracked",))
    >>> w = keys.take("encoder.conv1.weight")          # CheckpointKeyError names a missing tensor
    >>> keys.finish()                                  # CheckpointKeyError names every unused tensor
    """

    def __init__(self, state_dict: Mapping[str, np.ndarray], ignore: tuple[str, ...] = ()):
        self._sd = dict(state_dict)
        self._taken: set[str] = set()
        self._ignore = ignore

    def __contains__(self, name: str) -> bool:
        return name in self._sd

    def take(self, name: str) -> np.ndarray:
        if name not in self._sd:
            raise CheckpointKeyError(f"checkpoint is missing tensor {name!r}")
        self._taken.add(name)
        return np.asarray(self._sd[name])

    def finish(self) -> None:
        unused = sorted(k for k in self._sd if k not in self._taken and not any(s in k for s in self._ignore))
        if unused:
            raise CheckpointKeyError(f"checkpoint has {len(unused)} unexpected tensor(s): {unused[:20]}")
