"""Router auxiliary losses, as pure functions of router outputs.

Both losses are computed in float32 and average only over real (unpadded)
tokens, so padding never pulls the router in any direction.
"""

from keras import ops


def _masked_token_mean(values, token_mask):
    """Mean of `values` [G, S, ...] over the tokens where `token_mask` [G, S] is 1."""
    token_mask = ops.cast(token_mask, "float32")
    while len(token_mask.shape) < len(values.shape):
        token_mask = ops.expand_dims(token_mask, -1)
    total = ops.sum(values * token_mask, axis=(0, 1))
    count = ops.maximum(ops.sum(token_mask, axis=(0, 1)), 1.0)
    return total / count


def load_balancing_loss(router_probs, top1_expert_index, token_mask):
    """Switch Transformer load-balancing loss (Fedus et al., eq. 4).

    `E * sum_e f_e * P_e`, where `f_e` is the fraction of real tokens whose
    first choice is expert `e` and `P_e` the mean router probability for `e`.
    It is computed per group and averaged over the groups that hold real
    tokens, as in GShard (0 when none does: an empty or all-padding batch).
    Its minimum, 1.0, is reached by a perfectly uniform router.

    Args:
        router_probs: float [G, S, E] softmax outputs of the router.
        top1_expert_index: int [G, S] the first-choice expert of each token
            (before any capacity mask).
        token_mask: [G, S] 1 for real tokens, 0 for padding.

    Returns:
        A float32 scalar.

    Example:
    >>> import numpy as np
    >>> probs = np.full((1, 4, 2), 0.5, "float32")
    >>> float(load_balancing_loss(probs, np.array([[0, 1, 0, 1]]), np.ones((1, 4))))
    1.0
    """
    router_probs = ops.cast(router_probs, "float32")
    num_experts = router_probs.shape[-1]
    mask = ops.cast(token_mask, "float32")[..., None]
    tokens = ops.sum(mask, axis=1)  # [G, 1]
    count = ops.maximum(tokens, 1.0)
    assigned = ops.one_hot(top1_expert_index, num_experts, dtype="float32") * mask
    fraction_routed = ops.sum(assigned, axis=1) / count  # [G, E]
    mean_prob = ops.sum(router_probs * mask, axis=1) / count  # [G, E]
    per_group = num_experts * ops.sum(fraction_routed * mean_prob, axis=-1)  # 0 if no tokens
    num_groups = ops.sum(ops.cast(tokens > 0, "float32"))
    return ops.sum(per_group) / ops.maximum(num_groups, 1.0)


def router_z_loss(router_logits, token_mask):
    """ST-MoE router z-loss: mean over real tokens of `logsumexp(logits)**2`.

    Args:
        router_logits: float [G, S, E] pre-softmax router outputs.
        token_mask: [G, S] 1 for real tokens, 0 for padding.

    Returns:
        A float32 scalar.

    Example:
    >>> import numpy as np
    >>> logits = np.zeros((1, 1, 4), "float32")  # logsumexp = log(4)
    >>> round(float(router_z_loss(logits, np.ones((1, 1)))), 4)
    1.9218
    """
    router_logits = ops.cast(router_logits, "float32")
    log_z = ops.logsumexp(router_logits, axis=-1)
    return _masked_token_mean(ops.square(log_z), token_mask)
