"""Greedy and beam search for `EncoderDecoder` as one compiled loop.

The whole search is one `keras.ops.while_loop` over static shapes: the
self-attention key/value cache holds `max_length` slots written by slice
update, the output buffers hold `max_length` tokens, and the loop stops early
once no example can change its result. No value goes back to the host per
token, so the search runs as one `tf.function` on TensorFlow (optionally
XLA-compiled) and as one `jax.jit` on JAX. Its tokens equal
`keras_moe.models.decoding`'s eager float64 reference loop and HF
`generate(num_beams=...)` (same candidate order: ties go to the lower beam,
then the lower token id; with a length penalty, HF's tokens need
`length_normalizer="hf"`: the default, "gnmt", ranks as T5X does).

Each input is encoded once; its beams share the encoder outputs. Routing is
independent per input by default (`independent_routing`, an argument of the
call, not a process-wide mode): an
input's output does not depend on what else is in the batch. MoE layers see
one token per sequence at each decoding step and route each token alone, so
nothing is dropped while decoding. A teacher-forced pass over the same tokens
gives the same logits only when it drops nothing either (an
`eval_capacity_factor` / `min_expert_capacity` large enough for the decoded
length).
"""

import keras
from keras import ops

from keras_moe.models.compilation_cache import use_persistent_cache
from keras_moe.models.search_loops import _BeamLoop, _GreedyLoop
from keras_moe.validation import check_int

# The compiled functions live on the model (outside Keras' attribute tracking),
# so they go away with it.
_CACHE_ATTRIBUTE = "_keras_moe_compiled_searches"


LENGTH_NORMALIZERS = ("gnmt", "hf")


def check_length_normalizer(length_normalizer):
    """Raises ValueError naming `length_normalizer` unless it is "gnmt" or "hf"."""
    if not isinstance(length_normalizer, str) or length_normalizer not in LENGTH_NORMALIZERS:
        raise ValueError(
            f"`length_normalizer` must be one of {LENGTH_NORMALIZERS}, got {length_normalizer!r}."
        )


def check_search_arguments(model, max_length, num_beams):
    """Raises ValueError naming `max_length` or `num_beams` when they are unusable."""
    check_int("max_length", max_length)
    check_int("num_beams", num_beams)
    vocab = model.config.vocab_size
    if num_beams > 1 and 2 * num_beams > vocab:
        raise ValueError(
            f"`num_beams` ({num_beams}) must be at most half the vocabulary "
            f"(vocab_size={vocab}): each step ranks 2 * num_beams candidates."
        )


def search(
    model,
    encoder_input_tokens,
    max_length,
    num_beams=1,
    length_penalty=0.0,
    eos_id=None,
    length_normalizer="gnmt",
    *,
    independent_routing=True,
):
    """Greedy search (one beam) or beam search, traceable by `tf.function` and `jax.jit`.

    Beam search keeps `num_beams` live hypotheses and, beside them, the
    `num_beams` best finished ones (as T5X and HF do): a hypothesis that emits
    EOS moves to the finished set, so finished hypotheses never take a live
    beam's place. At each step the `2 * num_beams` best extensions of the live
    beams are ranked; an EOS among the first `num_beams` of them finishes a
    hypothesis (HF's and fairseq's rule), the best `num_beams` others stay
    live. An example is done when its finished set is full and no live
    hypothesis can still beat its worst one; from then on it takes no new
    hypotheses. The result is the best of the finished and (for an example
    not done) live hypotheses by `score / length_divisor(length)`, length
    counting EOS: `((5 + length) / 6) ** length_penalty` with
    `length_normalizer="gnmt"` (the default, GNMT's and T5X's, so T5X-trained
    models decode as there), `length ** length_penalty` with "hf" (HF
    transformers' `generate(num_beams=..., length_penalty=...)`). "gnmt" stops
    an example only once no live hypothesis can win even at `max_length`;
    "hf" follows HF's default `early_stopping=False`: it compares the best
    live hypothesis at its current length, so it can stop an example whose
    live beams would later have won, as HF does. At `length_penalty=0` both
    are the plain log-probability and give the same tokens.

    Greedy search takes the most likely token; a sequence that emitted EOS is
    padded until every sequence has.

    Args:
        model: an `EncoderDecoder`.
        encoder_input_tokens: int `[B, L]`, 0-padded.
        max_length: most tokens to produce (a Python int: it sizes the cache).
        num_beams: beams per example (a Python int; 1 = greedy; at most half
            the vocabulary).
        length_penalty: alpha of the length normalisation (0: none).
        eos_id: end-of-sequence id; defaults to `model.config.eos_id`.
        length_normalizer: "gnmt" (default) or "hf", as above.
        independent_routing: the MoE layers route each input apart from the
            rest of the batch (default), so an output does not depend on the
            other inputs; False: the layers' own `group_size`. Cached steps
            route each token alone either way.

    Returns:
        `(tokens, scores, steps)`: int32 `[B, max_length]` (the tokens after the
        start token, EOS included, padding after it and after `steps`), the
        float32 log-probability `[B]` of each chosen output, and the int32
        number of steps the loop ran.

    Example:
    >>> import numpy as np
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> tokens, scores, steps = search(model, np.array([[5, 6, 1]]), max_length=8)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 8), (1,))
    """
    check_length_normalizer(length_normalizer)
    eos = model.config.eos_id if eos_id is None else eos_id
    tokens = ops.cast(encoder_input_tokens, "int32")
    encoder_outputs, encoder_mask = model.encode(
        tokens, training=False, independent_routing=independent_routing
    )
    caches = model.init_cache(encoder_outputs, max_length)
    if num_beams > 1:  # every beam of an input shares its encoding
        caches = repeat_caches(caches, num_beams)
        encoder_mask = ops.repeat(encoder_mask, num_beams, axis=0)
    loop = _GreedyLoop if num_beams == 1 else _BeamLoop
    return loop(
        model,
        caches,
        encoder_mask,
        ops.shape(tokens)[0],
        max_length,
        num_beams,
        length_penalty,
        eos,
        length_normalizer,
    ).run()


def repeat_caches(caches, beams):
    """Decoding caches of B inputs -> of B * beams rows, each input's rows together."""
    return [
        {
            part: tuple(ops.repeat(t, beams, axis=0) for t in cache[part])
            for part in ("self", "cross")
        }
        for cache in caches
    ]


def compiled_search(
    model,
    max_length,
    num_beams=1,
    length_penalty=0.0,
    eos_id=None,
    jit_compile=False,
    independent_routing=True,
    length_normalizer="gnmt",
):
    """`search` compiled for the backend, cached per model and options.

    The function takes int `[B, L]` encoder tokens and returns `search`'s
    `(tokens, scores, steps)`. On TensorFlow it is traced once per input
    length, whatever the batch size (MoE layers size their capacity from the
    static length); on JAX once per input shape, with JAX's persistent
    compilation cache on (`keras_moe.models.compilation_cache`), so a later
    process reads the compiled search from disk. It reads the model's current
    weights at every call, so it stays valid while the model trains.

    Args:
        model: an `EncoderDecoder`.
        max_length, num_beams, length_penalty, eos_id: as in `search`.
        jit_compile: TensorFlow only: compile the `tf.function` with XLA
            (JAX always compiles with XLA).
        independent_routing: as in `search`: route each input's tokens apart
            from the other inputs', so an output does not depend on the rest
            of the batch. False: the MoE layers' own `group_size` (e.g. one
            group for the whole batch).
        length_normalizer: "gnmt" (default) or "hf", as in `search`.

    Returns:
        A callable `tokens -> (tokens, scores, steps)`.

    Example:
    >>> import numpy as np
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> beam4 = compiled_search(model, max_length=8, num_beams=4)
    >>> tokens, scores, steps = beam4(np.array([[5, 6, 1], [7, 1, 0]], "int32"))
    >>> tuple(tokens.shape)
    (2, 8)
    """
    check_search_arguments(model, max_length, num_beams)
    check_length_normalizer(length_normalizer)
    key = (
        max_length,
        num_beams,
        float(length_penalty),
        eos_id,
        length_normalizer,
        bool(jit_compile),
        bool(independent_routing),
    )
    functions = model.__dict__.get(_CACHE_ATTRIBUTE)
    if functions is None:
        functions = {}
        object.__setattr__(model, _CACHE_ATTRIBUTE, functions)
    if key not in functions:
        functions[key] = _compile(model, key)
    return functions[key]


def stateless_search(model, tokens, *search_args, state_mapping=None, independent_routing=True):
    """`search(model, tokens, *search_args)` in a stateless scope (for tracing).

    The scope keeps the MoE layers' losses and metric updates of the decoding
    steps out of the model; `state_mapping` (JAX) gives the variables' values.
    It creates no variables, so it leaves Keras' global list of deferred
    initialisations alone: a fit() that failed while building another model had
    left variables there, and initialising them on exit raised "already
    initialized". `independent_routing` is `compiled_search`'s.
    """
    with keras.StatelessScope(state_mapping=state_mapping, initialize_variables=False):
        return search(model, tokens, *search_args, independent_routing=independent_routing)


def _compile(model, key):
    *options, jit_compile, independent_routing = key  # options: `search`'s, in order

    def run(tokens):
        return stateless_search(model, tokens, *options, independent_routing=independent_routing)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        by_length = {}

        def call(tokens):
            tokens = tf.convert_to_tensor(tokens, tf.int32)
            length = int(tokens.shape[1])
            if length not in by_length:  # any batch size; MoE layers need the length
                # autograph=False: the search's control flow is keras.ops already,
                # and converting it took a quarter of the trace.
                by_length[length] = tf.function(
                    run,
                    jit_compile=jit_compile,
                    autograph=False,
                    input_signature=[tf.TensorSpec([None, length], tf.int32)],
                )
            return by_length[length](tokens)

        return call
    if backend == "jax":
        import jax

        use_persistent_cache()  # a later process reads this compilation from disk

        def stateless(values, tokens):
            return stateless_search(
                model,
                tokens,
                *options,
                state_mapping=zip(model.variables, values, strict=False),
                independent_routing=independent_routing,
            )

        jitted = jax.jit(stateless)
        return lambda tokens: jitted(
            [v.value for v in model.variables], ops.convert_to_tensor(tokens, "int32")
        )
    return run  # other backends: the same loop, run eagerly
