"""`tf.distribute` strategy from one setting (gin `StrategyPlacement.strategy`, `.tpu_name`).

- "default": the default (no-op) strategy, one device.
- "mirrored": `MirroredStrategy` over the local GPUs (or the given devices).
- "multi_worker": `MultiWorkerMirroredStrategy`, cluster from `TF_CONFIG`.
- "tpu": `TPUStrategy` on a Cloud TPU VM (`tpu_name` "local", a TPU name, or
  None for the resolver's default).

Keras' TF trainer runs `model.fit` under the strategy: the dataset's batch is
the global batch, split across replicas; the training loss (including the MoE
aux and z losses added with `add_loss`) is scaled by `1 / num_replicas` per
replica and the gradients summed, so the update equals the single-device one
when every replica has the same number of loss-weighted tokens.
"""

import json
import os

from keras_moe import compat
from keras_moe.training.errors import TrainingConfigError
from keras_moe.validation import is_number

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")


def make_strategy(
    name="default", tpu_name=None, devices=None, collective_timeout=None, cluster_wait_timeout=None
):
    """Builds the strategy named `name`.

    Args:
        name: one of `STRATEGIES`.
        tpu_name: for "tpu": "local" on a TPU VM, a TPU name, or None.
        devices: for "mirrored": optional device list (e.g. ["/cpu:0", "/cpu:1"]).
        collective_timeout: for "multi_worker": seconds after which a collective
            op (all-reduce) that does not complete, e.g. because a peer died,
            fails with `DeadlineExceededError` instead of hanging; None: no limit.
        cluster_wait_timeout: for "multi_worker": seconds to wait at start for
            all workers to join (None: forever). TF's peer health check (every
            30 s) also aborts the collectives when a peer goes down.

    Returns:
        a `tf.distribute.Strategy`.
    """
    import tensorflow as tf

    if name not in STRATEGIES:
        raise TrainingConfigError(
            f"StrategyPlacement.strategy must be one of {STRATEGIES}, got {name!r}."
        )
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=list(devices) if devices else None)
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise TrainingConfigError(
                'StrategyPlacement.strategy="multi_worker" needs the TF_CONFIG environment '
                'variable ({"cluster": {"worker": [...]}, "task": {"type": "worker", '
                '"index": i}}).'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except ValueError as e:
            raise TrainingConfigError(f"TF_CONFIG is not valid JSON: {e}") from None
        for name_, value in (
            ("collective_timeout", collective_timeout),
            ("cluster_wait_timeout", cluster_wait_timeout),
        ):
            if value is not None and (not is_number(value) or value <= 0):
                raise TrainingConfigError(
                    f"`StrategyPlacement.{name_}` must be a positive number of seconds or None, "
                    f"got {value!r}."
                )
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=collective_timeout
        )

        try:
            with compat.tf_collective_health_timeout(cluster_wait_timeout):
                return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except RuntimeError as e:
            if "program startup" in str(e):
                raise TrainingConfigError(
                    "multi_worker: TensorFlow's runtime started before the strategy was made "
                    f"(something ran an op or listed logical devices first): {e}"
                ) from None
            raise TrainingConfigError(
                f"multi_worker: not all workers of TF_CONFIG joined within "
                f"{cluster_wait_timeout} s ({e})."
            ) from None
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_name)
    if tpu_name not in ("local",):
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy):
    """True on the worker that writes checkpoints, logs and plots."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or type(strategy).__name__.startswith("TPU"):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        return True
    if task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and "chief" not in cluster
