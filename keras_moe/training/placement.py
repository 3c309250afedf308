"""Where a run's model lives: a `tf.distribute` strategy or a JAX device mesh, behind one interface.

A `Run` asks its placement for the scope to build the model in, the number
of replicas the global batch is split over, whether this process is the
chief (it writes checkpoints, logs and plots), and how the weights were
sharded. `make_placement` picks the kind from the settings: `train.mesh_shape`
(JAX) gives a `MeshPlacement`, anything else a `StrategyPlacement`.
"""

import contextlib

from keras_moe.training.log import log


class StrategyPlacement:
    """Data parallelism by a `tf.distribute` strategy (`train.strategy`: "mirrored", "tpu", ...).

    Args:
        strategy: the `tf.distribute.Strategy`.
        name: its setting (`train.strategy`).
        process_index: this JAX process (always 0 outside a multi-process mesh).
    """

    mesh = None

    def __init__(self, strategy, name, process_index=0):
        from keras_moe.training import strategy as strategy_lib

        self.strategy, self.name = strategy, name
        self.replicas = strategy.num_replicas_in_sync
        self.chief = strategy_lib.is_chief(strategy) and process_index == 0

    def apply(self):
        """Nothing to set before the model is built."""

    def scope(self):
        """The strategy's scope: variables made inside are mirrored over its replicas."""
        return self.strategy.scope()

    def shard_report(self, model):
        """None: a strategy replicates every weight."""
        return None

    def exchange_report(self, model, batch_size, feature_lengths):
        """No lines: each replica routes its own batch to its own copy of every expert."""
        return []

    def batch_layout(self, batch_size):
        """How the global batch is split, for the start-up report."""
        return f"global batch {batch_size} = {batch_size // self.replicas} per replica"

    def describe(self):
        return f"strategy {self.name} ({type(self.strategy).__name__}, {self.replicas} replica(s))"


class MeshPlacement:
    """Weights and batches sharded over a `keras.distribution` device mesh (JAX backend).

    Args:
        mesh_shape: dict mesh axis -> size (`train.mesh_shape`).
        logical_axis_rules: `(logical axis, mesh axes)` pairs, or None for
            `keras_moe.layouts.DEFAULT_RULES`.
        process_index: this JAX process; process 0 is the chief.
    """

    replicas = 1  # one program over the whole mesh; the mesh splits the batch

    def __init__(self, mesh_shape, logical_axis_rules=None, process_index=0):
        self.mesh_shape, self.logical_axis_rules = mesh_shape, logical_axis_rules
        self.chief = process_index == 0
        self.mesh = None

    def apply(self):
        """Sets the mesh as Keras' distribution; must come before any layer is made."""
        from keras_moe.training import mesh as mesh_lib

        self.mesh = mesh_lib.apply_mesh(self.mesh_shape, self.logical_axis_rules)
        log(f"device mesh {self.mesh}: the model is sharded by keras_moe.layouts")

    def scope(self):
        """No scope: the distribution set by `apply` places every variable."""
        return contextlib.nullcontext()

    def shard_report(self, model):
        """[(class of variable, full shape, shape on one device)] (`mesh.shard_report`)."""
        from keras_moe.training import mesh as mesh_lib

        return mesh_lib.shard_report(model)

    def exchange_report(self, model, batch_size, feature_lengths):
        """Lines naming each MoE layer's expert exchange and why (`mesh.exchange_report`)."""
        from keras_moe.training import mesh as mesh_lib

        return mesh_lib.exchange_report(model, batch_size, feature_lengths)

    def batch_layout(self, batch_size):
        """How the global batch is split over the mesh, for the start-up report."""
        from keras_moe.training import mesh as mesh_lib

        axes, size = mesh_lib.batch_split(self.mesh_shape, self.logical_axis_rules, batch_size)
        if size == 1:
            return f"global batch {batch_size}, not split over the mesh"
        return (f"global batch {batch_size} split over mesh axes {' x '.join(axes)} = {size} "
                f"devices, {batch_size // size} rows each")

    def describe(self):
        return f"device mesh {self.mesh_shape} (keras.distribution)"


def make_placement(config, process_index=0):
    """The placement of a `TrainConfig`: a mesh if `mesh_shape` is set, else its strategy.

    Args:
        config: a checked `TrainConfig` (`check_mesh` has refused a mesh
            together with a strategy other than "default").
        process_index: this JAX process.

    Example:
    >>> from keras_moe.training.run import TrainConfig
    >>> placement = make_placement(TrainConfig())
    >>> placement.describe(), placement.chief
    ('strategy default (_DefaultDistributionStrategy, 1 replica(s))', True)
    """
    from keras_moe.training import strategy as strategy_lib

    if config.mesh_shape is not None:
        return MeshPlacement(config.mesh_shape, config.logical_axis_rules, process_index)
    strategy = strategy_lib.make_strategy(
        config.strategy, tpu_name=config.tpu_name, devices=config.mirrored_devices,
        collective_timeout=config.collective_timeout,
        cluster_wait_timeout=config.cluster_wait_timeout)
    return StrategyPlacement(strategy, config.strategy, process_index)
