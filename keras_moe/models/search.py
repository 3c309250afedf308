"""Greedy and beam search for `EncoderDecoder` as one compiled loop.

The whole search is one `keras.ops.while_loop` over static shapes: the
self-attention key/value cache holds `max_length` slots written by slice
update, the output buffer holds `max_length` tokens, and the loop stops early
once every beam has finished. No value goes back to the host per token, so the
search runs as one `tf.function` on TensorFlow (optionally XLA-compiled) and
as one `jax.jit` on JAX. Its tokens equal `keras_moe.models.decoding`'s eager
reference loop (same candidate order: ties go to the lower beam, then the
lower token id).

MoE layers see one token per sequence at each step; a one-token call routes
every sequence's token on its own, so it is never over capacity and nothing is
dropped while decoding. A teacher-forced pass over the same tokens gives the
same logits only when it drops nothing either (an `eval_capacity_factor` /
`min_expert_capacity` large enough for the decoded length).
"""

import keras
from keras import ops

from keras_moe.validation import check_int

# The compiled functions live on the model (outside Keras' attribute tracking),
# so they go away with it.
_CACHE_ATTRIBUTE = "_keras_moe_compiled_searches"


def search(model, encoder_input_tokens, max_length, num_beams=1, length_penalty=0.0,
           eos_id=None):
    """Beam search (greedy with one beam), traceable by `tf.function` and `jax.jit`.

    Beams that emitted EOS are frozen: they extend only with padding at no cost
    and keep competing with the live beams. The final beam is the best by
    `score / ((5 + length) / 6) ** length_penalty`.

    Args:
        model: an `EncoderDecoder`.
        encoder_input_tokens: int `[B, L]`, 0-padded.
        max_length: most tokens to produce (a Python int: it sizes the cache).
        num_beams: beams per example (a Python int; 1 = greedy).
        length_penalty: alpha of the GNMT length normalisation (0: none).
        eos_id: end-of-sequence id; defaults to `model.config.eos_id`.

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
    config = model.config
    eos = config.eos_id if eos_id is None else eos_id
    beams = num_beams
    tokens = ops.cast(encoder_input_tokens, "int32")
    batch = ops.shape(tokens)[0]
    if beams > 1:
        tokens = ops.repeat(tokens, beams, axis=0)
    encoder_outputs, encoder_mask = model.encode(tokens, training=False)
    caches = model.init_cache(encoder_outputs, max_length)
    cross = [cache["cross"] for cache in caches]
    flat_self = tuple(t for cache in caches for t in cache["self"])
    vocab = config.vocab_size
    frozen = ops.where(ops.equal(ops.arange(vocab), config.pad_id), 0.0, float("-inf"))
    first_beam_only = ops.where(ops.equal(ops.arange(beams), 0), 0.0, float("-inf"))
    positions = ops.arange(max_length, dtype="int32")

    def unflatten(flat):
        return [{"self": (flat[2 * i], flat[2 * i + 1]), "cross": kv}
                for i, kv in enumerate(cross)]

    def cond(step, last, seqs, scores, finished, *flat):
        return ops.logical_and(ops.less(step, max_length),
                               ops.logical_not(ops.all(finished)))

    def greedy_step(logits, scores, finished):
        # argmax and one logsumexp instead of a log-softmax and a top-k over the vocabulary
        token = ops.cast(ops.argmax(logits, axis=-1), "int32")
        logp = (ops.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
                - ops.logsumexp(logits, axis=-1))
        done = finished[:, 0]
        token = ops.where(done, config.pad_id, token)[:, None]
        return ops.where(done, scores[:, 0], scores[:, 0] + logp)[:, None], token

    def body(step, last, seqs, scores, finished, *flat):
        logits, new_caches = model.decode_step(last, step, unflatten(flat), encoder_mask)
        new_flat = tuple(t for cache in new_caches for t in cache["self"])
        if beams == 1:
            scores, token = greedy_step(logits, scores, finished)
        else:
            logp = ops.reshape(ops.log_softmax(logits, axis=-1), (batch, beams, vocab))
            logp = ops.where(finished[..., None], frozen, logp)
            candidates = ops.reshape(scores[..., None] + logp, (batch, beams * vocab))
            scores, order = ops.top_k(candidates, beams)
            beam, token = order // vocab, ops.cast(order % vocab, "int32")
            # Every beam continues one of the previous step's beams.
            rows = ops.reshape(ops.arange(batch)[:, None] * beams + beam, (-1,))
            seqs = ops.reshape(ops.take(ops.reshape(seqs, (-1, max_length)), rows, axis=0),
                               (batch, beams, max_length))
            finished = ops.reshape(ops.take(ops.reshape(finished, (-1,)), rows, axis=0),
                                   (batch, beams))
            new_flat = tuple(ops.take(t, rows, axis=0) for t in new_flat)
        seqs = ops.where(ops.equal(positions, step), token[..., None], seqs)
        finished = ops.logical_or(finished, ops.equal(token, eos))
        return (step + 1, ops.reshape(token, (-1,)), seqs, scores, finished) + new_flat

    state = (
        ops.convert_to_tensor(0, "int32"),
        ops.full((batch * beams,), config.decoder_start_id, "int32"),
        ops.zeros((batch, beams, max_length), "int32"),
        ops.zeros((batch, beams), "float32") + first_beam_only,
        ops.zeros((batch, beams), "bool"),
    ) + flat_self
    steps, _, seqs, scores, _ = ops.while_loop(cond, body, state)[:5]

    ranked = scores
    if length_penalty:
        is_eos = ops.equal(seqs, eos)
        first_eos = ops.cast(ops.argmax(ops.cast(is_eos, "int32"), axis=-1), "int32") + 1
        lengths = ops.where(ops.any(is_eos, axis=-1), first_eos, steps)
        ranked = scores / ((5.0 + ops.cast(lengths, "float32")) / 6.0) ** length_penalty
    best = ops.argmax(ranked, axis=-1)
    rows = ops.arange(batch) * beams + ops.cast(best, "int32")
    tokens = ops.take(ops.reshape(seqs, (-1, max_length)), rows, axis=0)
    return tokens, ops.take(ops.reshape(scores, (-1,)), rows, axis=0), steps


def compiled_search(model, max_length, num_beams=1, length_penalty=0.0, eos_id=None,
                    jit_compile=False):
    """`search` compiled for the backend, cached per model and options.

    The function takes int `[B, L]` encoder tokens and returns `search`'s
    `(tokens, scores, steps)`; it is traced once per input shape (MoE layers
    size their capacity from the static length). It reads the model's current
    weights at every call, so it stays valid while the model trains.

    Args:
        model: an `EncoderDecoder`.
        max_length, num_beams, length_penalty, eos_id: as in `search`.
        jit_compile: TensorFlow only: compile the `tf.function` with XLA
            (JAX always compiles with XLA).

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
    check_int("max_length", max_length)
    check_int("num_beams", num_beams)
    key = (max_length, num_beams, float(length_penalty), eos_id, bool(jit_compile))
    functions = model.__dict__.get(_CACHE_ATTRIBUTE)
    if functions is None:
        functions = {}
        object.__setattr__(model, _CACHE_ATTRIBUTE, functions)
    if key not in functions:
        functions[key] = _compile(model, key)
    return functions[key]


def stateless_search(model, tokens, *search_args, state_mapping=None):
    """`search(model, tokens, *search_args)` in a stateless scope (for tracing).

    The scope keeps the MoE layers' losses and metric updates of the decoding
    steps out of the model; `state_mapping` (JAX) gives the variables' values.
    It creates no variables, so it leaves Keras' global list of deferred
    initialisations alone: a fit() that failed while building another model had
    left variables there, and initialising them on exit raised "already
    initialized".
    """
    with keras.StatelessScope(state_mapping=state_mapping, initialize_variables=False):
        return search(model, tokens, *search_args)


def _compile(model, key):
    max_length, num_beams, length_penalty, eos_id, jit_compile = key
    options = (max_length, num_beams, length_penalty, eos_id)

    def run(tokens):
        return stateless_search(model, tokens, *options)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        # Traced once per input shape: MoE layers need the static length.
        function = tf.function(run, jit_compile=jit_compile)
        return lambda tokens: function(tf.convert_to_tensor(tokens, tf.int32))
    if backend == "jax":
        import jax

        def stateless(values, tokens):
            return stateless_search(model, tokens, *options,
                                    state_mapping=zip(model.variables, values))

        jitted = jax.jit(stateless)
        return lambda tokens: jitted([v.value for v in model.variables],
                                     ops.convert_to_tensor(tokens, "int32"))
    return run  # other backends: the same loop, run eagerly
