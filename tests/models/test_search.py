"""The compiled search against the eager float64 reference loop of `decoding.generate`."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_moe.models import EncoderDecoder
from keras_moe.models.decoding import generate
from tests.models.helpers import tiny_config, tiny_switch_config

EOS = 1
INPUTS = np.array(
    [
        [5, 6, 7, 1, 0, 0, 0],
        [2, 3, 1, 0, 0, 0, 0],
        [7, 7, 7, 7, 7, 7, 1],
        [4, 1, 0, 0, 0, 0, 0],
        [3, 5, 2, 6, 1, 0, 0],
        [6, 2, 4, 3, 5, 1, 0],
    ],
    "int32",
)
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


@pytest.mark.parametrize(
    "method, length_penalty, normalizer",
    [("greedy", 0.0, "gnmt"), ("beam", 0.0, "gnmt"), ("beam", 0.8, "gnmt"), ("beam", 0.8, "hf")],
)
def test_compiled_search_equals_the_eager_reference(model, method, length_penalty, normalizer):
    kwargs = dict(
        max_length=10,
        method=method,
        num_beams=3,
        length_penalty=length_penalty,
        length_normalizer=normalizer,
        return_scores=True,
    )
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
            assert (reference[row, first[row] + 1 :] == 0).all()
    _boost(model, 0.0)
    # The sweep exercised EOS: rows ended at the first step (except with "hf", whose
    # len ** 0.8 ranks a lone EOS below every longer output here), later, and never.
    assert 0 in end_steps or normalizer == "hf", end_steps
    assert 10 in end_steps and end_steps - {0, 10}, end_steps


def test_xla_gives_the_same_tokens(model):
    # (Cached == uncached is checked in test_model.py on a model that never
    # produces id 0 before EOS: the uncached pass masks such a token as padding.)
    for amount in EOS_BOOSTS:
        _boost(model, amount)
        reference = generate(
            model, INPUTS, max_length=10, method="beam", num_beams=3, compiled=False
        )
        xla = generate(model, INPUTS, max_length=10, method="beam", num_beams=3, jit_compile=True)
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
    # Step 0 finishes EOS and keeps two live beams; both emit EOS at step 1, which
    # fills the finished set with hypotheses no live one can beat: the loop stops.
    beam = generate(model, INPUTS, max_length=10, method="beam", num_beams=2)
    np.testing.assert_array_equal(beam, np.tile([[EOS, 0]], (6, 1)))


def test_compiled_search_reads_the_current_weights():
    keras.utils.set_random_seed(5)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, min_expert_capacity=32))
    before = generate(model, INPUTS, max_length=8)  # traces the function
    rng = np.random.default_rng(0)
    model.set_weights(
        [w + rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    after = generate(model, INPUTS, max_length=8)
    np.testing.assert_array_equal(after, generate(model, INPUTS, max_length=8, compiled=False))
    assert not np.array_equal(before, after)


def test_decoding_adds_no_losses_and_no_router_statistics():
    keras.utils.set_random_seed(2)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, track_router_metrics=True))
    generate(model, INPUTS, max_length=6, method="beam", num_beams=2)
    assert model.losses == []
    trackers = [
        t
        for layer in model.encoder_layers + model.decoder_layers
        if layer.is_sparse
        for t in layer.ffn._trackers.values()
    ]
    counts = [float(ops.convert_to_numpy(t.count)) for t in trackers]
    assert counts and not any(counts), counts


def test_compiled_search_rejects_bad_arguments(model):
    from keras_moe.models.search import compiled_search

    with pytest.raises(ValueError, match="`max_length`"):
        compiled_search(model, max_length=0)
    with pytest.raises(ValueError, match="`num_beams`"):
        compiled_search(model, max_length=4, num_beams=2.5)
    with pytest.raises(ValueError, match=r"`length_normalizer` must be one of \('gnmt', 'hf'\)"):
        compiled_search(model, max_length=4, num_beams=2, length_normalizer="HF")
    for compiled in (True, False):
        with pytest.raises(ValueError, match="`length_normalizer`.*got 't5x'"):
            generate(
                model,
                INPUTS,
                max_length=4,
                method="beam",
                num_beams=2,
                length_normalizer="t5x",
                compiled=compiled,
            )


def test_a_model_that_decoded_can_be_garbage_collected():
    import gc
    import weakref

    decoded = EncoderDecoder(tiny_switch_config(vocab_size=8))
    generate(decoded, INPUTS, max_length=2, method="beam", num_beams=2)
    alive = weakref.ref(decoded)
    del decoded
    gc.collect()
    assert alive() is None


# A Markov chain over 8 tokens (0 pad, 1 EOS, 2 A, 3 B, 4 C, 5-7 X Y Z) standing in
# for the decoder: the next token's probabilities depend on the last token only.
CHAIN = {
    0: {2: 0.45, 1: 0.30, 3: 0.25},  # start: A, EOS, B
    2: {5: 0.34, 6: 0.33, 7: 0.33},  # A: X, Y or Z, never EOS
    3: {4: 1.0},  # B -> C
    4: {1: 1.0},  # C -> EOS
    5: {5: 0.34, 6: 0.33, 7: 0.33},
    6: {5: 0.34, 6: 0.33, 7: 0.33},
    7: {5: 0.34, 6: 0.33, 7: 0.33},
    1: {1: 1.0},
}


def _chain_model(chain=CHAIN):
    keras.utils.set_random_seed(0)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8))
    table = np.full((8, 8), 1e-9)
    for last, nxt in chain.items():
        for token, p in nxt.items():
            table[last, token] = p
    logits = ops.convert_to_tensor(np.log(table).astype("float32"))
    model.decode_step = lambda tokens, index, caches, mask: (
        ops.take(logits, ops.cast(tokens, "int32"), axis=0),
        caches,
    )
    return model


@pytest.mark.parametrize("compiled", [True, False])
def test_finished_hypotheses_do_not_take_live_beams(compiled):
    """Two beams, GNMT length penalty 1: ((5 + len) / 6) normalises the scores.
    Step 0 ranks A (.45), EOS (.30), B (.25): EOS finishes, A and B stay live.
    B C EOS scores log .25 = -1.386, normalised -1.386 / (8/6) = -1.040, which
    beats EOS's -1.204 / 1; A's paths lose 1.1 a step. Had the finished EOS kept
    a beam, B would have been pruned at step 0 and the answer would be EOS."""
    model = _chain_model()
    tokens, scores = generate(
        model,
        np.array([[5, 1]]),
        max_length=6,
        method="beam",
        num_beams=2,
        length_penalty=1.0,
        compiled=compiled,
        return_scores=True,
    )
    np.testing.assert_array_equal(tokens[0, :3], [3, 4, EOS])
    assert (tokens[0, 3:] == 0).all()
    np.testing.assert_allclose(scores, [np.log(0.25)], rtol=1e-5)


def test_each_input_is_encoded_once():
    keras.utils.set_random_seed(4)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8))
    shapes = []
    encode = model.encode
    model.encode = lambda tokens, **kw: shapes.append(tuple(tokens.shape)) or encode(tokens, **kw)
    for compiled in (True, False):
        generate(model, INPUTS, max_length=4, method="beam", num_beams=3, compiled=compiled)
    # [B, L], not [B * beams, L] (the compiled trace sees an unknown batch size;
    # test_an_input_decodes_the_same_alone_or_in_a_batch covers it)
    assert shapes == [(None, INPUTS.shape[1]), INPUTS.shape], shapes


def _crowded_model():
    """MoE in every layer, one group for the whole batch and one slot per expert:
    what one input gets depends on the rest of its batch unless routed alone."""
    keras.utils.set_random_seed(6)
    return EncoderDecoder(
        tiny_switch_config(
            vocab_size=8,
            encoder_sparse_step=1,
            eval_capacity_factor=0.25,
            min_expert_capacity=1,
            group_size="batch",
        )
    )


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_an_input_decodes_the_same_alone_or_in_a_batch(method):
    model = _crowded_model()
    kwargs = dict(max_length=6, method=method, num_beams=3, return_scores=True)
    together = generate(model, INPUTS, **kwargs)
    for row in (0, 3):
        alone = generate(model, INPUTS[row : row + 1], **kwargs)
        np.testing.assert_array_equal(alone[0][0], together[0][row][: alone[0].shape[1]])
        np.testing.assert_allclose(alone[1][0], together[1][row], rtol=1e-5)
        # One input is one batch group: its beams share one encoding, so the
        # layers' own grouping gives the same result (beam copies would compete).
        own_grouping = generate(model, INPUTS[row : row + 1], independent_routing=False, **kwargs)
        np.testing.assert_allclose(own_grouping[1], alone[1], rtol=1e-5)
    # The layers' own batch grouping does mix them (what the default avoids).
    mixed = generate(model, INPUTS, independent_routing=False, **kwargs)
    assert not np.allclose(mixed[1], together[1], rtol=1e-5)


def test_any_batch_size_reuses_one_trace_per_input_length():
    keras.utils.set_random_seed(7)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8))
    from keras_moe.models.search import compiled_search

    run = compiled_search(model, max_length=3)
    for batch in (1, 4, 6, 2):
        run(INPUTS[:batch])
    traces = [
        cell.cell_contents for cell in run.__closure__ if isinstance(cell.cell_contents, dict)
    ][0]
    assert list(traces) == [INPUTS.shape[1]]
    assert traces[INPUTS.shape[1]].experimental_get_tracing_count() == 1


def test_num_beams_above_half_the_vocabulary_is_refused(model):
    with pytest.raises(ValueError, match="`num_beams`.*vocab_size=8"):
        generate(model, INPUTS, max_length=4, method="beam", num_beams=5)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_an_input_decodes_the_same_beside_a_longer_input(method):
    """The layers' defaults (8 experts, eval capacity factor 2, at least 4 slots): a 20-token
    input padded to a 64-token neighbour's width must not get the capacity of 64 tokens."""
    keras.utils.set_random_seed(11)
    model = EncoderDecoder(
        tiny_config(
            vocab_size=40,
            moe_type="switch",
            num_experts=8,
            encoder_sparse_step=1,
            decoder_sparse_step=1,
        )
    )
    rng = np.random.default_rng(5)
    short = np.r_[rng.integers(2, 40, size=19), EOS].astype("int32")[None]
    longer = np.r_[rng.integers(2, 40, size=63), EOS].astype("int32")[None]
    padded = np.pad(short, ((0, 0), (0, 44)))
    kwargs = dict(max_length=8, method=method, num_beams=4, return_scores=True)
    alone_tokens, alone_scores = generate(model, short, **kwargs)
    for batch in (padded, np.concatenate([padded, longer])):
        tokens, scores = generate(model, batch, **kwargs)
        np.testing.assert_array_equal(tokens[0][: alone_tokens.shape[1]], alone_tokens[0])
        np.testing.assert_allclose(scores[0], alone_scores[0], rtol=1e-5)


# Start: EOS (.5), B (.3) or A (.2); B -> EOS; A -> A for ever.
LONG_CHAIN = {
    0: {1: 0.5, 3: 0.3, 2: 0.2},
    3: {1: 1.0},
    2: {2: 1.0},
    **{t: {1: 1.0} for t in (1, 4, 5, 6, 7)},
}


@pytest.mark.parametrize("compiled", [True, False])
def test_each_length_normalizer_ranks_and_stops_as_its_library(compiled):
    """Two beams, length_penalty 1. Step 0 finishes EOS (log .5 = -0.693); step 1
    finishes B EOS (log .3 = -1.204, 2 tokens) and leaves A A (log .2 = -1.609) live.
    "gnmt": B EOS ranks -1.204 / (7/6) = -1.032 and A^6 -1.609 / (11/6) = -0.878,
    so EOS (-0.693) wins. "hf": B EOS ranks -0.602; A A at its current length,
    -1.609 / 2 = -0.805, cannot beat the worst finished (-0.693), so the input is
    done, as HF's default early stopping has it, and B EOS wins, although A^6 would
    have ranked -1.609 / 6 = -0.268. One model, so the compiled functions are
    cached apart per normaliser."""
    model = _chain_model(LONG_CHAIN)
    want = {"gnmt": ([EOS], np.log(0.5)), "hf": ([3, EOS], np.log(0.3))}
    for normalizer, (tokens_want, score_want) in want.items():
        tokens, scores = generate(
            model,
            np.array([[5, 1]]),
            max_length=6,
            method="beam",
            num_beams=2,
            length_penalty=1.0,
            compiled=compiled,
            length_normalizer=normalizer,
            return_scores=True,
        )
        np.testing.assert_array_equal(
            tokens[0, : len(tokens_want)], tokens_want, err_msg=normalizer
        )
        assert (tokens[0, len(tokens_want) :] == 0).all(), (normalizer, tokens)
        np.testing.assert_allclose(scores, [score_want], rtol=1e-5, err_msg=normalizer)


@pytest.mark.parametrize("compiled", [True, False])
def test_generate_refuses_ids_outside_the_vocabulary_naming_the_id(model, compiled):
    bad = INPUTS.copy()
    bad[1, 2] = model.config.vocab_size + 3
    message = (
        rf"token id {model.config.vocab_size + 3} \(at \[1, 2\]\).*"
        rf"vocab_size={model.config.vocab_size}"
    )
    with pytest.raises(ValueError, match=message):
        model.generate(bad, max_length=4, compiled=compiled)
    with pytest.raises(ValueError, match=r"token id -1 \(at \[0, 0\]\)"):
        model.generate(np.where(INPUTS == 5, -1, INPUTS), max_length=4, compiled=compiled)


class Letters:
    """A vocabulary of the 8-token model: letters a-f are ids 2-7 (0 pad, 1 EOS)."""

    def encode(self, text):
        return [ord(c) - ord("a") + 2 for c in text]

    def decode(self, ids):
        return "".join(chr(i - 2 + ord("a")) for i in ids if i >= 2)


@pytest.mark.parametrize("text", [["abc"], "abc", np.array(["ab", "c"])])
def test_generate_given_text_without_a_vocabulary_names_the_argument(model, text):
    with pytest.raises(ValueError, match=r"got text.*vocabulary=keras_moe.tasks.get_vocabulary"):
        model.generate(text, max_length=4)


def test_generate_text_to_text_is_the_token_path_encoded_and_decoded_by_hand(model):
    texts = ["abc", "fed", "a"]
    ids = np.zeros((3, 4), "int32")  # each text's ids, then EOS, 0-padded (by hand)
    ids[0, :4] = [2, 3, 4, EOS]
    ids[1, :4] = [7, 6, 5, EOS]
    ids[2, :2] = [2, EOS]
    for kwargs in ({}, {"beam_size": 3}):
        tokens = model.generate(ids, max_length=6, **kwargs)
        expected = []
        for row in tokens.tolist():
            row = row[: row.index(EOS)] if EOS in row else row
            expected.append("".join(chr(i - 2 + ord("a")) for i in row if i >= 2))
        assert model.generate(texts, max_length=6, vocabulary=Letters(), **kwargs) == expected
        assert model.generate("fed", max_length=6, vocabulary=Letters(), **kwargs) == expected[1]


def test_generate_with_the_tasks_sentencepiece_vocabulary_round_trips_text():
    from keras_moe import tasks
    from keras_moe.models import T5Config

    vocab = tasks.get_vocabulary()
    keras.utils.set_random_seed(0)
    model = EncoderDecoder(
        T5Config(
            vocab_size=vocab.vocab_size,
            d_model=16,
            num_heads=2,
            d_kv=8,
            d_ff=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
        )
    )
    ids = np.array([vocab.encode("In the beginning") + [EOS]], "int32")
    tokens = model.generate(ids, max_length=5)[0].tolist()
    tokens = tokens[: tokens.index(EOS)] if EOS in tokens else tokens
    assert model.generate(["In the beginning"], max_length=5, vocabulary=vocab) == [
        vocab.decode(tokens)
    ]


def test_generate_takes_the_clis_beam_size(model):
    beam = model.generate(INPUTS, max_length=6, method="beam", num_beams=3)
    np.testing.assert_array_equal(model.generate(INPUTS, max_length=6, beam_size=3), beam)
    np.testing.assert_array_equal(
        model.generate(INPUTS, max_length=6, beam_size=1),
        model.generate(INPUTS, max_length=6, method="greedy"),
    )
    with pytest.raises(
        ValueError,
        match=r"`beam_size=3` asks for beam search but "
        r"`method='greedy'`",
    ):
        model.generate(INPUTS, max_length=6, method="greedy", beam_size=3)
    with pytest.raises(ValueError, match=r"`beam_size=3` and `num_beams=2` disagree"):
        model.generate(INPUTS, max_length=6, beam_size=3, num_beams=2)


def test_generate_refuses_a_single_unbatched_sequence(model):
    with pytest.raises(ValueError, match=r"\[batch, length\], got shape \(4,\).*ids\[None\]"):
        model.generate(np.array([5, 6, 7, 1]), max_length=4)
