"""Expert selection beyond plain top-k: group-limited top-k and loss-free bias balancing.

Group-limited top-k is DeepSeek-V3's node-limited routing (arXiv 2412.19437,
§2.1.2): the experts form `n_group` equal groups of consecutive indices, each
token keeps the `topk_group` groups whose two best scores sum highest, and
picks its top-k among the kept groups' experts. Loss-free balancing (Wang et
al., arXiv 2408.15664) adds a per-expert bias to the scores for selection
only, and after each training step moves it by `rate * sign(mean_load - load)`.
"""

from __future__ import annotations

from keras import ops

from keras_moe.parallel.replica_context import replica_context
from keras_moe.tensor_types import Tensor


def group_limited_top_k(scores: Tensor, k: int, n_group: int, topk_group: int) -> Tensor:
    """Indices [..., k] of the top-k scores [..., E] in the best `topk_group` of `n_group` groups.

    A group's score is the sum of its two highest scores (its only score when
    a group holds one expert). With `topk_group == n_group` this is plain top-k.

    Args:
        scores: float [..., E], E divisible by `n_group`.
        k: experts per token, at most `topk_group * E // n_group`.
        n_group: number of groups of `E // n_group` consecutive experts.
        topk_group: groups each token may pick experts from.

    Returns:
        int32 [..., k], best first.

    Example:
    >>> import numpy as np
    >>> scores = np.array([[0.9, 0.0, 0.5, 0.5, 0.8, 0.1]], "float32")  # groups of 2 experts
    >>> np.asarray(group_limited_top_k(scores, 2, n_group=3, topk_group=1)).tolist()  # .9, 1, .9
    [[2, 3]]
    """
    num_experts = scores.shape[-1]
    if n_group > 1 and topk_group < n_group:
        per_group = num_experts // n_group
        shape = ops.shape(scores)
        grouped = ops.reshape(scores, tuple(shape[:-1]) + (n_group, per_group))
        best, _ = ops.top_k(grouped, min(2, per_group))
        _, kept_groups = ops.top_k(ops.sum(best, axis=-1), topk_group)  # [..., topk_group]
        group_kept = ops.sum(ops.one_hot(kept_groups, n_group, dtype="float32"), axis=-2)
        expert_kept = ops.reshape(
            ops.broadcast_to(group_kept[..., None], tuple(shape[:-1]) + (n_group, per_group)), shape
        )
        scores = ops.where(expert_kept > 0, scores, ops.full_like(scores, float("-inf")))
    _, index = ops.top_k(scores, k)
    return ops.cast(index, "int32")


def expert_counts(expert_index: Tensor, token_mask: Tensor, num_experts: int) -> Tensor:
    """Float32 [E]: how many real tokens chose each expert, over the global batch.

    Counted over every choice `[G, S, K]` before any capacity limit. Under a
    `tf.distribute` strategy the replicas' counts are summed; on a JAX mesh
    the sum of a batch-sharded array already is the global one.

    Example:
    >>> import numpy as np
    >>> index = np.array([[[0, 1], [0, 2], [3, 2]]])  # [G=1, S=3, K=2]
    >>> np.asarray(expert_counts(index, np.array([[1.0, 1.0, 0.0]]), 4)).tolist()
    [2.0, 1.0, 1.0, 0.0]
    """
    chosen = ops.one_hot(expert_index, num_experts, dtype="float32")
    chosen = chosen * ops.cast(token_mask, "float32")[..., None, None]
    counts = ops.sum(ops.reshape(chosen, (-1, num_experts)), axis=0)
    ctx = replica_context()
    if ctx is not None:
        counts = ctx.all_reduce("sum", counts)
    return counts


def balancing_bias_step(bias: Tensor, counts: Tensor, rate: float) -> Tensor:
    """The loss-free balancing update: `bias + rate * sign(mean(counts) - counts)`.

    Overloaded experts (more than the mean load) get a lower bias, underloaded
    ones a higher bias, each by `rate`; experts exactly at the mean keep theirs.

    Example:
    >>> import numpy as np
    >>> bias = np.zeros(4, "float32")
    >>> np.asarray(balancing_bias_step(bias, np.array([5.0, 1.0, 3.0, 3.0]), 0.1)).tolist()
    [-0.10000000149011612, 0.10000000149011612, 0.0, 0.0]
    """
    counts = ops.cast(counts, "float32")
    return bias + rate * ops.sign(ops.mean(counts) - counts)
