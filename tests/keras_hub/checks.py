"""Checks of `keras_moe.sparsify` on keras-hub models, run on the backend of the process:
by tests/keras_hub/test_sparsify.py on TensorFlow, and by jax_checks.py on JAX."""

import os

import keras
import keras_hub
import numpy as np

import keras_moe
from keras_moe.keras_hub import is_sparse
from tests.keras_hub.hf_checkpoints import VOCAB

TOL = 1e-5  # float32, relative to the logits' scale


def batch(seed=0, lengths=(9, 6)):
    """Token ids and a padding mask: one full sequence and one padded at its end."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = rng.integers(1, VOCAB, size=(len(lengths), width)).astype("int32")
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype("int32")
    return {"token_ids": ids * mask, "padding_mask": mask}


def hf_logits(folder, inputs):
    """HF torch's logits for `inputs`, each sequence alone (no padding involved)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    rows = []
    for ids, mask in zip(inputs["token_ids"], inputs["padding_mask"], strict=True):
        with torch.no_grad():
            logits = model(torch.tensor(ids[mask > 0][None].astype("int64"))).logits[0].numpy()
        rows.append(logits)
    return rows


def load(folder, sparse=True, **options):
    return keras_moe.from_preset(
        folder, keras_hub.models.CausalLM, preprocessor=None, sparse=sparse, **options
    )


def logits(model, inputs, training=False):
    return np.asarray(keras.ops.convert_to_numpy(model(inputs, training=training)))


def assert_close(got, want, what):
    scale = float(np.max(np.abs(want)))
    error = float(np.max(np.abs(got - want)))
    assert error <= TOL * scale, f"{what}: largest difference {error:.3g} at scale {scale:.3g}"


def check_logits(folder):
    """Sparse logits equal keras-hub's dense model's and HF torch's on the real tokens."""
    inputs = batch()
    dense = load(folder, sparse=False)
    sparse = load(folder)
    assert is_sparse(sparse) and not is_sparse(dense)
    assert isinstance(sparse, type(dense)), (type(sparse), type(dense))
    got, want = logits(sparse, inputs), logits(dense, inputs)
    for row, (mask, reference) in enumerate(
        zip(inputs["padding_mask"], hf_logits(folder, inputs), strict=True)
    ):
        real = mask > 0
        assert_close(got[row][real], want[row][real], f"sequence {row} vs keras-hub")
        assert_close(got[row][real], reference, f"sequence {row} vs HF torch")


def greedy_tokens(model, prompt, length):
    model.compile(sampler="greedy")
    width = len(prompt) + length
    ids = np.zeros((1, width), "int32")
    ids[0, : len(prompt)] = prompt
    mask = np.zeros((1, width), "int32")
    mask[0, : len(prompt)] = 1
    out = model.generate({"token_ids": ids, "padding_mask": mask}, stop_token_ids=None)
    return np.asarray(out["token_ids"])[0, len(prompt) :].tolist()


def hf_greedy_tokens(folder, prompt, length):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=length,
        min_new_tokens=length,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def check_greedy_generate(folder, length=6):
    """Greedy tokens of the sparse model equal keras-hub's dense model's and HF's."""
    prompt = batch()["token_ids"][0][:5].tolist()
    got = greedy_tokens(load(folder), prompt, length)
    assert got == greedy_tokens(load(folder, sparse=False), prompt, length), got
    assert got == hf_greedy_tokens(folder, prompt, length), got


def training_losses(model, inputs):
    model(inputs, training=True)
    return sorted(float(keras.ops.convert_to_numpy(x)) for x in model.losses)


def check_training_losses_and_metrics(folder):
    """A training call adds keras-hub's per-layer balance losses, without the padding;
    `fit` logs router metrics."""
    dense, sparse = load(folder, sparse=False), load(folder)
    unpadded = batch(seed=1, lengths=(9, 9))
    want, got = training_losses(dense, unpadded), training_losses(sparse, unpadded)
    assert len(got) == len(want), (got, want)
    if want:  # gpt-oss's keras-hub block has no balance loss: neither has the sparse one
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Padding takes no part (keras-hub's Qwen blocks count padded tokens too).
    inputs = batch(seed=1)
    wider = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in inputs.items()}
    np.testing.assert_allclose(
        training_losses(sparse, wider), training_losses(sparse, inputs), rtol=1e-6
    )
    sparse(inputs)
    assert not sparse.losses  # inference adds none, as keras-hub's blocks
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sparse.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss, sampler="greedy")
    x = {k: v[:, :-1] for k, v in inputs.items()}
    y = inputs["token_ids"][:, 1:]
    history = sparse.fit(x, y, sample_weight=inputs["padding_mask"][:, 1:], epochs=1, verbose=0)
    logs = history.history
    dropped = [key for key in logs if key.endswith("/dropped_fraction")]
    assert len(dropped) == 2, sorted(logs)  # one per MoE layer
    assert all(logs[key] == [0.0] for key in dropped)  # dropless
    # Measured, not a placeholder: 15 tokens cannot load a random router evenly.
    assert all(logs[key.replace("dropped_fraction", "max_violation")][0] > 0 for key in dropped)


def check_save_and_load(folder, directory):
    """A `.keras` round trip gives the sparse model back, with the same logits."""
    inputs = batch()
    model = load(folder)
    want = logits(model, inputs)
    path = os.path.join(directory, "sparse.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model) and is_sparse(loaded)
    np.testing.assert_array_equal(logits(loaded, inputs), want)
