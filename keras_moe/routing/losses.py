"""Router auxiliary losses, as pure functions of router outputs.

The losses are computed in float32 and average only over real (unpadded)
tokens, so padding never pulls the router in any direction.

Three load-balancing losses, all `E * sum_e f_e * P_e` with minimum 1.0 at a
uniform router, differ in the tokens `f` and `P` are taken over
(`keras_moe.arguments.BALANCE_LOSSES`):
- "group" (Switch, GShard): per routing group, `f` from the first choice;
- "sequence" (DeepSeek-V2/V3's sequence-wise loss): per sequence, `f` from
  all K choices;
- "global" (Qwen's global-batch balancing, arXiv 2501.11873): `f` from all K
  choices of the global batch (counts summed over the replicas), `P` from
  the local tokens, so the loss averaged over replicas is the loss of the
  whole batch.
"""

from __future__ import annotations

from keras import ops

from keras_moe.parallel.replica_context import replica_context
from keras_moe.tensor_types import Tensor


def _masked_token_mean(values, token_mask):
    """Mean of `values` [G, S, ...] over the tokens where `token_mask` [G, S] is 1."""
    token_mask = ops.cast(token_mask, "float32")
    while len(token_mask.shape) < len(values.shape):
        token_mask = ops.expand_dims(token_mask, -1)
    total = ops.sum(values * token_mask, axis=(0, 1))
    count = ops.maximum(ops.sum(token_mask, axis=(0, 1)), 1.0)
    return total / count


def load_balancing_loss(
    router_probs: Tensor, top1_expert_index: Tensor, token_mask: Tensor
) -> Tensor:
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


def router_z_loss(router_logits: Tensor, token_mask: Tensor) -> Tensor:
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


def choice_counts(expert_index: Tensor, selected: Tensor, num_experts: int) -> Tensor:
    """Float32 [..., E]: how many of each token's choices selected each expert.

    Args:
        expert_index: int [..., K].
        selected: float [..., K], 1 where the choice counts (before capacity).
        num_experts: E.

    Example:
    >>> import numpy as np
    >>> np.asarray(choice_counts(np.array([[0, 2]]), np.ones((1, 2)), 3)).tolist()
    [[1.0, 0.0, 1.0]]
    """
    chosen = ops.one_hot(expert_index, num_experts, dtype="float32")
    return ops.sum(chosen * ops.cast(selected, "float32")[..., None], axis=-2)


def _f_times_p(counts, probs_sum, tokens):
    """`E * sum_e f_e * P_e` with `f = counts / sum(counts)`, `P = probs_sum / tokens`."""
    num_experts = counts.shape[-1]
    fraction = counts / ops.maximum(ops.sum(counts, axis=-1, keepdims=True), 1.0)
    mean_prob = probs_sum / ops.maximum(tokens, 1.0)
    return num_experts * ops.sum(fraction * mean_prob, axis=-1)


def sequence_balance_loss(router_probs: Tensor, counts: Tensor, token_mask: Tensor) -> Tensor:
    """DeepSeek's sequence-wise balance loss, averaged over the sequences with real tokens.

    Per sequence, `f_e` is expert e's share of the sequence's choices (all K
    of every real token: `E * f_e` is DeepSeek-V3's `f_i`, eq. 18) and `P_e`
    the mean of the distribution `router_probs` over its real tokens.

    Args:
        router_probs: float [B, L, E], the scores as a distribution over experts.
        counts: float [B, L, E], `choice_counts` of each token.
        token_mask: [B, L], 1 for real tokens.

    Returns:
        A float32 scalar, 1.0 for a uniform router; 0 without real tokens.

    Example (a sequence whose two tokens both pick expert 0 with p = 0.75):
    >>> import numpy as np
    >>> probs = np.array([[[0.75, 0.25], [0.75, 0.25]]], "float32")
    >>> counts = np.array([[[1.0, 0.0], [1.0, 0.0]]], "float32")
    >>> float(sequence_balance_loss(probs, counts, np.ones((1, 2))))  # 2 * (1 * 0.75)
    1.5
    """
    mask = ops.cast(token_mask, "float32")[..., None]
    tokens = ops.sum(mask, axis=1)  # [B, 1]
    per_sequence = _f_times_p(
        ops.sum(ops.cast(counts, "float32") * mask, axis=1),
        ops.sum(ops.cast(router_probs, "float32") * mask, axis=1),
        tokens,
    )
    sequences = ops.sum(ops.cast(tokens[:, 0] > 0, "float32"))
    return ops.sum(per_sequence) / ops.maximum(sequences, 1.0)


def global_balance_loss(router_probs: Tensor, counts: Tensor, token_mask: Tensor) -> Tensor:
    """Global-batch balance loss: `f` from the choices of every replica, `P` local.

    Under a `tf.distribute` strategy the choice counts are summed over the
    replicas before `f` is taken, so with equal replica batches the mean of
    the replicas' losses equals the loss of the concatenated batch (Keras
    averages replica losses). On a JAX mesh the sums already span the global batch.

    Args:
        router_probs: float [..., E], the scores as a distribution over experts.
        counts: float [..., E], `choice_counts` of each token.
        token_mask: [...], 1 for real tokens.

    Returns:
        A float32 scalar, 1.0 for a uniform router.

    Example (two sequences, each unbalanced alone, balanced together):
    >>> import numpy as np
    >>> probs = np.array([[[0.75, 0.25]], [[0.25, 0.75]]], "float32")
    >>> counts = np.array([[[1.0, 0.0]], [[0.0, 1.0]]], "float32")
    >>> float(global_balance_loss(probs, counts, np.ones((2, 1))))
    1.0
    >>> float(sequence_balance_loss(probs, counts, np.ones((2, 1))))
    1.5
    """
    num_experts = counts.shape[-1]
    mask = ops.reshape(ops.cast(token_mask, "float32"), (-1, 1))
    counts = ops.sum(ops.reshape(ops.cast(counts, "float32"), (-1, num_experts)) * mask, axis=0)
    probs_sum = ops.sum(
        ops.reshape(ops.cast(router_probs, "float32"), (-1, num_experts)) * mask, axis=0
    )
    ctx = replica_context()
    if ctx is not None:
        counts = ctx.all_reduce("sum", counts)
    return _f_times_p(counts, probs_sum, ops.sum(mask))
