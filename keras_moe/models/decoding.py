"""Greedy and beam search for `EncoderDecoder`, with or without a key/value cache.

By default `generate` runs the search as one compiled loop
(`keras_moe.models.search`, whose docstring gives the beam-search rules);
with `compiled=False` it runs the reference loop here: the model eagerly one
step at a time, the bookkeeping in float64 NumPy, the same rules written
independently. Each input is encoded once, and by default each input is
routed apart from the rest of the batch (`independent_routing`, passed to
the model's `encode` and `decode` with the call, so decoding never changes how
another thread's functions route).

With the cache, each step feeds one token per sequence; MoE layers then route
each token alone, never over capacity. Cached and uncached decoding therefore
give the same tokens whenever the uncached (whole-prefix) forward pass drops
no token, i.e. with `eval_capacity_factor` / `min_expert_capacity` large
enough for the decoded length (the defaults, cf = 2.0, min 4, are enough for
short outputs).
"""

import numpy as np
from keras import ops

from keras_moe.models.search import (
    check_length_normalizer,
    check_search_arguments,
    compiled_search,
    repeat_caches,
)
from keras_moe.models.text_io import is_text

METHODS = ("greedy", "beam")


def pad_input_tokens(sequences, length):
    """Stacks token id sequences into an int32 `[N, length]` batch, cut or 0-padded.

    Example:
    >>> pad_input_tokens([[5, 6, 1], [7, 1]], 4).tolist()
    [[5, 6, 1, 0], [7, 1, 0, 0]]
    """
    tokens = np.zeros((len(sequences), length), np.int32)
    for row, ids in enumerate(sequences):
        ids = list(ids)[:length]
        tokens[row, : len(ids)] = ids
    return tokens


def strip_ids(ids, eos_id=1, pad_id=0):
    """Token ids up to (not including) EOS, padding removed.

    Example:
    >>> strip_ids([5, 0, 7, 1, 9])
    [5, 7]
    """
    out = []
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i != pad_id:
            out.append(i)
    return out


def _log_softmax(logits):
    logits = logits.astype(np.float64)
    logits = logits - logits.max(axis=-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def _reorder(caches, index):
    out = []
    for cache in caches:
        k, v = cache["self"]
        out.append(
            {
                "self": (ops.take(k, index, axis=0), ops.take(v, index, axis=0)),
                "cross": cache["cross"],
            }
        )
    return out


def _normalizer(length, length_penalty, length_normalizer):
    if not length_penalty:
        return 1.0
    if length_normalizer == "hf":
        return float(length) ** length_penalty
    return ((5.0 + length) / 6.0) ** length_penalty


class _ReferenceBeams:
    """Beam-search bookkeeping in float64 NumPy: `num_beams` live hypotheses and
    the `num_beams` best finished ones per example (see `search.search`)."""

    def __init__(
        self, batch, beams, max_length, length_penalty, eos, start_id, length_normalizer="gnmt"
    ):
        self.beams, self.max_length, self.alpha, self.eos = beams, max_length, length_penalty, eos
        self.kind = length_normalizer
        self.stopped = np.zeros(batch, bool)  # done examples take no new hypotheses
        self.seqs = np.full((batch, beams, 1), start_id, np.int32)
        self.scores = np.full((batch, beams), -np.inf)
        self.scores[:, 0] = 0.0
        # per example: list of (rank, score, tokens) of finished hypotheses, best first
        self.finished = [[] for _ in range(batch)]

    def step(self, logp):
        """`logp [B, K, V]` of the live beams; returns the parents' rows `[B*K]`."""
        batch, k, vocab = logp.shape
        cand = (self.scores[..., None] + logp).reshape(batch, k * vocab)
        order = np.argsort(-cand, axis=-1, kind="stable")[:, : 2 * k]
        parents, new_seqs, new_scores = [], [], []
        for b in range(batch):
            live = []
            for rank, index in enumerate(order[b]):
                beam, token = divmod(int(index), vocab)
                seq = np.append(self.seqs[b, beam], token)
                if token == self.eos:
                    if rank < k and not self.stopped[b]:
                        length = len(seq) - 1  # EOS included, start token not
                        self.finished[b].append(
                            (cand[b, index] / self.normalizer(length), cand[b, index], seq)
                        )
                elif len(live) < k:
                    live.append((beam, seq, cand[b, index]))
            self.finished[b] = sorted(self.finished[b], key=lambda f: -f[0])[:k]
            parents.append([b * k + beam for beam, _, _ in live])
            new_seqs.append([seq for _, seq, _ in live])
            new_scores.append([score for _, _, score in live])
        self.seqs = np.array(new_seqs, np.int32)
        self.scores = np.array(new_scores)
        return np.array(parents).reshape(-1)

    def normalizer(self, length):
        return _normalizer(length, self.alpha, self.kind)

    def done(self):
        """Marks the examples that are done after this step; True once all are."""
        length = self.seqs.shape[-1] - 1
        for b, finished in enumerate(self.finished):
            best = self.scores[b, 0]
            if self.kind == "hf":  # HF's early_stopping=False: the best live beam as it is
                bound = best / self.normalizer(length)
            else:  # the best any live beam can still rank, at any length up to max_length
                bound = max(best / self.normalizer(self.max_length), best / self.normalizer(length))
            if len(finished) == self.beams and finished[-1][0] >= bound:
                self.stopped[b] = True
        return bool(self.stopped.all())

    def best(self):
        """Tokens `[B, T]` (after the start token, 0-padded) and scores `[B]` of the best
        finished or live hypothesis of each example."""
        length = self.seqs.shape[-1] - 1
        tokens = np.zeros((len(self.finished), length), np.int32)
        scores = np.zeros(len(self.finished))
        for b, finished in enumerate(self.finished):
            live = (
                []
                if self.stopped[b]
                else [
                    (
                        self.scores[b, i] / self.normalizer(length),
                        self.scores[b, i],
                        self.seqs[b, i],
                    )
                    for i in range(self.beams)
                ]
            )
            pool = finished + live  # finished first: they win ties
            _, scores[b], seq = max(pool, key=lambda h: h[0])  # max keeps the first of ties
            tokens[b, : len(seq) - 1] = seq[1:]
        return tokens, scores


def input_token_ids(encoder_input_tokens, vocab_size):
    """`encoder_input_tokens` as int32 NumPy `[B, L]`, checked before any decoding runs.

    Text, a rank other than 2, non-integer values and ids outside
    `[0, vocab_size)` are refused with a `ValueError` saying what was given and
    what is expected (inside the compiled search they would surface as a graph
    error, or not at all).

    Args:
        encoder_input_tokens: int `[B, L]` (NumPy, a list of lists, or a tensor).
        vocab_size: the model's `T5Config.vocab_size`.

    Example:
    >>> input_token_ids([[5, 6, 1]], vocab_size=32).tolist()
    [[5, 6, 1]]
    >>> input_token_ids([[5, 40, 1]], vocab_size=32)
    Traceback (most recent call last):
    ...
    ValueError: `encoder_input_tokens` holds token id 40 (at [0, 1]), outside [0, vocab_size) with vocab_size=32: the ids must come from the model's vocabulary.
    """  # noqa: E501 - verbatim output lines
    if is_text(encoder_input_tokens):
        raise ValueError(
            "`generate` was given text without a vocabulary to tokenize it: call "
            "`model.generate(texts, vocabulary=keras_moe.tasks.get_vocabulary())` (or the "
            "checkpoint's SentencePiece .model path), which returns text, or give token ids, "
            "int [batch, length]."
        )
    try:
        values = np.asarray(ops.convert_to_numpy(encoder_input_tokens))
    except Exception as e:  # ragged lists and other non-arrays
        raise ValueError(
            "`encoder_input_tokens` must be int token ids [batch, length] (0-padded to one "
            f"length), got {type(encoder_input_tokens).__name__}: {e}"
        ) from None
    if values.ndim != 2:
        raise ValueError(
            "`encoder_input_tokens` must be int token ids [batch, length], got shape "
            f"{values.shape}" + (" (one sequence: pass `ids[None]`)." if values.ndim == 1 else ".")
        )
    if values.dtype.kind not in "iub" and values.size and not np.all(values == np.round(values)):
        raise ValueError(
            f"`encoder_input_tokens` must be integer token ids, got {values.dtype} values "
            "that are not whole numbers."
        )
    if values.size:
        bad = np.argwhere((values < 0) | (values >= vocab_size))
        if len(bad):
            where = tuple(int(i) for i in bad[0])
            raise ValueError(
                f"`encoder_input_tokens` holds token id {int(values[where])} (at "
                f"{list(where)}), outside [0, vocab_size) with vocab_size={vocab_size}: the "
                "ids must come from the model's vocabulary."
            )
    return values.astype(np.int32)


def beam_arguments(
    method: str | None, num_beams: int | None, beam_size: int | None
) -> tuple[str, int]:
    """`(method, num_beams)` from `generate`'s `method`, `num_beams` and the CLI's
    `beam_size` (1: greedy, N > 1: N beams); refuses settings that disagree.

    Example:
    >>> beam_arguments(None, None, 3), beam_arguments(None, None, None)
    (('beam', 3), ('greedy', 4))
    >>> beam_arguments("greedy", None, 3)
    Traceback (most recent call last):
    ...
    ValueError: `beam_size=3` asks for beam search but `method='greedy'`: give one of them.
    """
    if beam_size is not None:
        if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
            raise ValueError(f"`beam_size` must be an integer >= 1, got {beam_size!r}.")
        wanted = "greedy" if beam_size == 1 else "beam"
        if method is not None and method != wanted:
            raise ValueError(
                f"`beam_size={beam_size}` asks for {wanted} search but "
                f"`method={method!r}`: give one of them."
            )
        if num_beams is not None and num_beams != beam_size:
            raise ValueError(
                f"`beam_size={beam_size}` and `num_beams={num_beams}` disagree: give one of them."
            )
        return wanted, beam_size
    if method is None:
        method = "beam" if num_beams is not None and num_beams > 1 else "greedy"
    return method, 4 if num_beams is None else num_beams


def generate(
    model,
    encoder_input_tokens,
    max_length=64,
    method="greedy",
    num_beams=4,
    length_penalty=0.0,
    use_cache=True,
    eos_id=None,
    return_scores=False,
    compiled=True,
    jit_compile=False,
    independent_routing=True,
    length_normalizer="gnmt",
):
    """Decodes output token ids for a batch of inputs.

    Args:
        model: an `EncoderDecoder`.
        encoder_input_tokens: int `[B, L]`, 0-padded.
        max_length: most tokens to produce, >= 1.
        method: "greedy" or "beam".
        num_beams: beams for beam search, >= 1 and at most half the vocabulary.
        length_penalty: alpha of the length normalisation that ranks the
            beams (0 = plain log-probability; see `length_normalizer`).
        use_cache: keep keys/values between steps (True) or recompute the
            whole prefix at every step (False; slower, for checking).
        eos_id: end-of-sequence id; defaults to `model.config.eos_id` (1).
        return_scores: also return the log-probability of each output.
        compiled: run the cached search as one compiled loop (True) or as the
            eager reference loop (False). `use_cache=False` is always eager.
        jit_compile: with `compiled` on TensorFlow, compile the loop with XLA.
        independent_routing: route each input apart from the rest of the
            batch (default), so its output does not depend on the other
            inputs: the MoE layers are called with `independent_routing=True`
            (see `keras_moe.MoeLayer`). False: the MoE layers' own `group_size`.
        length_normalizer: how `length_penalty` ranks beams of `len` tokens
            (EOS included). "gnmt" (default): `score / ((5 + len) / 6) ** alpha`,
            GNMT's and T5X's, so models trained there decode as in T5X. "hf":
            `score / len ** alpha` with HF's default early stopping, the tokens
            of HF transformers' `generate(num_beams=..., length_penalty=alpha)`
            (see `keras_moe.models.search.search`).

    Returns:
        int32 `[B, T]` with `T <= max_length`: the tokens after the start
        token, EOS included, 0 after it. With `return_scores`, also float `[B]`.

    Example:
    >>> import numpy as np
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> tokens = generate(model, np.array([[5, 6, 1]]), max_length=8, method="beam")
    >>> tokens.dtype, tokens.shape[0], tokens.shape[1] <= 8  # [B, T <= max_length]
    (dtype('int32'), 1, True)
    """

    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, got {method!r}.")
    beams = 1 if method == "greedy" else num_beams
    check_search_arguments(model, max_length, beams)
    check_length_normalizer(length_normalizer)
    eos = model.config.eos_id if eos_id is None else eos_id
    enc = input_token_ids(encoder_input_tokens, model.config.vocab_size)
    if compiled and use_cache:
        run = compiled_search(
            model,
            max_length,
            beams,
            length_penalty,
            eos,
            jit_compile,
            independent_routing,
            length_normalizer,
        )
        tokens, scores, steps = (ops.convert_to_numpy(t) for t in run(enc))
        tokens = np.asarray(tokens)[:, : int(steps)]
        if return_scores:
            return tokens, np.asarray(scores, np.float64)
        return tokens
    if beams == 1:
        tokens, scores = _greedy_reference(
            model, enc, max_length, use_cache, eos, independent_routing
        )
    else:
        tokens, scores = _beam_reference(
            model,
            enc,
            max_length,
            beams,
            length_penalty,
            use_cache,
            eos,
            independent_routing,
            length_normalizer,
        )
    if return_scores:
        return tokens, scores
    return tokens


def _step_log_probs(model, seqs, step, caches, enc_out, enc_mask, independent_routing):
    """float64 log-probabilities `[N, V]` of the next token of `seqs [N, t]`."""
    if caches is not None:
        logits, caches = model.decode_step(seqs[:, -1], step, caches, enc_mask)
    else:
        logits = model.decode(
            seqs, enc_out, enc_mask, training=False, independent_routing=independent_routing
        )[:, -1]
    return _log_softmax(np.asarray(ops.convert_to_numpy(logits))), caches


def _greedy_reference(model, enc, max_length, use_cache, eos, independent_routing):
    config = model.config
    enc_out, enc_mask = model.encode(enc, training=False, independent_routing=independent_routing)
    caches = model.init_cache(enc_out, max_length) if use_cache else None
    seqs = np.full((len(enc), 1), config.decoder_start_id, np.int32)
    scores = np.zeros(len(enc))
    finished = np.zeros(len(enc), bool)
    for t in range(max_length):
        logp, caches = _step_log_probs(
            model, seqs, t, caches, enc_out, enc_mask, independent_routing
        )
        token = np.argmax(logp, axis=-1)
        scores = np.where(finished, scores, scores + logp[np.arange(len(enc)), token])
        token = np.where(finished, config.pad_id, token).astype(np.int32)
        seqs = np.concatenate([seqs, token[:, None]], axis=1)
        finished |= token == eos
        if finished.all():
            break
    return seqs[:, 1:], scores


def _beam_reference(
    model,
    enc,
    max_length,
    beams,
    length_penalty,
    use_cache,
    eos,
    independent_routing,
    length_normalizer="gnmt",
):
    config = model.config
    enc_out, enc_mask = model.encode(
        enc,
        training=False,  # once per input
        independent_routing=independent_routing,
    )
    caches = model.init_cache(enc_out, max_length) if use_cache else None
    if caches is not None:
        caches = repeat_caches(caches, beams)
    enc_out = ops.repeat(enc_out, beams, axis=0)
    enc_mask = ops.repeat(enc_mask, beams, axis=0)
    state = _ReferenceBeams(
        len(enc), beams, max_length, length_penalty, eos, config.decoder_start_id, length_normalizer
    )
    for t in range(max_length):
        flat = state.seqs.reshape(len(enc) * beams, -1)
        logp, caches = _step_log_probs(
            model, flat, t, caches, enc_out, enc_mask, independent_routing
        )
        parents = state.step(logp.reshape(len(enc), beams, -1))
        if caches is not None:
            caches = _reorder(caches, parents)
        if state.done():
            break
    return state.best()
