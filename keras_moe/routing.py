"""Routers: decide which tokens go to which experts, and with what weight.

A router is a small Keras layer that holds the router kernel and turns
tokens `[G, S, d]` into float32 logits `[G, S, E]` (`router(x)`), plus a
routing algorithm (`router.route(...)`) that turns those logits into
`RoutingInstructions`. Routers never touch expert weights and never move
activations: that is the dispatcher's job (`dispatch.py`).

Conventions (all tensors are token-major, `K` routing choices per token):
- `expert_index[g, s, k]`: the expert of token `s`'s k-th choice.
- `position[g, s, k]`: its slot in that expert's buffer (valid where kept).
- `kept[g, s, k]`: 1.0 if the assignment fits within capacity and the token
  is real (not padding), else 0.0.
- `combine_weight[g, s, k]`: the weight of that expert's output in the
  token's output; exactly 0 where not kept.
"""

import math
from typing import NamedTuple

import keras
from keras import ops

from keras_moe import losses
from keras_moe.validation import is_int

SECOND_EXPERT_POLICIES = ("all", "random", "threshold")
NORMALIZE_GATES = ("before_capacity", "after_capacity")


class RoutingInstructions(NamedTuple):
    """Everything a dispatcher and the MoE layer need from routing.

    Attributes:
        expert_index: int32 [G, S, K].
        position: int32 [G, S, K] slot in the expert's buffer.
        combine_weight: float32 [G, S, K], 0 where not kept.
        kept: float32 [G, S, K], 1 where the assignment is dispatched.
        router_probs: float32 [G, S, E].
        router_logits: float32 [G, S, E].
        aux_loss: float32 scalar, unscaled load-balancing loss.
        z_loss: float32 scalar, unscaled router z-loss.
        capacity: slots per expert per group: a Python int, or an int32
            scalar tensor when the group size is known only at run time
            (TensorFlow, `group_size="batch"` with an unknown batch size).
        num_experts: Python int.
    """

    expert_index: object
    position: object
    combine_weight: object
    kept: object
    router_probs: object
    router_logits: object
    aux_loss: object
    z_loss: object
    capacity: int
    num_experts: int


def default_router_initializer(scale=1.0):
    """Fan-in truncated normal, std sqrt(scale / fan_in) (the Switch paper: scale 0.1 model-wide)."""
    return keras.initializers.VarianceScaling(
        scale=scale, mode="fan_in", distribution="truncated_normal"
    )


def _dynamic_ceil(factor, group_size):
    """int32 `ceil(factor * group_size)` of a run-time group size (float64, as Python)."""
    size = ops.cast(group_size, "float64")
    return ops.cast(ops.ceil(ops.multiply(size, factor)), "int32")


def _check_positive_int(name, value, minimum=1):
    if not is_int(value) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


class Router(keras.layers.Layer):
    """Base router: float32 linear projection to expert logits, with jitter.

    `route()` is a template: it turns the logits into float32 probabilities and
    a float token mask, asks the subclass's `assign()` which experts and slots
    each token gets, and adds what every router reports (logits, z-loss,
    capacity). Token-choice routers share `TokenChoiceRouter.assign()` and
    implement only which choices ask for a slot and their combine weights.
    The layer defaults to `dtype="float32"`, so
    under a `mixed_bfloat16` policy its matmul and softmax still run in float32
    (the Switch paper's selective precision). Pass another `dtype` only to
    study what happens without it.

    Args:
        num_experts: number of experts, >= 1.
        jitter_noise: multiplicative noise amplitude applied in training to the
            router's own copy of the input, `x * U(1 - eps, 1 + eps)`. The
            experts always see the clean input. 0 disables it.
        kernel_initializer: initializer of the `[d_model, num_experts]` kernel;
            defaults to a fan-in truncated normal at scale 1.0, like the
            experts (see `default_router_initializer`).
        use_bias: whether the projection has a bias.
        seed: seed for jitter and random routing decisions.
    """

    is_causal_safe = True  # False when a token's routing depends on later tokens
    batch_prioritized_routing = False  # True: capacity filled by confidence, not order

    def __init__(
        self,
        num_experts,
        jitter_noise=0.0,
        kernel_initializer=None,
        use_bias=False,
        seed=None,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        _check_positive_int("num_experts", num_experts)
        if not (isinstance(jitter_noise, (int, float)) and 0.0 <= jitter_noise < 1.0):
            raise ValueError(f"`jitter_noise` must be in [0, 1), got {jitter_noise!r}.")
        self.num_experts = num_experts
        self.jitter_noise = float(jitter_noise)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or default_router_initializer()
        )
        self.use_bias = use_bias
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True  # logits keep the tokens' mask

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.kernel = self.add_weight(
            name="kernel",
            shape=(d_model, self.num_experts),
            initializer=self.kernel_initializer,
        )
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.num_experts,), initializer="zeros"
            )
        self.built = True

    def call(self, inputs, training=None):
        """Returns router logits [..., E] in the router's compute dtype (float32)."""
        x = inputs
        if training and self.jitter_noise > 0:
            noise = keras.random.uniform(
                ops.shape(x),
                minval=1.0 - self.jitter_noise,
                maxval=1.0 + self.jitter_noise,
                dtype=self.compute_dtype,
                seed=self.seed_generator,
            )
            x = x * noise
        logits = ops.matmul(x, ops.cast(self.kernel, self.compute_dtype))
        if self.use_bias:
            logits = logits + ops.cast(self.bias, self.compute_dtype)
        return logits

    def num_choices(self):
        """K, the number of routing choices per token in the instructions."""
        raise NotImplementedError

    def expert_capacity(self, group_size, capacity_factor, min_expert_capacity):
        """Slots per expert per group: `min(S, max(min, ceil(cf * K * S / E)))`.

        A token takes at most one slot of an expert, so no expert can be sent
        more than the group's `S` tokens: capping at `S` drops nothing and keeps
        small groups (one token per sequence in cached decoding) from computing
        `min_expert_capacity` slots per token. `group_size` is a Python int, or
        a scalar tensor when the group size is only known at run time (then so
        is the capacity).
        """
        k = self.num_choices()
        if isinstance(group_size, int):
            capacity = math.ceil(capacity_factor * k * group_size / self.num_experts)
            return min(group_size, max(int(min_expert_capacity), capacity))
        capacity = _dynamic_ceil(capacity_factor * k / self.num_experts, group_size)
        return ops.minimum(ops.cast(group_size, "int32"),
                           ops.maximum(int(min_expert_capacity), capacity))

    def route(self, logits, token_mask, capacity, training=False):
        """Turns logits [G, S, E] into `RoutingInstructions`."""
        logits = ops.cast(logits, "float32")
        probs = ops.softmax(logits, axis=-1)
        mask = ops.cast(token_mask, "float32")
        expert_index, position, kept, combine_weight, aux_loss = self.assign(
            probs, mask, capacity, training)
        return RoutingInstructions(
            expert_index=ops.cast(expert_index, "int32"),
            position=ops.cast(position, "int32"),
            combine_weight=ops.cast(combine_weight, "float32") * kept,
            kept=kept,
            router_probs=probs,
            router_logits=logits,
            aux_loss=aux_loss,
            z_loss=losses.router_z_loss(logits, mask),
            capacity=capacity,
            num_experts=self.num_experts,
        )

    def assign(self, probs, token_mask, capacity, training):
        """The routing decision of probabilities [G, S, E] and a float mask [G, S].

        Returns:
            `(expert_index, position, kept, combine_weight, aux_loss)`: int
            [G, S, K] experts, [G, S, K] slots in them, float [G, S, K] 1 where
            the assignment holds a slot, float [G, S, K] combine weights (masked
            by `kept` afterwards), and the scalar load-balancing loss.
        """
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update(
            num_experts=self.num_experts,
            jitter_noise=self.jitter_noise,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            use_bias=self.use_bias,
            seed=self.seed,
        )
        return config


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
    flat = ops.reshape(choice_major, (shape[0], -1, num_experts))
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


def _normalized(gates):
    """Gates [..., K] divided by their sum (0 where all are 0)."""
    return gates / ops.maximum(ops.sum(gates, axis=-1, keepdims=True), 1e-9)


def _priority_order(probs, token_mask, batch_prioritized):
    if not batch_prioritized:
        return None
    # Highest router confidence first; padding last.
    score = ops.max(probs, axis=-1) - 2.0 * (1.0 - ops.cast(token_mask, "float32"))
    return ops.argsort(-score, axis=1)


class TokenChoiceRouter(Router):
    """Base of the routers where each token picks its top-K experts.

    Experts take the choices that ask for a slot in priority order (every
    first choice before any second choice; tokens in sequence order, or by
    router confidence with `batch_prioritized_routing`) until their capacity is
    full. Subclasses implement `num_choices`, `choices_asking` (which of the K
    choices ask for a slot) and `combine_weights`.

    Example (a top-2 router whose second choice asks only when it is at least
    half as likely as the first):
    >>> import numpy as np
    >>> from keras import ops
    >>> class HalfTop2(TokenChoiceRouter):
    ...     def num_choices(self):
    ...         return 2
    ...     def choices_asking(self, gates, token_mask, training):
    ...         second = ops.cast(gates[..., 1] >= 0.5 * gates[..., 0], "float32")
    ...         return ops.stack([token_mask, token_mask * second], axis=-1)
    ...     def combine_weights(self, gates, kept):
    ...         return gates
    >>> router = HalfTop2(num_experts=4)
    >>> logits = np.log(np.array([[[0.6, 0.2, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]]], "float32"))
    >>> np.asarray(router.route(logits, np.ones((1, 2)), capacity=2).kept).tolist()
    [[[1.0, 0.0], [1.0, 1.0]]]
    """

    def assign(self, probs, token_mask, capacity, training):
        gates, expert_index = ops.top_k(probs, self.num_choices())
        active = self.choices_asking(gates, token_mask, training)
        order = _priority_order(probs, token_mask, self.batch_prioritized_routing)
        position, kept = _keep_within_capacity(
            expert_index, active, self.num_experts, capacity, order
        )
        aux = losses.load_balancing_loss(probs, expert_index[..., 0], token_mask)
        return expert_index, position, kept, self.combine_weights(gates, kept), aux

    def choices_asking(self, gates, token_mask, training):
        """Float [G, S, K]: 1 where a choice asks for a slot (real tokens only)."""
        raise NotImplementedError

    def combine_weights(self, gates, kept):
        """Float [G, S, K] combine weights from the K chosen probabilities."""
        raise NotImplementedError


@keras.saving.register_keras_serializable(package="keras_moe")
class TopKRouter(TokenChoiceRouter):
    """Token-choice router: each token picks its `k` highest-probability experts.

    Combine weights are the router probabilities of the chosen experts
    (optionally renormalised over the k choices). Experts take assignments in
    priority order until their capacity is full; the rest are dropped.

    Args:
        num_experts: number of experts.
        k: experts per token, 1 <= k <= num_experts.
        normalize_top_k: renormalise the k chosen probabilities to sum to 1.
        batch_prioritized_routing: serve tokens by router confidence rather
            than sequence order when filling capacity (Riquelme et al., V-MoE).
        **kwargs: see `Router`.

    Example:
    >>> import numpy as np
    >>> router = TopKRouter(num_experts=4, k=2)
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=4)
    >>> tuple(routing.expert_index.shape)
    (1, 8, 2)
    """

    def __init__(self, num_experts, k=1, normalize_top_k=False,
                 batch_prioritized_routing=False, **kwargs):
        super().__init__(num_experts, **kwargs)
        _check_positive_int("k", k)
        if k > num_experts:
            raise ValueError(
                f"`k` must be <= num_experts ({num_experts}), got k={k}."
            )
        self.k = k
        self.normalize_top_k = bool(normalize_top_k)
        self.batch_prioritized_routing = bool(batch_prioritized_routing)

    def num_choices(self):
        return self.k

    def choices_asking(self, gates, token_mask, training):
        return ops.broadcast_to(token_mask[..., None], ops.shape(gates))

    def combine_weights(self, gates, kept):
        if self.normalize_top_k:
            return gates / ops.maximum(ops.sum(gates, axis=-1, keepdims=True), 1e-9)
        return gates

    def get_config(self):
        config = super().get_config()
        config.update(
            k=self.k,
            normalize_top_k=self.normalize_top_k,
            batch_prioritized_routing=self.batch_prioritized_routing,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class SwitchRouter(TopKRouter):
    """Switch Transformer top-1 router: combine weight = the chosen expert's probability.

    Args:
        num_experts: number of experts.
        **kwargs: `batch_prioritized_routing` and the `Router` arguments.

    Example:
    >>> import numpy as np
    >>> router = SwitchRouter(num_experts=8, jitter_noise=0.01)
    >>> logits = router(np.random.rand(2, 16, 32).astype("float32"))
    >>> routing = router.route(logits, np.ones((2, 16)), capacity=3)
    >>> tuple(routing.kept.shape)  # [G, S, K]: one choice per token
    (2, 16, 1)
    >>> expert, kept = np.asarray(routing.expert_index), np.asarray(routing.kept)
    >>> tokens_per_expert = [np.bincount(expert[g][kept[g] > 0], minlength=8) for g in range(2)]
    >>> int(np.max(tokens_per_expert)) <= 3  # each expert keeps at most `capacity` per group
    True
    """

    def __init__(self, num_experts, **kwargs):
        kwargs.pop("k", None)
        kwargs.pop("normalize_top_k", None)
        super().__init__(num_experts, k=1, normalize_top_k=False, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.pop("k")
        config.pop("normalize_top_k")
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class Top2Router(TokenChoiceRouter):
    """GShard top-2 router (Lepikhin et al., Algorithm 1).

    The top-1 expert always gets the token (capacity permitting). The second
    expert gets it according to `second_expert_policy`:
    - "all": always;
    - "random": with probability `g2 / threshold` (GShard: threshold 0.5,
      i.e. probability 2·g2), where g2 is the normalised second gate;
    - "threshold": only if g2 > threshold.
    Gates are renormalised to sum to 1 either before the capacity mask
    (GShard) or over the assignments that survive it.

    Args:
        num_experts: number of experts, >= 2.
        second_expert_policy: policy in training: "all", "random", "threshold".
        eval_second_expert_policy: policy in inference; "random" is not
            allowed here so that evaluation is deterministic.
        second_expert_threshold: threshold for the policy; defaults to 0.5
            for "random" and 0.2 for "threshold".
        normalize_gates: "before_capacity" (GShard) or "after_capacity".
        batch_prioritized_routing: serve tokens by router confidence.
        **kwargs: see `Router`.

    Example:
    >>> import numpy as np
    >>> router = Top2Router(num_experts=4, second_expert_policy="all")
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=8)
    >>> np.allclose(np.sum(routing.combine_weight, -1), 1.0)
    True
    """

    def __init__(self, num_experts, second_expert_policy="random",
                 eval_second_expert_policy="all", second_expert_threshold=None,
                 normalize_gates="before_capacity", batch_prioritized_routing=False,
                 **kwargs):
        super().__init__(num_experts, **kwargs)
        if num_experts < 2:
            raise ValueError(f"`num_experts` must be >= 2 for top-2 routing, got {num_experts}.")
        if second_expert_policy not in SECOND_EXPERT_POLICIES:
            raise ValueError(
                f"`second_expert_policy` must be one of {SECOND_EXPERT_POLICIES}, "
                f"got {second_expert_policy!r}."
            )
        allowed_eval = ("all", "threshold")
        if eval_second_expert_policy not in allowed_eval:
            raise ValueError(
                f"`eval_second_expert_policy` must be one of {allowed_eval}, "
                f"got {eval_second_expert_policy!r}."
            )
        if normalize_gates not in NORMALIZE_GATES:
            raise ValueError(
                f"`normalize_gates` must be one of {NORMALIZE_GATES}, got {normalize_gates!r}."
            )
        if second_expert_threshold is not None and not 0.0 < second_expert_threshold <= 1.0:
            raise ValueError(
                f"`second_expert_threshold` must be in (0, 1], got {second_expert_threshold!r}."
            )
        self.second_expert_policy = second_expert_policy
        self.eval_second_expert_policy = eval_second_expert_policy
        self.second_expert_threshold = second_expert_threshold
        self.normalize_gates = normalize_gates
        self.batch_prioritized_routing = bool(batch_prioritized_routing)

    def num_choices(self):
        return 2

    def _threshold(self, policy):
        if self.second_expert_threshold is not None:
            return self.second_expert_threshold
        return 0.5 if policy == "random" else 0.2

    def choices_asking(self, gates, token_mask, training):
        policy = self.second_expert_policy if training else self.eval_second_expert_policy
        second_gate = _normalized(gates)[..., 1]
        if policy == "all":
            take_second = ops.ones_like(second_gate)
        elif policy == "threshold":
            take_second = ops.cast(second_gate > self._threshold(policy), "float32")
        else:
            draw = keras.random.uniform(ops.shape(second_gate), seed=self.seed_generator)
            take_second = ops.cast(draw < second_gate / self._threshold(policy), "float32")
        return ops.stack([token_mask, token_mask * take_second], axis=-1)

    def combine_weights(self, gates, kept):
        if self.normalize_gates == "before_capacity":
            return _normalized(gates)
        return _normalized(gates * kept)

    def get_config(self):
        config = super().get_config()
        config.update(
            second_expert_policy=self.second_expert_policy,
            eval_second_expert_policy=self.eval_second_expert_policy,
            second_expert_threshold=self.second_expert_threshold,
            normalize_gates=self.normalize_gates,
            batch_prioritized_routing=self.batch_prioritized_routing,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class ExpertChoiceRouter(Router):
    """Expert-choice routing (Zhou et al., 2022): each expert picks its top-C tokens.

    Every expert is exactly full, so no load-balancing loss is needed (the aux
    loss is 0); a token may be chosen by several experts or by none. Because an
    expert's choice looks at every token of the group, this router is not
    causal: `MoeLayer(causal=True)` refuses it. Capacity is
    `ceil(cf * S / E)`, and at most `S` (an expert cannot pick more tokens
    than the group has).

    Args:
        num_experts: number of experts.
        **kwargs: see `Router`.

    Example:
    >>> import numpy as np
    >>> router = ExpertChoiceRouter(num_experts=4)
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=2)
    >>> np.sum(routing.kept, axis=(0, 1)).tolist()  # each expert takes 2 tokens
    [2.0, 2.0, 2.0, 2.0]
    """

    is_causal_safe = False

    def num_choices(self):
        return self.num_experts

    def expert_capacity(self, group_size, capacity_factor, min_expert_capacity):
        if isinstance(group_size, int):
            capacity = math.ceil(capacity_factor * group_size / self.num_experts)
            return min(group_size, max(int(min_expert_capacity), capacity))
        capacity = _dynamic_ceil(capacity_factor / self.num_experts, group_size)
        return ops.minimum(ops.cast(group_size, "int32"),
                           ops.maximum(int(min_expert_capacity), capacity))

    def assign(self, probs, token_mask, capacity, training):
        mask = token_mask
        shape = ops.shape(probs)
        num_groups, group_size, num_experts = shape[0], shape[1], self.num_experts
        # Padding scores below any real token, so experts pick it only when
        # the group has fewer real tokens than the capacity; it is unkept then.
        scores = probs - 2.0 * (1.0 - mask[..., None])
        _, chosen_tokens = ops.top_k(ops.transpose(scores, (0, 2, 1)), capacity)  # [G, E, C]
        group_ids = ops.reshape(ops.arange(num_groups, dtype="int32"), (-1, 1, 1))
        expert_ids = ops.reshape(ops.arange(num_experts, dtype="int32"), (1, -1, 1))
        flat = (group_ids * num_experts + expert_ids) * group_size + ops.cast(chosen_tokens, "int32")
        flat = ops.reshape(flat, (-1, 1))
        slots = ops.broadcast_to(
            ops.reshape(ops.arange(capacity, dtype="float32"), (1, 1, -1)),
            ops.shape(chosen_tokens),
        )
        total = num_groups * num_experts * group_size
        chosen = ops.scatter(flat, ops.ones((ops.shape(flat)[0],), "float32"), (total,))
        position = ops.scatter(flat, ops.reshape(slots, (-1,)), (total,))
        chosen = ops.transpose(ops.reshape(chosen, (num_groups, num_experts, group_size)), (0, 2, 1))
        position = ops.transpose(
            ops.reshape(position, (num_groups, num_experts, group_size)), (0, 2, 1)
        )
        kept = chosen * mask[..., None]
        expert_index = ops.broadcast_to(
            ops.reshape(ops.arange(num_experts, dtype="int32"), (1, 1, -1)), ops.shape(probs)
        )
        return expert_index, position, kept, probs, ops.zeros((), "float32")
