"""Greedy and beam search for `EncoderDecoder`, with or without a key/value cache.

Greedy search is beam search with one beam. Beams that emitted EOS are
frozen (they only extend with padding at no cost) and keep competing with the
live beams; the search stops when every beam of every example has finished
or `max_length` tokens were produced. By default `generate` runs the search
as one compiled loop (`keras_moe.models.search`); with `compiled=False` it
runs the reference loop here: the model eagerly one step at a time, the
bookkeeping in float64 NumPy.

With the cache, each step feeds one token per sequence; MoE layers then see
one-token groups, which are never over capacity. Cached and uncached decoding
therefore give the same tokens whenever the uncached (whole-prefix) forward
pass drops no token, i.e. with `eval_capacity_factor` / `min_expert_capacity`
large enough for the decoded length (the defaults, cf = 2.0, min 4, are
enough for short outputs). The default `group_size="batch"` groups the whole
batch position-major for the uncached pass, while one-token steps are routed
token by token; the two agree whenever the uncached pass drops nothing.
"""

import numpy as np
from keras import ops

from keras_moe.validation import check_int

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
        tokens[row, :len(ids)] = ids
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
        out.append({"self": (ops.take(k, index, axis=0), ops.take(v, index, axis=0)),
                    "cross": cache["cross"]})
    return out


def generate(model, encoder_input_tokens, max_length=64, method="greedy", num_beams=4,
             length_penalty=0.0, use_cache=True, eos_id=None, return_scores=False,
             compiled=True, jit_compile=False):
    """Decodes output token ids for a batch of inputs.

    Args:
        model: an `EncoderDecoder`.
        encoder_input_tokens: int `[B, L]`, 0-padded.
        max_length: most tokens to produce, >= 1.
        method: "greedy" or "beam".
        num_beams: beams for beam search, >= 1.
        length_penalty: alpha of the GNMT length normalisation
            `score / ((5 + len) / 6) ** alpha` used to pick the final beam
            (0 = plain log-probability).
        use_cache: keep keys/values between steps (True) or recompute the
            whole prefix at every step (False; slower, for checking).
        eos_id: end-of-sequence id; defaults to `model.config.eos_id` (1).
        return_scores: also return the log-probability of each output.
        compiled: run the cached search as one compiled loop (True) or as the
            eager reference loop (False). `use_cache=False` is always eager.
        jit_compile: with `compiled` on TensorFlow, compile the loop with XLA.

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
    check_int("max_length", max_length)
    if method == "beam":
        check_int("num_beams", num_beams)
    config = model.config
    eos = config.eos_id if eos_id is None else eos_id
    pad = config.pad_id
    enc = np.asarray(ops.convert_to_numpy(encoder_input_tokens)).astype(np.int32)
    batch = enc.shape[0]
    beams = 1 if method == "greedy" else num_beams
    if compiled and use_cache:
        from keras_moe.models.search import compiled_search

        run = compiled_search(model, max_length, beams, length_penalty, eos, jit_compile)
        tokens, scores, steps = (ops.convert_to_numpy(t) for t in run(enc))
        tokens = np.asarray(tokens)[:, :int(steps)]
        if return_scores:
            return tokens, np.asarray(scores, np.float64)
        return tokens
    enc = np.repeat(enc, beams, axis=0)
    enc_out, enc_mask = model.encode(enc, training=False)
    caches = model.init_cache(enc_out, max_length) if use_cache else None

    seqs = np.full((batch, beams, 1), config.decoder_start_id, np.int32)
    scores = np.full((batch, beams), -np.inf)
    scores[:, 0] = 0.0
    finished = np.zeros((batch, beams), bool)
    for t in range(max_length):
        flat = seqs.reshape(batch * beams, -1)
        if use_cache:
            logits, caches = model.decode_step(flat[:, -1], t, caches, enc_mask)
        else:
            logits = model.decode(flat, enc_out, enc_mask, training=False)[:, -1]
        logp = _log_softmax(np.asarray(ops.convert_to_numpy(logits)))
        vocab = logp.shape[-1]
        logp = logp.reshape(batch, beams, vocab)
        frozen = np.full(vocab, -np.inf)
        frozen[pad] = 0.0
        logp = np.where(finished[..., None], frozen, logp)
        cand = (scores[..., None] + logp).reshape(batch, beams * vocab)
        order = np.argsort(-cand, axis=-1, kind="stable")[:, :beams]
        beam_index, token = order // vocab, order % vocab
        scores = np.take_along_axis(cand, order, axis=-1)
        rows = np.arange(batch)[:, None]
        seqs = np.concatenate([seqs[rows, beam_index], token[..., None].astype(np.int32)], -1)
        finished = finished[rows, beam_index] | (token == eos)
        if use_cache and beams > 1:
            caches = _reorder(caches, (rows * beams + beam_index).reshape(-1))
        if finished.all():
            break
    out = seqs[:, :, 1:]
    if length_penalty:
        is_eos = out == eos
        lengths = np.where(is_eos.any(-1), is_eos.argmax(-1) + 1, out.shape[-1])
        ranked = scores / ((5.0 + lengths) / 6.0) ** length_penalty
    else:
        ranked = scores
    best = np.argmax(ranked, axis=-1)
    tokens = out[np.arange(batch), best]
    if return_scores:
        return tokens, scores[np.arange(batch), best]
    return tokens
