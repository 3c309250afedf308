"""`MeshPlacement`: a run's weights and batches sharded over a JAX device mesh."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager

from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log
from keras_moe.training.placement import mesh as mesh_lib

if TYPE_CHECKING:
    import keras


class MeshPlacement:
    """Weights and batches sharded over a `keras.distribution` device mesh (JAX backend).

    Args:
        mesh_shape: dict mesh axis -> size, e.g. {"data": 2, "expert": 4}
            (see `keras_moe.parallel.sharding.configure_mesh`).
        logical_axis_rules: `(logical axis, mesh axes)` pairs, or None for
            `keras_moe.parallel.layouts.DEFAULT_RULES`.

    Example:
    >>> placement = MeshPlacement({"data": 2, "expert": 4}).start(process_index=0)
    >>> placement.chief, placement.replicas
    (True, 1)
    >>> MeshPlacement().check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: MeshPlacement.mesh_shape is required, ...
    """

    replicas = 1  # one program over the whole mesh; the mesh splits the batch
    name = "default"  # no tf.distribute strategy

    def __init__(self, mesh_shape: dict | None = None, logical_axis_rules: tuple | None = None):
        self.mesh_shape, self.logical_axis_rules = mesh_shape, logical_axis_rules
        self.chief: bool | None = None  # set by `start`
        self.mesh: dict[str, int] | None = None  # axis -> size, set by `apply`

    def check(self, batch_size: int | None = None) -> MeshPlacement:
        """Checks the mesh against this backend and its devices, and that
        `batch_size` splits over it; returns self."""

        if self.mesh_shape is None:
            raise TrainingConfigError(
                'MeshPlacement.mesh_shape is required, e.g. {"data": 2, "expert": 4}.'
            )
        mesh_lib.check_mesh(self.mesh_shape, self.logical_axis_rules)
        if batch_size is not None:
            mesh_lib.check_batch_splits(self.mesh_shape, self.logical_axis_rules, batch_size)
        return self

    def start(self, process_index: int = 0) -> MeshPlacement:
        """Process 0 is the chief; returns self."""
        self.chief = process_index == 0
        return self

    def check_batch(self, batch_size: int) -> None:
        """The mesh's split of the batch was checked by `check`."""

    def apply(self) -> None:
        """Sets the mesh as Keras' distribution; must come before any layer is made."""

        self.mesh = mesh_lib.apply_mesh(self.mesh_shape, self.logical_axis_rules)
        log(f"device mesh {self.mesh}: the model is sharded by keras_moe.parallel.layouts")

    def scope(self) -> ContextManager:
        """No scope: the distribution set by `apply` places every variable."""
        return contextlib.nullcontext()

    def shard_report(self, model: keras.Model) -> list:
        """[(class of variable, full shape, shape on one device)] (`mesh.shard_report`)."""

        return mesh_lib.shard_report(model)

    def exchange_report(
        self, model: keras.Model, batch_size: int, feature_lengths: dict
    ) -> list[str]:
        """Lines naming each MoE layer's expert exchange and why (`mesh.exchange_report`)."""

        return mesh_lib.exchange_report(model, batch_size, feature_lengths)

    def batch_layout(self, batch_size: int) -> str:
        """How the global batch is split over the mesh, for the start-up report."""

        axes, size = mesh_lib.batch_split(self.mesh_shape, self.logical_axis_rules, batch_size)
        if size == 1:
            return f"global batch {batch_size}, not split over the mesh"
        return (
            f"global batch {batch_size} split over mesh axes {' x '.join(axes)} = {size} "
            f"devices, {batch_size // size} rows each"
        )

    def describe(self) -> str:
        return f"device mesh {self.mesh_shape} (keras.distribution)"

    def shared_with(self, process_count: int) -> str | None:
        """ "N processes" when the sharded model spans several, else None."""
        return f"{process_count} processes" if process_count > 1 else None

    def peer_failure(self, error: Exception, step: int) -> None:
        """None: a mesh's failed step is raised as it is."""
        return None
