"""An independent float64 NumPy reference of a top-k MoE layer, written as loops."""

import math

import numpy as np


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def act(name, x):
    if name == "relu":
        return np.maximum(x, 0)
    if name in ("gelu", "gated-gelu"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise ValueError(name)


def expert_ffn(x, weights, e, activation):
    if activation.startswith("gated-"):
        h = act(activation, x @ weights["wi_0"][e]) * (x @ weights["wi_1"][e])
    else:
        h = act(activation, x @ weights["wi"][e])
    return h @ weights["wo"][e]


def reference_moe(
    x, mask, weights, k, capacity, activation="relu", normalize=False, group_size=None
):
    """Returns (y, kept_count_per_expert_per_group, aux, z) in float64.

    Tokens are served choice-major (all first choices, then all second
    choices), in sequence order, per group. `group_size`: None (each
    sequence), "batch" (all tokens, position-major) or a token count. `aux`
    is the mean over the groups with real tokens; both losses are 0 without any.
    `capacity`: slots per expert per group, or a function of the group's
    number of real tokens giving them.
    """
    x = np.asarray(x, np.float64)
    batch, length, d = x.shape
    if group_size is None:
        groups, gmask = x, mask.astype(np.float64)
    elif group_size == "batch":  # one group, position-major
        groups = x.transpose(1, 0, 2).reshape(1, -1, d)
        gmask = mask.T.reshape(1, -1).astype(np.float64)
    else:
        groups = x.reshape(-1, group_size, d)
        gmask = mask.reshape(-1, group_size).astype(np.float64)
    kernel = np.asarray(weights["router"], np.float64)
    num_experts = kernel.shape[1]
    y = np.zeros_like(groups)
    counts = np.zeros((groups.shape[0], num_experts), int)
    aux_terms, z_terms = [], []
    for g in range(groups.shape[0]):
        logits = groups[g] @ kernel
        probs = softmax(logits)
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        real = gmask[g] > 0
        limit = capacity(int(real.sum())) if callable(capacity) else capacity
        for choice in range(k):
            for s in range(groups.shape[1]):
                if not real[s]:
                    continue
                e = order[s, choice]
                if counts[g, e] >= limit:
                    continue
                counts[g, e] += 1
                w = probs[s, e]
                if normalize:
                    w = w / probs[s, order[s]].sum()
                y[g, s] += w * expert_ffn(groups[g, s], weights, e, activation)
        n = real.sum()
        if n:  # groups without real tokens are left out of the mean
            frac = np.bincount(order[real, 0], minlength=num_experts) / n
            aux_terms.append(num_experts * np.sum(frac * probs[real].mean(0)))
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        z_terms.append(lse[real] ** 2)
    z_terms = np.concatenate(z_terms) if z_terms else np.zeros(0)
    z = z_terms.mean() if z_terms.size else 0.0
    aux = np.mean(aux_terms) if aux_terms else 0.0
    if group_size == "batch":
        y = y.reshape(length, batch, d).transpose(1, 0, 2)
    return y.reshape(batch, length, d), counts, float(aux), float(z)
