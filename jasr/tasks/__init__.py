"""Model families: each has one module here, with a :class:`~jasr.tasks.base.Task` subclass that says everything
the training loop and decode.py need to know about it, and one line in :data:`FAMILIES`.

Adding a family: write ``jasr/tasks/NAME.py`` with a Task subclass (``name``, ``loss_types``,
``model_config_class``, ``build``, ``init``, ``loss``, ``greedy_decode``; override ``check_config``,
``subsampling``, ``feature_config``, ``label_fn`` or ``load_pretrained`` where the defaults do not fit; a CTC head
answers ``has_ctc_head`` / ``ctc_log_probs`` (lexicon, LM and graph decoding), an attention decoder ``beam_decode`` /
``sequence_log_probs`` (beam search, n-best rescoring)), then add its line below. ``model.name`` in a run config
picks the family.
"""
from __future__ import annotations

from jasr.errors import ConfigError
from jasr.tasks.base import Frontend, Task, model_fields
from jasr.tasks.conformer import ConformerAEDTask, ConformerCTCTask
from jasr.tasks.wav2vec2 import Wav2Vec2CTCTask, Wav2Vec2PretrainTask
from jasr.tasks.whisper import WhisperTask

FAMILIES: dict[str, type[Task]] = {cls.name: cls for cls in (
    ConformerCTCTask,
    ConformerAEDTask,
    Wav2Vec2CTCTask,
    Wav2Vec2PretrainTask,
    WhisperTask,
)}


def family(name: str) -> type[Task]:
    """The Task class registered for config ``model.name``."""
    if name not in FAMILIES:
        raise ConfigError(f"config 'model.name' must be one of {tuple(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def build_task(cfg, vocab_size: int, fc, *, tokenizer=None, hf_dir: str | None = None) -> Task:
    """The task of a run config (see :meth:`Task.build`)."""
    return family(cfg.model.name).build(cfg, vocab_size, fc, tokenizer=tokenizer, hf_dir=hf_dir)


__all__ = ["FAMILIES", "Frontend", "Task", "build_task", "family", "model_fields"]
