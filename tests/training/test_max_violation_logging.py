"""MaxVio reaches TensorBoard, the console table and the expert-load plot."""

import glob
import io

import keras
import numpy as np
import tensorflow as tf

import keras_moe
from keras_moe.training.run import expert_load
from keras_moe.training.run.fit_callbacks import TrainingLogger


class _Model(keras_moe.RouterMetricsMixin, keras.Model):
    def __init__(self):
        super().__init__(name="model")
        self.moe = keras_moe.TopKFeedForward(8, 8, k=3, name="moe")

    def call(self, x, training=None):
        return x + self.moe(x, training=training)


def _tags(log_dir):
    tags = {}
    for path in glob.glob(f"{log_dir}/train/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags[value.tag] = float(tf.make_ndarray(value.tensor))
    return tags


def test_max_violation_is_logged_per_layer(tmp_path, rng):
    model = _Model()
    model.compile("adam", "mse")
    x = rng.normal(size=(8, 6, 16)).astype("float32")
    stream = io.StringIO()
    logger = TrainingLogger(
        str(tmp_path),
        tokens_per_step=48,
        log_every=2,
        probe_batch=x[:4],
        expert_load_every=2,
        stream=stream,
    )
    model.fit(x, x, batch_size=4, epochs=1, callbacks=[logger], verbose=0)
    tags = _tags(tmp_path)
    path = next(iter(expert_load.moe_layers(model)))
    logged = tags[f"moe/{path}/max_violation"]
    assert logged >= 0.0
    loads = expert_load.measure_expert_load(model, [x[:4]])[path]
    # 4 sequences x 6 tokens x 3 choices over 8 experts: MaxVio is max load / mean - 1
    np.testing.assert_allclose(
        tags[f"moe/{path}/expert_load/max_violation"], 8 * loads.max() - 1.0, rtol=1e-5
    )
    assert "MaxVio" in stream.getvalue()
