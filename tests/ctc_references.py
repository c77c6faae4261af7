"""Independent CTC references and shared jitted calls for the CTC tests: torch's ctc_loss in float64, a brute-force
sum over all alignments (numpy float64), finite differences, and jasr.ctc_loss's loss and vector-Jacobian product
(compiled once per static configuration)."""
import functools
import itertools

import jax
import numpy as np
import torch

from jasr.losses import ctc_loss

B, T, K, N = 4, 10, 5, 4   # the hypothesis bucket

# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------


def torch_ctc(logits, frame_lengths, labels, label_lengths, blank_id=0, reduction="none",
              zero_infinity=False, log_probs=False):
    """float64 torch loss (with the given zero_infinity) and the gradient of the summed loss with
    zero_infinity=True (torch's gradient of an infinite loss is NaN; ours is 0)."""
    def run(zero_inf):
        x = torch.tensor(np.asarray(logits, np.float64), requires_grad=True)
        lp = x if log_probs else torch.log_softmax(x, dim=-1)
        loss = torch.nn.functional.ctc_loss(
            lp.transpose(0, 1), torch.tensor(np.asarray(labels), dtype=torch.long),
            torch.tensor(np.asarray(frame_lengths), dtype=torch.long),
            torch.tensor(np.asarray(label_lengths), dtype=torch.long), blank=blank_id,
            reduction=reduction, zero_infinity=zero_inf)
        return x, loss
    _, loss = run(zero_infinity)
    x, safe = run(True)
    safe.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def collapse(path, blank_id):
    out, prev = [], None
    for k in path:
        if k != prev and k != blank_id:
            out.append(k)
        prev = k
    return tuple(out)


@functools.lru_cache(maxsize=None)
def alignment_table(frames, classes, label_seq, blank_id):
    """All K^T paths [P, T] and the mask of those that collapse to label_seq."""
    paths = np.array(list(itertools.product(range(classes), repeat=frames)), np.int64).reshape(-1, frames)
    mask = np.array([collapse(p, blank_id) == label_seq for p in paths], bool)
    return paths, mask


def brute_force_nll(logits, label_seq, blank_id=0, log_probs=False):
    """-log sum over alignments of prod p(path_t | t) for one sequence [T, K] (float64)."""
    logits = np.asarray(logits, np.float64)
    frames, classes = logits.shape
    lp = logits if log_probs else logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    paths, mask = alignment_table(frames, classes, tuple(label_seq), blank_id)
    if not mask.any():
        return np.inf
    scores = lp[np.arange(frames)[None, :], paths[mask]].sum(axis=1)
    return -np.logaddexp.reduce(scores)


def finite_difference_grad(fn, x, eps=1e-6):
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (fn(up) - fn(down)) / (2 * eps)
    return grad


def paddings_from_lengths(lengths, size):
    return (np.arange(size)[None, :] >= np.asarray(lengths)[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Shared jitted functions (compiled once per static configuration)
# ----------------------------------------------------------------------------------------------


def loss_and_grad(logits, logit_paddings, labels, label_paddings, blank_id=0, method="log",
                  log_probs=False, zero_infinity=False, cotangent=None):
    """Per-sequence loss [B] and the gradient of sum(cotangent * loss) (default: 1 for every row)."""
    if cotangent is None:
        cotangent = np.ones(np.shape(labels)[:1], np.float32)
    return _loss_and_vjp(logits, logit_paddings, labels, label_paddings, cotangent, blank_id=blank_id,
                         method=method, log_probs=log_probs, zero_infinity=zero_infinity)


@functools.partial(jax.jit, static_argnames=("blank_id", "method", "log_probs", "zero_infinity"))
def _loss_and_vjp(logits, logit_paddings, labels, label_paddings, cotangent, blank_id=0, method="log",
                  log_probs=False, zero_infinity=False):
    def fn(x):
        return ctc_loss(x, logit_paddings, labels, label_paddings, blank_id, method=method,
                        log_probs=log_probs, zero_infinity=zero_infinity)
    loss, vjp = jax.vjp(fn, logits)
    return loss, vjp(cotangent)[0]
