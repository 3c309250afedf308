"""A timing server for TF Model Garden's MoeLayer, run inside its own virtual environment.

TF Model Garden needs tf-keras (Keras 2) and its own TensorFlow, which cannot
share an environment with Keras 3; `peers.py` starts this script with that
environment's Python and asks it, one line at a time, to time one step, so
that its timings interleave with the in-process ones.

Protocol: the first stdin line is a JSON config; each later line "step"
answers with the seconds one forward+backward step took.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from official.nlp.modeling.layers import moe


def main():
    config = json.loads(sys.stdin.readline())
    tokens, seq_len = config["tokens"], config["seq_len"]
    d_model, d_ff, num_experts = config["d_model"], config["d_ff"], config["num_experts"]
    layer = moe.MoeLayer(
        moe.FeedForwardExperts(num_experts, d_ff, activation=tf.nn.relu),
        moe.ExpertsChooseMaskedRouter(num_experts, export_metrics=False),
        train_capacity_factor=config["capacity_factor"],
        examples_per_group=1.0,
    )
    x = tf.constant(
        np.random.default_rng(0)
        .normal(size=(tokens // seq_len, seq_len, d_model))
        .astype("float32")
    )

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
            loss = tf.reduce_mean(tf.square(y))
            if layer.losses:
                loss += tf.add_n(layer.losses)
        return tape.gradient(loss, layer.trainable_weights)

    [g.numpy() for g in step()]
    print(json.dumps({"ready": True, "tensorflow": tf.__version__}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        start = time.perf_counter()
        [g.numpy() for g in step()]
        print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
    main()
