"""The compiled search against the eager float64 reference loop of `decoding.generate`."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_moe.models import EncoderDecoder
from keras_moe.models.decoding import generate
from tests.models.helpers import tiny_switch_config

EOS = 1
INPUTS = np.array([[5, 6, 7, 1, 0, 0, 0], [2, 3, 1, 0, 0, 0, 0], [7, 7, 7, 7, 7, 7, 1],
                   [4, 1, 0, 0, 0, 0, 0], [3, 5, 2, 6, 1, 0, 0], [6, 2, 4, 3, 5, 1, 0]], "int32")
# Raising EOS's logit by these amounts makes the random 8-token model end rows at
# different steps, early, late or never (a variable: the compiled search reads it).
EOS_BOOSTS = (0.0, 0.5, 2.5)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, min_expert_capacity=32))
    model.eos_boost = keras.Variable(np.zeros(8, "float32"), trainable=False)
    original = model.logits
    model.logits = lambda x: original(x) + model.eos_boost
    return model


def _boost(model, amount):
    model.eos_boost.assign(np.eye(8, dtype="float32")[EOS] * amount)


@pytest.mark.parametrize("method, length_penalty", [("greedy", 0.0), ("beam", 0.0),
                                                    ("beam", 0.8)])
def test_compiled_search_equals_the_eager_reference(model, method, length_penalty):
    kwargs = dict(max_length=10, method=method, num_beams=3, length_penalty=length_penalty,
                  return_scores=True)
    end_steps = set()
    for amount in EOS_BOOSTS:
        _boost(model, amount)
        reference, reference_scores = generate(model, INPUTS, compiled=False, **kwargs)
        tokens, scores = generate(model, INPUTS, **kwargs)
        np.testing.assert_array_equal(tokens, reference, err_msg=f"EOS boost {amount}")
        np.testing.assert_allclose(scores, reference_scores, rtol=1e-5)
        ended = (reference == EOS).any(axis=1)
        first = np.where(ended, (reference == EOS).argmax(axis=1), 10)
        end_steps.update(first.tolist())
        for row in np.where(ended)[0]:  # padding follows EOS
            assert (reference[row, first[row] + 1:] == 0).all()
    _boost(model, 0.0)
    # The sweep exercised EOS: rows ended at the first step, later, and never.
    assert 0 in end_steps and 10 in end_steps and end_steps - {0, 10}, end_steps


def test_xla_gives_the_same_tokens(model):
    # (Cached == uncached is checked in test_model.py on a model that never
    # produces id 0 before EOS: the uncached pass masks such a token as padding.)
    for amount in EOS_BOOSTS:
        _boost(model, amount)
        reference = generate(model, INPUTS, max_length=10, method="beam", num_beams=3,
                             compiled=False)
        xla = generate(model, INPUTS, max_length=10, method="beam", num_beams=3,
                       jit_compile=True)
        np.testing.assert_array_equal(xla, reference, err_msg=f"EOS boost {amount}")
    _boost(model, 0.0)


def test_search_stops_when_every_row_has_finished():
    keras.utils.set_random_seed(0)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8))
    eos_bias = np.zeros(8, "float32")
    eos_bias[EOS] = 1e4
    original = model.logits
    model.logits = lambda x: original(x) + eos_bias  # every beam emits EOS first
    greedy = generate(model, INPUTS, max_length=10)
    assert greedy.shape == (6, 1) and (greedy == EOS).all()
    # Step 0 extends only beam 0: with EOS and one other token; that second
    # beam emits EOS at step 1, and the loop stops after it.
    beam = generate(model, INPUTS, max_length=10, method="beam", num_beams=2)
    np.testing.assert_array_equal(beam, np.tile([[EOS, 0]], (6, 1)))


def test_compiled_search_reads_the_current_weights():
    keras.utils.set_random_seed(5)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, min_expert_capacity=32))
    before = generate(model, INPUTS, max_length=8)  # traces the function
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.5, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    after = generate(model, INPUTS, max_length=8)
    np.testing.assert_array_equal(after, generate(model, INPUTS, max_length=8, compiled=False))
    assert not np.array_equal(before, after)


def test_decoding_adds_no_losses_and_no_router_statistics():
    keras.utils.set_random_seed(2)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, track_router_metrics=True))
    generate(model, INPUTS, max_length=6, method="beam", num_beams=2)
    assert model.losses == []
    trackers = [t for layer in model.encoder_layers + model.decoder_layers if layer.is_sparse
                for t in layer.ffn._trackers.values()]
    counts = [float(ops.convert_to_numpy(t.count)) for t in trackers]
    assert counts and not any(counts), counts


def test_compiled_search_rejects_bad_arguments(model):
    from keras_moe.models.search import compiled_search

    with pytest.raises(ValueError, match="`max_length`"):
        compiled_search(model, max_length=0)
    with pytest.raises(ValueError, match="`num_beams`"):
        compiled_search(model, max_length=4, num_beams=2.5)


def test_a_model_that_decoded_can_be_garbage_collected():
    import gc
    import weakref

    decoded = EncoderDecoder(tiny_switch_config(vocab_size=8))
    generate(decoded, INPUTS, max_length=2, method="beam", num_beams=2)
    alive = weakref.ref(decoded)
    del decoded
    gc.collect()
    assert alive() is None
