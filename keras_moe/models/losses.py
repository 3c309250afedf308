"""T5-style training loss and metrics for `EncoderDecoder`.

Loss: token cross-entropy weighted by `decoder_loss_weights` and divided by
the sum of the weights (Keras' `reduction="mean_with_sample_weight"`), plus
the MoE aux / z losses that the layers add to `model.losses` (Keras adds
those automatically).
"""

import keras
from keras import ops


def token_cross_entropy():
    """Sparse cross-entropy on logits, normalised by the sum of the loss weights.

    Example:
    >>> loss = token_cross_entropy()
    >>> loss(np.array([[1, 2]]), np.zeros((1, 2, 5)), sample_weight=np.array([[1., 0.]]))
    """
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="token_cross_entropy")


@keras.saving.register_keras_serializable(package="keras_moe")
class NegLogPerplexity(keras.metrics.Mean):
    """Weighted mean of the target tokens' log-probability (T5X `neg_log_perplexity`).

    Example:
    >>> m = NegLogPerplexity()
    >>> m.update_state(np.array([[1]]), np.zeros((1, 1, 4)))
    """

    def __init__(self, name="neg_log_perplexity", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = -keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        return super().update_state(values, sample_weight=sample_weight)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def compile_defaults(learning_rate=1e-3, optimizer=None, jit_compile=False):
    """`model.compile(**compile_defaults())`: Adafactor, T5 loss, weighted metrics.

    Accuracy and negative log perplexity are weighted by the loss weights
    (`weighted_metrics`), so padding does not count.

    Args:
        learning_rate: Adafactor learning rate (ignored if `optimizer` is given).
        optimizer: any Keras optimizer.
        jit_compile: XLA for the train step. Off by default: on CPU, TF's XLA
            compile of an MoE step is very slow (see STACK_FACTS); turn it on
            for TPU.

    Example:
    >>> model.compile(**compile_defaults(learning_rate=1e-2))
    """
    if optimizer is None:
        optimizer = keras.optimizers.Adafactor(learning_rate=learning_rate)
    return dict(
        optimizer=optimizer,
        loss=token_cross_entropy(),
        jit_compile=jit_compile,
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                          NegLogPerplexity()],
    )
