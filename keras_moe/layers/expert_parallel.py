"""Expert parallelism across `tf.distribute` replicas (TensorFlow backend).

`ExpertParallelExperts` is a drop-in `FeedForwardExperts`: under a
`tf.distribute` strategy with N replicas, replica r computes only experts
`[r*E/N, (r+1)*E/N)` on the tokens that every replica routed to them, and the
tokens travel between replicas by a collective exchange with a gradient.
Outside a replica context (single device, the symbolic build Keras does in
cross-replica context, or the JAX backend) it is exactly `FeedForwardExperts`.

Exchanges (`exchange=`):

- `"all_gather"`: every replica all-gathers the expert buffers `[E, G, C, d]`
  along the group axis, computes its experts on all groups, and all-gathers
  the results along the expert axis; each replica keeps its own groups.
  Works under any strategy (MirroredStrategy on CPU/GPU included), tolerates
  different group counts per replica, and its gradient is exact. It moves N
  times the data of a true all-to-all: right for tests and small meshes.
- `"all_to_all"`: `tf.raw_ops.AllToAll` (via `tpu_ops.all_to_all`, which has a
  registered gradient): the real exchange, TPU only, equal group counts on
  every replica. Not run here (no TPU).
- `"auto"`: `"all_to_all"` under `TPUStrategy`, else `"all_gather"`.

Limits: expert weights are still mirrored (every replica holds all experts
and their optimizer state); the gain is compute, not memory. For sharded
expert memory use the JAX backend (`keras_moe.parallel.sharding.configure_mesh`).
`num_experts` must be divisible by the number of replicas. Expert dropout
draws different masks than the single-device layer.

Example:
>>> import numpy as np
>>> import tensorflow as tf
>>> import keras_moe
>>> strategy = tf.distribute.MirroredStrategy()  # the local GPUs, else the CPU
>>> with strategy.scope():
...     layer = keras_moe.MoeLayer(
...         keras_moe.SwitchRouter(num_experts=8),
...         ExpertParallelExperts(num_experts=8, d_ff=64),
...     )
...     y = layer(np.ones((2, 4, 16), "float32"))  # builds the (mirrored) weights
>>> tuple(y.shape)
(2, 4, 16)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import keras

from keras_moe import compat
from keras_moe.arguments import Activation
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.moe import MoeLayer
from keras_moe.parallel.replica_context import replica_context
from keras_moe.routing import SwitchRouter, default_router_initializer
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    from keras_moe.layers.moe import MoeLayer

EXCHANGES = ("auto", "all_gather", "all_to_all")
Exchange = Literal["auto", "all_gather", "all_to_all"]


def _is_tpu_strategy(strategy):
    return type(strategy).__name__.startswith("TPUStrategy")


def check_expert_parallel(num_experts: int, num_replicas: int) -> None:
    """Raises ValueError unless `num_experts` splits evenly over `num_replicas`."""
    if num_experts % num_replicas:
        raise ValueError(
            f"Expert parallelism needs `num_experts` ({num_experts}) divisible by the "
            f"number of replicas ({num_replicas}); every replica runs the same number "
            "of experts."
        )


@keras.saving.register_keras_serializable(package="keras_moe")
class ExpertParallelExperts(FeedForwardExperts):
    """`FeedForwardExperts` that splits the experts over `tf.distribute` replicas.

    Args:
        num_experts, d_ff, activation, dropout_rate, init_scale, seed: as for
            `FeedForwardExperts`.
        exchange: "auto", "all_gather" or "all_to_all" (see the module doc).

    Example:
    >>> import numpy as np
    >>> experts = ExpertParallelExperts(num_experts=8, d_ff=32)
    >>> y = experts(np.ones((8, 2, 4, 16), "float32"))  # [E, G, C, d]; no strategy: plain compute
    >>> tuple(y.shape), experts.local_experts  # one device computes all 8 experts
    ((8, 2, 4, 16), 8)
    """

    takes_sorted_rows = False  # exchanges fixed-capacity buffers between replicas

    def __init__(
        self, num_experts: int, d_ff: int, exchange: Exchange = "auto", **kwargs: Any
    ) -> None:
        super().__init__(num_experts, d_ff, **kwargs)
        if self.use_bias:
            raise ValueError(
                "`use_bias=True` is not supported by ExpertParallelExperts "
                "(tf.distribute expert parallelism); use FeedForwardExperts."
            )
        if exchange not in EXCHANGES:
            raise ValueError(f"`exchange` must be one of {EXCHANGES}, got {exchange!r}.")
        self.exchange = exchange
        self.local_experts: int | None = None  # experts per replica in the last traced call

    def _local_ffn(self, x, start, count, d_model, training):
        """Experts [start, start+count) on buffers x [count, G', C, d]."""
        import tensorflow as tf

        shape = tf.shape(x)
        x = tf.reshape(x, (count, -1, d_model))

        def weights(var):
            value = var.value
            return tf.slice(value, [start, 0, 0], [count, -1, -1])

        y = self.feed_forward(x, tf.matmul, training, kernel=weights)
        return tf.reshape(y, shape)

    def call(
        self, inputs: Tensor, training: bool | None = None, group_sizes: Tensor | None = None
    ) -> Tensor:
        ctx = replica_context()
        if ctx is None:
            self.local_experts = self.num_experts
            return super().call(inputs, training=training, group_sizes=group_sizes)
        if group_sizes is not None:
            raise ValueError(
                "`group_sizes` (rows sorted by expert, dispatch='dropless') is not taken "
                "under a tf.distribute strategy: exchange capacity buffers instead."
            )
        import tensorflow as tf

        n = ctx.num_replicas_in_sync
        check_expert_parallel(self.num_experts, n)
        k = self.num_experts // n
        self.local_experts = k
        rid = ctx.replica_id_in_sync_group
        if not isinstance(rid, int):
            rid = tf.cast(rid, "int32")
        exchange = self.exchange
        if exchange == "auto":
            exchange = "all_to_all" if _is_tpu_strategy(ctx.strategy) else "all_gather"
        inputs = tf.convert_to_tensor(inputs)
        d_model = inputs.shape[-1]
        if exchange == "all_gather":
            groups = tf.shape(inputs)[1]
            sizes = ctx.all_gather(tf.reshape(groups, (1,)), axis=0)  # [N]
            every = ctx.all_gather(inputs, axis=1)  # [E, G_all, C, d]
            mine = tf.slice(every, [rid * k, 0, 0, 0], [k, -1, -1, -1])
            out = self._local_ffn(mine, rid * k, k, d_model, training)  # [k, G_all, C, d]
            out = ctx.all_gather(out, axis=0)  # [E, G_all, C, d]
            offset = tf.reduce_sum(sizes[:rid])
            out = tf.slice(out, [0, offset, 0, 0], [-1, groups, -1, -1])
            out.set_shape(inputs.shape)
            return out

        tpu_ops = compat.tf_tpu_ops()

        assignment = [list(range(n))]
        mine = tpu_ops.all_to_all(
            inputs,
            concat_dimension=1,
            split_dimension=0,
            split_count=n,
            group_assignment=assignment,
        )  # [k, N*G, C, d]
        out = self._local_ffn(mine, rid * k, k, d_model, training)
        out = tpu_ops.all_to_all(
            out, concat_dimension=0, split_dimension=1, split_count=n, group_assignment=assignment
        )  # [E, G, C, d]
        out.set_shape(inputs.shape)
        return out

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(exchange=self.exchange)
        return config


def expert_parallel_switch(
    num_experts: int,
    d_ff: int,
    exchange: Exchange = "auto",
    activation: Activation = "relu",
    jitter_noise: float = 0.0,
    init_scale: float = 1.0,
    seed: int | None = None,
    **moe_kwargs: Any,
) -> MoeLayer:
    """A Switch (top-1) `MoeLayer` whose experts are `ExpertParallelExperts`.

    Args:
        num_experts, d_ff, activation, jitter_noise, init_scale, seed: as for
            `keras_moe.SwitchFeedForward`.
        exchange: see `ExpertParallelExperts`.
        **moe_kwargs: other `keras_moe.MoeLayer` arguments (capacity factors,
            group_size, dispatch, loss factors, name, ...).

    Example:
    >>> import numpy as np
    >>> layer = expert_parallel_switch(num_experts=8, d_ff=64, name="moe")
    >>> type(layer.router).__name__, type(layer.experts).__name__, layer.group_size
    ('SwitchRouter', 'ExpertParallelExperts', 'sequence')
    >>> tuple(layer(np.ones((2, 4, 16), "float32")).shape)
    (2, 4, 16)
    """

    router = SwitchRouter(
        num_experts,
        jitter_noise=jitter_noise,
        kernel_initializer=default_router_initializer(init_scale),
        seed=seed,
        name="router",
    )
    experts = ExpertParallelExperts(
        num_experts,
        d_ff,
        exchange=exchange,
        activation=activation,
        init_scale=init_scale,
        seed=seed,
        name="experts",
    )
    # The replicas exchange per-sequence groups: the exchange is tested with them.
    moe_kwargs.setdefault("group_size", "sequence")
    return MoeLayer(router, experts, **moe_kwargs)
