"""Word and character error rates (jiwer), with counts so that corpus-level rates can be accumulated."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jiwer


@dataclasses.dataclass
class ErrorCounts:
    """Edit-distance counts; ``rate`` = (S + D + I) / N over the reference tokens."""
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_tokens: int = 0

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        return self.errors / max(self.ref_tokens, 1)

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        return ErrorCounts(self.substitutions + other.substitutions, self.deletions + other.deletions,
                           self.insertions + other.insertions, self.ref_tokens + other.ref_tokens)


def _check(refs: Sequence[str], hyps: Sequence[str]):
    if len(refs) != len(hyps):
        raise ValueError(f"error rate: {len(refs)} references but {len(hyps)} hypotheses")
    for i, r in enumerate(refs):
        if not r.strip():
            raise ValueError(f"error rate: reference {i} is empty (an empty transcript cannot be scored)")


def _counts(out, n_ref: int) -> ErrorCounts:
    return ErrorCounts(out.substitutions, out.deletions, out.insertions, n_ref)


def word_errors(refs: Sequence[str], hyps: Sequence[str]) -> ErrorCounts:
    _check(refs, hyps)
    if not refs:
        return ErrorCounts()
    total = ErrorCounts()
    # jiwer rejects an empty hypothesis string inside a batch on some versions: score those as deletions.
    pairs = [(r, h) for r, h in zip(refs, hyps) if h.strip()]
    for r, h in zip(refs, hyps):
        if not h.strip():
            total = total + ErrorCounts(0, len(r.split()), 0, len(r.split()))
    if pairs:
        out = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
        total = total + _counts(out, sum(len(r.split()) for r, _ in pairs))
    return total


def char_errors(refs: Sequence[str], hyps: Sequence[str]) -> ErrorCounts:
    _check(refs, hyps)
    if not refs:
        return ErrorCounts()
    total = ErrorCounts()
    pairs = [(" ".join(r.split()), " ".join(h.split())) for r, h in zip(refs, hyps)]
    for r, h in pairs:
        if not h:
            total = total + ErrorCounts(0, len(r), 0, len(r))
    pairs = [(r, h) for r, h in pairs if h]
    if pairs:
        out = jiwer.process_characters([r for r, _ in pairs], [h for _, h in pairs])
        total = total + _counts(out, sum(len(r) for r, _ in pairs))
    return total


def wer(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus word error rate: total word edits / total reference words."""
    return word_errors(refs, hyps).rate


def cer(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus character error rate (spaces count as characters, runs of whitespace collapse to one)."""
    return char_errors(refs, hyps).rate
