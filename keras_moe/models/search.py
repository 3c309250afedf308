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


def length_divisor(length, length_penalty, length_normalizer="gnmt"):
    """What a hypothesis' log-probability is divided by to rank it (1 when `length_penalty` is 0).

    "gnmt" (GNMT, T5X): `((5 + length) / 6) ** length_penalty`; "hf" (HF
    transformers): `length ** length_penalty`. `length` counts the output
    tokens, EOS included, the decoder start token not.

    Example:
    >>> float(length_divisor(7, 1.0)), float(length_divisor(7, 1.0, "hf"))
    (2.0, 7.0)
    """
    if not length_penalty:
        return 1.0
    length = ops.cast(length, "float32")
    if length_normalizer == "hf":
        return length**length_penalty
    return ((5.0 + length) / 6.0) ** length_penalty


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


class _Loop:
    """The while loop shared by greedy and beam search: state, cache plumbing, stop rule."""

    def __init__(
        self,
        model,
        caches,
        encoder_mask,
        batch,
        max_length,
        beams,
        length_penalty,
        eos,
        length_normalizer,
    ):
        self.model, self.encoder_mask = model, encoder_mask
        self.cross = [cache["cross"] for cache in caches]
        self.flat_self = tuple(t for cache in caches for t in cache["self"])
        self.batch, self.max_length, self.beams = batch, max_length, beams
        self.length_penalty, self.eos = length_penalty, eos
        self.length_normalizer = length_normalizer
        self.config = model.config
        self.positions = ops.arange(max_length, dtype="int32")

    def step_logits(self, last, step, flat):
        caches = [
            {"self": (flat[2 * i], flat[2 * i + 1]), "cross": kv} for i, kv in enumerate(self.cross)
        ]
        logits, new_caches = self.model.decode_step(last, step, caches, self.encoder_mask)
        return logits, tuple(t for cache in new_caches for t in cache["self"])

    def write(self, seqs, step, token):
        """`seqs [..., T]` with `token [...]` at position `step`."""
        return ops.where(ops.equal(self.positions, step), token[..., None], seqs)

    def run(self):
        n = self.num_state
        state = (
            (
                ops.convert_to_tensor(0, "int32"),
                ops.full((self.batch * self.beams,), self.config.decoder_start_id, "int32"),
            )
            + self.initial_state()
            + self.flat_self
        )

        def cond(step, last, *rest):
            return ops.logical_and(
                ops.less(step, self.max_length), ops.logical_not(ops.all(self.done(*rest[:n])))
            )

        def body(step, last, *rest):
            logits, flat = self.step_logits(last, step, rest[n:])
            last, new_state, flat = self.advance(step, logits, rest[:n], flat)
            return (step + 1, last) + new_state + flat

        final = ops.while_loop(cond, body, state)
        return self.result(final[0], final[2 : 2 + n])


class _GreedyLoop(_Loop):
    num_state = 3  # seqs [B, T], scores [B], finished [B]

    def initial_state(self):
        return (
            ops.zeros((self.batch, self.max_length), "int32"),
            ops.zeros((self.batch,), "float32"),
            ops.zeros((self.batch,), "bool"),
        )

    def done(self, seqs, scores, finished):
        return finished

    def advance(self, step, logits, state, flat):
        seqs, scores, finished = state
        # argmax and one logsumexp instead of a log-softmax over the vocabulary
        token = ops.cast(ops.argmax(logits, axis=-1), "int32")
        logp = ops.take_along_axis(logits, token[:, None], axis=-1)[:, 0] - ops.logsumexp(
            logits, axis=-1
        )
        token = ops.where(finished, self.config.pad_id, token)
        scores = ops.where(finished, scores, scores + logp)
        finished = ops.logical_or(finished, ops.equal(token, self.eos))
        return token, (self.write(seqs, step, token), scores, finished), flat

    def result(self, steps, state):
        seqs, scores, _ = state
        return seqs, scores, steps


class _BeamLoop(_Loop):
    # live seqs [B, K, T], live scores [B, K], finished seqs [B, K, T],
    # finished scores [B, K] (raw), their normalised ranking scores [B, K]
    # and whether each example is done [B]
    num_state = 6

    def initial_state(self):
        b, k, t = self.batch, self.beams, self.max_length
        only_first = ops.where(ops.equal(ops.arange(k), 0), 0.0, float("-inf"))
        empty = ops.full((b, k), float("-inf"), "float32")
        return (
            ops.zeros((b, k, t), "int32"),
            ops.zeros((b, k), "float32") + only_first,
            ops.zeros((b, k, t), "int32"),
            empty,
            empty,
            ops.zeros((b,), "bool"),
        )

    def done(self, *state):
        return state[-1]

    def divisor(self, length):
        return length_divisor(length, self.length_penalty, self.length_normalizer)

    def can_stop(self, length, scores, finished_ranks):
        """Whether no live hypothesis (the best scores `scores[:, 0]` at `length`
        tokens) is to beat the worst finished one."""
        best = scores[:, 0]
        if self.length_normalizer == "hf":
            # HF's heuristic (early_stopping=False): the best live beam as it is now.
            bound = best / self.divisor(length)
        else:
            # Live scores only fall; the normaliser is monotonic in the length, so
            # a live beam ranks at most its score over the larger of today's and the
            # longest length's normaliser (scores are <= 0).
            bound = ops.maximum(best / self.divisor(self.max_length), best)
        return ops.greater_equal(finished_ranks[:, -1], bound)

    def advance(self, step, logits, state, flat):
        seqs, scores, finished_seqs, finished_scores, finished_ranks, done = state
        b, k, t = self.batch, self.beams, self.max_length
        vocab = self.config.vocab_size
        logp = ops.reshape(ops.log_softmax(logits, axis=-1), (b, k, vocab))
        candidates = ops.reshape(scores[..., None] + logp, (b, k * vocab))
        cand_scores, order = ops.top_k(candidates, 2 * k)
        beam, token = order // vocab, ops.cast(order % vocab, "int32")
        rows = ops.reshape(ops.arange(b)[:, None] * k + beam, (-1,))
        cand_seqs = ops.reshape(
            ops.take(ops.reshape(seqs, (b * k, t)), rows, axis=0), (b, 2 * k, t)
        )
        cand_seqs = self.write(cand_seqs, step, token)
        is_eos = ops.equal(token, self.eos)

        # Finished: EOS among the first k candidates of an example not done,
        # merged with the earlier ones.
        first_k = ops.logical_and(
            ops.less(ops.arange(2 * k), k)[None, :], ops.logical_not(done)[:, None]
        )
        new_scores = ops.where(ops.logical_and(is_eos, first_k), cand_scores, float("-inf"))
        new_ranks = new_scores / self.divisor(step + 1)
        finished_ranks, pick = ops.top_k(ops.concatenate([finished_ranks, new_ranks], axis=1), k)
        finished_scores = ops.take_along_axis(
            ops.concatenate([finished_scores, new_scores], axis=1), pick, axis=1
        )
        finished_seqs = ops.take_along_axis(
            ops.concatenate([finished_seqs, cand_seqs], axis=1), pick[..., None], axis=1
        )

        # Live: the best k candidates that did not emit EOS (at most k of 2k did).
        scores, pick = ops.top_k(ops.where(is_eos, float("-inf"), cand_scores), k)
        seqs = ops.take_along_axis(cand_seqs, pick[..., None], axis=1)
        cache_rows = ops.reshape(
            ops.arange(b)[:, None] * k + ops.take_along_axis(beam, pick, axis=1), (-1,)
        )
        flat = tuple(ops.take(c, cache_rows, axis=0) for c in flat)
        last = ops.reshape(ops.take_along_axis(token, pick, axis=1), (-1,))
        # Done stays done ("hf"'s bound can rise again as the length grows).
        done = ops.logical_or(done, self.can_stop(step + 1, scores, finished_ranks))
        return last, (seqs, scores, finished_seqs, finished_scores, finished_ranks, done), flat

    def result(self, steps, state):
        seqs, scores, finished_seqs, finished_scores, finished_ranks, done = state
        live_ranks = ops.where(done[:, None], float("-inf"), scores / self.divisor(steps))
        ranks = ops.concatenate([finished_ranks, live_ranks], axis=1)  # ties: finished
        best = ops.cast(ops.argmax(ranks, axis=-1), "int32")[:, None]
        all_seqs = ops.concatenate([finished_seqs, seqs], axis=1)
        all_scores = ops.concatenate([finished_scores, scores], axis=1)
        tokens = ops.take_along_axis(all_seqs, best[..., None], axis=1)[:, 0]
        return tokens, ops.take_along_axis(all_scores, best, axis=1)[:, 0], steps


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

        from keras_moe.models.compilation_cache import use_persistent_cache

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
