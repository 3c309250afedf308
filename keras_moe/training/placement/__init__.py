"""Where a run's model lives: a `tf.distribute` strategy or a JAX device mesh, behind one interface.

A run file picks one (`train.placement = @StrategyPlacement()` or
`@MeshPlacement()`); the `Run` asks it, after `start`, for the scope to build
the model in, the replicas the global batch is split over, whether this
process is the chief (it writes checkpoints, logs and plots), how the weights
were sharded, and what a failed collective means. The `Run` never reads the
strategy's name.
"""

from keras_moe.training.placement.mesh_placement import MeshPlacement
from keras_moe.training.placement.strategy_placement import StrategyPlacement

__all__ = ["MeshPlacement", "StrategyPlacement"]
