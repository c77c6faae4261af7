"""Writes bench/data/fsdd_ctc_logprobs.npz: the CTC log-probabilities of a trained run on its dev split, the
"trained network" input distribution of bench/ctc.py.

    python bench/data/make_ctc_logprobs.py [--workdir runs/fsdd] [--checkpoint best] [--max-bytes 1800000]

The run is configs/fsdd.py's Conformer-CTC (character tokenizer: blank + 16 characters) trained on three FSDD
speakers; its dev split is the held-out speaker. Every dev utterance is run through the model once (the run's
evaluation loader, bucketed batches); the npz holds, per utterance in loader order, its valid frames' log-probs
(float16, concatenated: logprobs [sum T_i, K]), frame_lengths [U], its label ids (labels [sum N_i]) and
label_lengths [U], plus blank_id, vocab_size, the run's name and checkpoint step. Utterances are kept in order
until the file would pass --max-bytes (float16 and the npz's zip compression keep the whole dev split of FSDD
under 1 MB). A fresh clone has no runs/: the committed npz is the input; rerun this script after training.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jasr.run_data import make_eval_loader, split_utterances  # noqa: E402
from jasr.steps import AUDIO_KEYS  # noqa: E402
from jasr.training import load_run  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdd_ctc_logprobs.npz")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "fsdd"))
    p.add_argument("--checkpoint", default="best")
    p.add_argument("--split", default="dev")
    p.add_argument("--max-bytes", type=int, default=1_800_000)
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    run = load_run(args.workdir, checkpoint=args.checkpoint, root=ROOT)
    task, tok = run.task, run.tokenizer
    utts = [u for u in split_utterances(run.config, args.split, ROOT) if u.text]
    loader = make_eval_loader(run.config, utts, tok, edges=run.bucket_edges, task=task)
    fn = jax.jit(lambda state, batch: task.ctc_log_probs(state.params, state.model_state, batch))
    texts = {u.id: u.text for u in utts}
    rows, labels = [], []
    for batch in loader:
        audio = {k: batch[k] for k in AUDIO_KEYS if k in batch}
        lp, pads = (np.asarray(a) for a in fn(run.state, audio))
        for r, uid in enumerate(str(x) for x in batch["ids"]):
            errors = batch.get("errors")
            if not uid or (errors is not None and errors[r]):
                continue
            n = int(np.sum(pads[r] < 0.5))
            rows.append(lp[r, :n].astype(np.float16))
            labels.append(np.asarray(tok.encode(texts[uid]), np.int16))
    keep = len(rows)
    while keep and sum(r.nbytes for r in rows[:keep]) > args.max_bytes:
        keep -= 1
    np.savez_compressed(
        args.out, logprobs=np.concatenate(rows[:keep]), frame_lengths=np.array([len(r) for r in rows[:keep]]),
        labels=np.concatenate(labels[:keep]), label_lengths=np.array([len(x) for x in labels[:keep]]),
        blank_id=task.blank_id, vocab_size=rows[0].shape[1], source=f"{os.path.basename(args.workdir)} step {run.step}")
    print(f"wrote {args.out}: {keep} of {len(rows)} {args.split} utterances, "
          f"{sum(len(r) for r in rows[:keep])} frames, K = {rows[0].shape[1]}, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
