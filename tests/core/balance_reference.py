"""float64 NumPy references of the balance losses (shared by the TensorFlow and JAX checks)."""

import numpy as np


def routing64(x, kernel, k):
    """float64 softmax probabilities [B, L, E] and the top-K choice counts [B, L, E]."""
    logits = np.asarray(x, "float64") @ np.asarray(kernel, "float64")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1)[..., :k]
    counts = np.zeros_like(probs)
    np.put_along_axis(counts, top, 1.0, axis=-1)
    return probs, counts


def loss64(probs, counts, mask):
    """E * sum(f * P) over the real tokens given, f from the share of choices."""
    mask = mask.astype("float64")[..., None]
    choices = (counts * mask).reshape(-1, probs.shape[-1]).sum(0)
    f = probs.shape[-1] * choices / choices.sum()
    p = (probs * mask).reshape(-1, probs.shape[-1]).sum(0) / mask.sum()
    return float(np.sum(f * p))
