"""FSDD with speaker-level spectral equalisation (per-speaker mean normalisation done on the waveform).

    python bench/fsdd_speaker_eq.py [--out .cache/fsdd_speaker_eq]
    python train.py --config configs/fsdd.py --workdir RUN \\
        --config.data.train_manifest=.cache/fsdd_speaker_eq/manifest.jsonl \\
        --config.data.normalize=none

Each speaker's recordings are filtered (jasr.cmvn.equalize_spectrum) so that the speaker's long-term log spectrum,
estimated from all of that speaker's recordings without their transcripts, becomes the mean long-term spectrum of
the training speakers (those not in configs/fsdd.py's data.speakers_dev). The held-out speaker is equalised with
its own recordings only, as Kaldi's per-speaker CMVN normalises a test speaker with its own unlabelled features;
its spectrum never enters the target. Writes float WAVs and a manifest with the same fields under --out.
"""
import argparse
import json
import os
import sys

import numpy as np
import soundfile as sf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jasr.cmvn import equalize_spectrum, long_term_log_spectrum  # noqa: E402
from jasr.config import load_config_file  # noqa: E402


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "fsdd.py"))
    p.add_argument("--out", default=os.path.join(ROOT, ".cache", "fsdd_speaker_eq"))
    a = p.parse_args(argv)
    cfg = load_config_file(a.config)
    src = os.path.join(ROOT, cfg.data.train_manifest)
    base = os.path.dirname(src)
    with open(src) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    audio = {r["id"]: sf.read(os.path.join(base, r["audio"]), dtype="float64")[0] for r in recs}
    rate = cfg.data.sample_rate
    speakers = sorted({r["speaker"] for r in recs})
    ltas = {s: long_term_log_spectrum([audio[r["id"]] for r in recs if r["speaker"] == s], rate) for s in speakers}
    train_spk = [s for s in speakers if s not in tuple(cfg.data.speakers_dev)]
    target = np.mean([ltas[s] for s in train_spk], axis=0)
    os.makedirs(os.path.join(a.out, "recordings"), exist_ok=True)
    with open(os.path.join(a.out, "manifest.jsonl"), "w") as f:
        for r in recs:
            y = equalize_spectrum(audio[r["id"]], ltas[r["speaker"]], target)
            rel = os.path.join("recordings", os.path.basename(r["audio"]))
            sf.write(os.path.join(a.out, rel), y, rate, subtype="FLOAT")
            f.write(json.dumps({**r, "audio": rel}) + "\n")
    for s in speakers:
        d = ltas[s] - target
        print(f"{s}: long-term log spectrum minus target, per 500 Hz: "
              f"{' '.join(f'{v:+.1f}' for v in d[::len(d) // 8])}{' (target)' if s in train_spk else ''}")
    print(f"written {len(recs)} recordings and {os.path.join(a.out, 'manifest.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
