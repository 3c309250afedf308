"""A float64 NumPy DeepSeek-V3 router and loss-free bias updates, written token by token.

Shared by the TensorFlow tests and the JAX checks of group-limited selection
and bias balancing (`test_deepseek_routing.py`, `deepseek_jax_checks.py`).
"""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, "float64")))


def select(scores, bias, k, n_group, topk_group):
    """Expert indices [N, k] of scores [N, E] (+ bias), group-limited, token by token."""
    scores = np.asarray(scores, "float64").reshape(-1, scores.shape[-1])
    num_experts = scores.shape[-1]
    per_group = num_experts // n_group
    chosen = []
    for token in scores + bias:
        groups = token.reshape(n_group, per_group)
        group_score = [sum(sorted(g)[-2:]) for g in groups]
        kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        eligible = [e for e in range(num_experts) if e // per_group in kept]
        chosen.append(sorted(eligible, key=lambda e: -token[e])[:k])
    return np.array(chosen)


def bias_sequence(x, kernel, k, n_group, topk_group, rate, steps, bias=None):
    """The bias after each of `steps` training steps on tokens `x` [..., d] with a fixed kernel."""
    num_experts = kernel.shape[-1]
    bias = np.zeros(num_experts) if bias is None else np.asarray(bias, "float64")
    scores = sigmoid(np.asarray(x, "float64").reshape(-1, x.shape[-1]) @ kernel)
    history, counts_seen = [], []
    for _ in range(steps):
        chosen = select(scores, bias, k, n_group, topk_group)
        counts = np.bincount(chosen.ravel(), minlength=num_experts).astype("float64")
        bias = bias + rate * np.sign(counts.mean() - counts)
        history.append(bias.copy())
        counts_seen.append(counts)
    return history, counts_seen
