"""FSDD: how much of each word's energy lies above 2 kHz at its start and at its end, per speaker and word.

    python bench/fsdd_word_endings.py [--words EIGHT SIX TWO] [--split-hz 2000]

Why: the held-out speaker's errors (EIGHT read as SIX, bench/results/fsdd_decoding.md) point at how he ends a
word. For every utterance: a power spectrogram (32 ms Hann windows, 10 ms hop), its active frames (power within
20 dB of the utterance's loudest frame), and the share of the power above --split-hz in the first four and in the
last four active frames. Printed: the mean share per speaker and word (%), and the mean active duration.
"""
import argparse
import collections
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jasr.audio import load_audio  # noqa: E402
from jasr.manifests import read_manifest  # noqa: E402

MANIFEST = os.path.join(ROOT, "..", "shared", "data", "fsdd", "manifest.jsonl")


def high_band_shares(audio: np.ndarray, sample_rate: int, split_hz: float, edge: int = 4):
    """(share at the start, share at the end, active seconds) of one utterance: [n] float audio."""
    win, hop = int(0.032 * sample_rate), int(0.010 * sample_rate)
    if audio.shape[0] < win:
        audio = np.pad(audio, (0, win - audio.shape[0]))
    frames = np.lib.stride_tricks.sliding_window_view(audio, win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2                                   # [F, win // 2 + 1]
    total = power.sum(1)
    active = np.flatnonzero(total >= total.max() * 10 ** (-20 / 10))
    first, last = active[0], active[-1]
    high = power[:, np.fft.rfftfreq(win, 1 / sample_rate) >= split_hz].sum(1) / np.maximum(total, 1e-20)
    return (float(high[first:first + edge].mean()), float(high[max(first, last - edge + 1):last + 1].mean()),
            (last - first + 1) * hop / sample_rate)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", default=MANIFEST)
    p.add_argument("--words", nargs="*", default=None, help="words to show (default: all)")
    p.add_argument("--split-hz", type=float, default=2000.0)
    a = p.parse_args(argv)
    shares = collections.defaultdict(list)
    for u in read_manifest(a.manifest):
        if a.words and u.text not in a.words:
            continue
        if u.sample_rate is None:
            raise SystemExit(f"{a.manifest}: utterance {u.id} has no sample_rate")
        audio = load_audio(u.audio_path, sample_rate=None, expected_duration=u.duration).astype(np.float64)
        shares[(u.text, u.speaker)].append(high_band_shares(audio, u.sample_rate, a.split_hz))
    print(f"| word | speaker | utterances | power above {a.split_hz:.0f} Hz, first 4 frames (%) | "
          f"last 4 frames (%) | active s |")
    print("|---|---|---:|---:|---:|---:|")
    for (word, speaker), v in sorted(shares.items()):
        m = np.mean(v, axis=0)
        print(f"| {word} | {speaker} | {len(v)} | {100 * m[0]:.0f} | {100 * m[1]:.0f} | {m[2]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
