"""How token-choice routing fills expert capacity: the order in which choices are served
(every first choice before any second one; tokens in sequence order or, batch-prioritised,
by router confidence), each choice's slot in its expert's buffer, and which fit.
"""

from keras import ops


def _positions_in_expert(expert_index, active, num_experts, token_order=None):
    """Slot of each (token, choice) in its expert's buffer.

    Choices are served in priority order: every token's first choice before
    any token's second choice (as in GShard and Switch), and within one choice
    tokens in sequence order, or in `token_order` (batch-prioritised routing).

    Args:
        expert_index: int [G, S, K].
        active: float [G, S, K], 1 where the choice asks for a slot.
        num_experts: E.
        token_order: optional int [G, S], a permutation of tokens per group,
            highest priority first.

    Returns:
        float32 [G, S, K] positions (0-based; meaningless where inactive).
    """
    requests = ops.one_hot(expert_index, num_experts, dtype="float32")
    requests = requests * active[..., None]  # [G, S, K, E]
    if token_order is not None:
        requests = ops.take_along_axis(requests, token_order[:, :, None, None], axis=1)
    shape = ops.shape(requests)
    choice_major = ops.transpose(requests, (0, 2, 1, 3))  # [G, K, S, E]
    # No -1: JAX cannot infer it when there are no groups (a batch of 0).
    flat = ops.reshape(choice_major, (shape[0], shape[2] * shape[1], num_experts))
    earlier = ops.cumsum(flat, axis=1) - flat
    position = ops.sum(earlier * flat, axis=-1)
    position = ops.transpose(ops.reshape(position, (shape[0], shape[2], shape[1])), (0, 2, 1))
    if token_order is not None:
        inverse = ops.argsort(token_order, axis=1)
        position = ops.take_along_axis(position, inverse[:, :, None], axis=1)
    return position


def _keep_within_capacity(expert_index, active, num_experts, capacity, token_order=None):
    position = _positions_in_expert(expert_index, active, num_experts, token_order)
    kept = active * ops.cast(position < ops.cast(capacity, position.dtype), "float32")
    return position, kept


def _priority_order(probs, token_mask, batch_prioritized):
    if not batch_prioritized:
        return None
    # Highest router confidence first; padding last. `initial`: Keras'
    # TensorFlow `max` raises on an empty tensor (a batch of 0) in eager mode.
    score = ops.max(probs, axis=-1, initial=0.0) - 2.0 * (1.0 - ops.cast(token_mask, "float32"))
    return ops.argsort(-score, axis=1)
