"""Router metrics in `fit`'s history and at call time, shared by the TensorFlow
tests and the JAX-backend script (the backend is fixed per process)."""

import keras
import numpy as np

import keras_moe


class MixinModel(keras_moe.RouterMetricsMixin, keras.Model):
    def __init__(self):
        super().__init__()
        self.moe = keras_moe.SwitchFeedForward(
            num_experts=4,
            d_ff=32,
            name="moe",
            seed=1,
            train_capacity_factor=0.5,
            min_expert_capacity=1,
        )
        self.head = keras.layers.Dense(1)

    def call(self, x, training=None):
        return self.head(x + self.moe(x, training=training))


def check_fit_history_matches_the_layer_statistics(rng):
    """One full batch with learning rate 0: the logged statistics are the layer's own
    `return_metrics=True` statistics for that batch (training capacity)."""
    x = rng.normal(size=(8, 8, 16)).astype("float32")
    y = np.tanh(x.sum(-1, keepdims=True)).astype("float32")
    keras.utils.set_random_seed(0)
    model = MixinModel()
    model.compile(keras.optimizers.SGD(0.0), "mse")
    history = model.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0).history
    outputs, stats = model.moe(x, training=True, return_metrics=True)
    np.testing.assert_allclose(
        np.asarray(outputs), np.asarray(model.moe(x, training=True)), rtol=1e-6
    )
    assert 0.0 < float(stats["dropped_fraction"]) < 1.0  # capacity 0.5 drops some
    for name in (
        "dropped_fraction",
        "router_entropy",
        "load_imbalance",
        "aux_loss",
        "router_confidence",
    ):
        np.testing.assert_allclose(
            history[f"moe/{name}"], [float(stats[name])] * 2, rtol=1e-5, err_msg=name
        )
    evaluated = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    np.testing.assert_allclose(
        evaluated["moe/router_entropy"], float(stats["router_entropy"]), rtol=1e-5
    )


def check_encoder_decoder_logs_router_metrics():
    from tests.models.helpers import compiled_tiny_switch_and_batch

    model, x = compiled_tiny_switch_and_batch(rows=4)
    history = model.fit(x, epochs=1, batch_size=4, verbose=0).history
    keys = [k for k in history if k.endswith("/ffn/dropped_fraction")]
    sparse = [layer for layer in model.encoder_layers + model.decoder_layers if layer.is_sparse]
    assert len(keys) == len(sparse) > 0, sorted(history)
    assert all(0.0 <= history[k][0] <= 1.0 for k in keys)
    assert all(history[k.replace("dropped_fraction", "router_entropy")][0] > 0 for k in keys)


def _plain_models():
    """The same MoE model as users build it without the mixin: functional (README quick
    start 1), Sequential and subclassed; and functional from a class with the mixin."""

    def layer():
        return keras_moe.SwitchFeedForward(
            num_experts=4,
            d_ff=32,
            name="moe",
            seed=1,
            train_capacity_factor=0.5,
            min_expert_capacity=1,
        )

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.moe = layer()

        def call(self, x, training=None):
            return x + self.moe(x, training=training)

    class MixinFunctional(keras_moe.RouterMetricsMixin, keras.Model):
        pass

    def functional(model_class):
        inputs = keras.Input((8, 16))
        moe = layer()
        return model_class(inputs, keras.layers.Add()([inputs, moe(inputs)])), moe

    sequential = keras.Sequential([keras.Input((8, 16)), layer()])
    subclassed = Subclassed()
    return {
        "functional": (*functional(keras.Model), False),
        "sequential": (sequential, sequential.layers[0], False),
        "subclassed": (subclassed, subclassed.moe, False),
        "mixin functional": (*functional(MixinFunctional), True),
    }


def check_router_metrics_are_measured_or_absent(rng):
    """In every kind of model the router metrics in `fit`'s and `evaluate`'s logs are the
    layer's statistics of the batch (learning rate 0), or, where the backend cannot
    measure them (JAX without the mixin), absent with one warning naming the mixin:
    never a number that was not measured."""
    import warnings

    x = rng.normal(size=(8, 8, 16)).astype("float32")
    measurable_in_call = keras.backend.backend() == "tensorflow"
    for kind, (model, moe, has_mixin) in _plain_models().items():
        model.compile(keras.optimizers.SGD(0.0), "mse")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(x, x, epochs=1, batch_size=8, shuffle=False, verbose=0).history
            evaluated = model.evaluate(x, x, batch_size=8, verbose=0, return_dict=True)
        mixin_warnings = [w for w in caught if "RouterMetricsMixin" in str(w.message)]
        keys = {k for k in list(history) + list(evaluated) if k.startswith("moe/")}
        if measurable_in_call or has_mixin:
            assert not mixin_warnings, (kind, mixin_warnings)
            _, stats = moe(x, training=True, return_metrics=True)
            _, eval_stats = moe(x, training=False, return_metrics=True)
            for name in ("dropped_fraction", "router_entropy", "load_imbalance", "aux_loss"):
                np.testing.assert_allclose(
                    history[f"moe/{name}"][0], float(stats[name]), rtol=1e-5, err_msg=(kind, name)
                )
                np.testing.assert_allclose(
                    evaluated[f"moe/{name}"],
                    float(eval_stats[name]),
                    rtol=1e-5,
                    err_msg=(kind, name),
                )
        else:
            assert keys == set(), (kind, sorted(keys))
            assert len(mixin_warnings) == 1, (kind, [str(w.message) for w in caught])
            assert "left out of the logs" in str(mixin_warnings[0].message)
