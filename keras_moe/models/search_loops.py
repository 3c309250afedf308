"""The while loops of `keras_moe.models.search`: greedy and beam search's state, step,
stop rule and result, and the length normalisation that ranks beams.
"""

from keras import ops


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
