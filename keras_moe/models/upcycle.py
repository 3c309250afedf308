"""Sparse upcycling: a trained dense model's weights as the start of a MoE model.

Every expert of a MoE layer starts from the dense FFN of its layer
(Komatsuzaki et al., arXiv 2212.05055); every other weight is copied; the
router starts fresh or at zero. Experts narrower than the dense FFN take
slices of it ("granular" upcycling, arXiv 2410.07524): with `d_ff` G times
the experts' width, expert e takes the `(e mod G)`-th of G equal slices of
`d_ff` and its output projection is scaled by G.

When the upcycled model computes what the dense one did at step 0:
* top-1 routing whose gate is 1 (`TopKFeedForward(k=1, normalize_top_k=True)`),
  or any k with renormalised gates, experts as wide as the dense FFN (G = 1):
  every expert is the dense FFN and the gates sum to 1, whatever the router;
* granular (G > 1), renormalised gates and `k = G`, with
  `router_init="replicated"`: the router's fresh scores of the first E/G
  experts, each repeated for the G experts that hold the slices of one FFN
  copy, so a token picks one whole copy at weight 1/G per slice and the
  tokens still spread over E/G copies; or with `router_init="zero"` (and k a
  multiple of G): all scores tie and every token picks the first k experts;
* as long as no token is dropped (enough capacity, or dropless dispatch).
A Switch router (`SwitchFeedForward`) scales each output by its softmax
probability, so it starts at the dense output times that probability.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from keras_moe.models.variable_paths import relative_paths
from keras_moe.validation import is_number

if TYPE_CHECKING:
    import keras

RouterInit = Literal["fresh", "zero", "replicated"]
ROUTER_INITS = ("fresh", "zero", "replicated")
_FFN_WEIGHTS = ("wi", "wi_0", "wi_1", "wo")


def upcycle_weights(
    sparse: keras.Model,
    dense: keras.Model,
    router_init: RouterInit = "fresh",
    noise_std: float = 0.0,
    seed: int | None = None,
) -> dict[str, list[str]]:
    """Fills a built sparse model with a built dense model's weights, in place.

    Args:
        sparse: the MoE model (e.g. `EncoderDecoder` of a sparse `T5Config`).
        dense: the dense model it is upcycled from: the same d_model, heads,
            vocabulary and layer counts.
        router_init: "fresh" keeps the routers' own initialisation; "zero" sets
            them to 0 (uniform scores); "replicated" repeats the scores of the
            first E/G experts G times (expert e scores as expert e // G did),
            so that granular experts start exactly at the dense FFN.
        noise_std: each expert's weights are multiplied by `1 + N(0, noise_std)`,
            drawn per element and per expert (0: exact copies).
        seed: seed of that noise.

    Returns:
        lists of relative variable paths: `copied` (same path, copied exactly),
        `experts` (filled from the dense FFN), `routers` and `fresh` (MoE-layer
        weights the dense model has no counterpart for, e.g. shared experts).

    Raises:
        ValueError: a bad `router_init` or `noise_std`; a `dense` model with MoE
            layers or a `sparse` one without; a weight of one model
            with no place in the other, or a shape that differs; experts
            whose width does not divide the dense `d_ff`.

    Example:
    >>> import dataclasses
    >>> import numpy as np
    >>> from keras_moe import TopKFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> dense_config = T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
    ...     num_encoder_layers=2, num_decoder_layers=2, activation="relu")
    >>> sparse_config = dataclasses.replace(dense_config, encoder_sparse_step=2,
    ...     decoder_sparse_step=2, sparse_ffn=TopKFeedForward(num_experts=4, d_ff=32, k=1,
    ...     normalize_top_k=True, eval_capacity_factor=4.0, activation="relu"))
    >>> batch = {"encoder_input_tokens": np.array([[5, 6, 7, 1]]),
    ...          "decoder_input_tokens": np.array([[0, 5, 6]])}
    >>> dense, sparse = EncoderDecoder(dense_config), EncoderDecoder(sparse_config)
    >>> _, _ = dense(batch), sparse(batch)
    >>> report = upcycle_weights(sparse, dense)
    >>> report["experts"][:2]
    ['encoder_layer_1/ffn/experts/wi', 'encoder_layer_1/ffn/experts/wo']
    >>> bool(np.allclose(sparse(batch), dense(batch), atol=1e-5))
    True
    """
    check_upcycle_args(router_init, noise_std)
    rng = np.random.default_rng(seed)
    source, target = relative_paths(dense), relative_paths(sparse)
    for model, paths, role in ((dense, source, "dense"), (sparse, target, "sparse")):
        moe = sorted(p for p in paths if p.rpartition("/")[0].endswith(("/experts", "/router")))
        if (role == "dense") == bool(moe):
            found = (
                f"has MoE layers ({moe[0].rpartition('/')[0].rpartition('/')[0]} ...)"
                if moe
                else "has no MoE layer"
            )
            raise ValueError(
                f"`{role}` {type(model).__name__} {found}: upcycling fills the "
                "experts of a sparse model from a dense model's FFNs."
            )
    report: dict[str, list[str]] = {"copied": [], "experts": [], "routers": [], "fresh": []}
    used = set()
    for path, variable in target.items():
        folder, _, name = path.rpartition("/")
        if path in source:
            _copy(variable, source[path], path)
            used.add(path)
            report["copied"].append(path)
        elif folder.endswith("/experts") and name in _FFN_WEIGHTS:
            dense_path = f"{folder[: -len('/experts')]}/{name}"
            if dense_path not in source:
                raise ValueError(
                    f"sparse weight {path!r} has no dense FFN weight {dense_path!r} to start from."
                )
            variable.assign(
                _expert_values(
                    source[dense_path], tuple(variable.shape), name, path, noise_std, rng
                ).astype(variable.dtype)
            )
            used.add(dense_path)
            report["experts"].append(path)
        elif folder.endswith("/router"):
            if router_init == "zero":
                variable.assign(np.zeros(variable.shape, variable.dtype))
            elif router_init == "replicated":
                slices = _slices(folder[: -len("/router")], source, target)
                variable.assign(_replicated(variable.numpy(), slices, path))
            report["routers"].append(path)
        elif _in_moe_layer(path, source):
            report["fresh"].append(path)
        else:
            raise ValueError(
                f"sparse weight {path!r} has no counterpart in the dense model; "
                "upcycle from a dense model of the same architecture."
            )
    unused = sorted(set(source) - used)
    if unused:
        raise ValueError(
            f"dense weight {unused[0]!r} has no place in the sparse model "
            f"({len(unused)} such); the two models' layers differ."
        )
    return report


def check_upcycle_args(
    router_init: str, noise_std: float, prefix: str = "", error: type[Exception] = ValueError
) -> None:
    """Raises `error` naming `<prefix>router_init` or `<prefix>noise_std` unless
    `router_init` is one of `ROUTER_INITS` and `noise_std` a finite number >= 0."""
    if router_init not in ROUTER_INITS:
        raise error(f"`{prefix}router_init` must be one of {ROUTER_INITS}, got {router_init!r}.")
    if not is_number(noise_std) or not np.isfinite(noise_std) or noise_std < 0:
        raise error(f"`{prefix}noise_std` must be a number >= 0, got {noise_std!r}.")


def expert_slices(num_experts: int, d_ff: int, width: int) -> list[slice]:
    """The slice of `d_ff` each of `num_experts` experts `width` wide starts from:
    expert e takes the (e mod G)-th of the G = d_ff / width equal slices."""
    parts = d_ff // width
    return [slice((e % parts) * width, (e % parts + 1) * width) for e in range(num_experts)]


def _copy(variable, source, path):
    if tuple(source.shape) != tuple(variable.shape):
        raise ValueError(
            f"weight {path!r} has shape {tuple(variable.shape)} in the sparse model "
            f"but {tuple(source.shape)} in the dense model."
        )
    variable.assign(np.asarray(source.numpy(), dtype=variable.dtype))


def _expert_values(source, shape, name, path, noise_std, rng):
    """[E, ...] expert weights from a dense FFN weight: slices of d_ff, wo scaled."""
    value = np.asarray(source.numpy(), dtype=np.float64)
    num_experts, width = shape[0], (shape[2] if name != "wo" else shape[1])
    d_ff = value.shape[1] if name != "wo" else value.shape[0]
    other = value.shape[0] if name != "wo" else value.shape[1]
    if d_ff % width or other != (shape[1] if name != "wo" else shape[2]):
        raise ValueError(
            f"sparse weight {path!r} has shape {shape}; from a dense weight of shape "
            f"{tuple(value.shape)} each expert must be as wide as d_ff={d_ff} or a whole "
            "fraction of it, with the same d_model."
        )
    slices = d_ff // width
    experts = []
    for cut in expert_slices(num_experts, d_ff, width):
        expert = value[:, cut] if name != "wo" else value[cut, :] * slices
        if noise_std:
            expert = expert * (1.0 + rng.normal(0.0, noise_std, expert.shape))
        experts.append(expert)
    return np.stack(experts)


def _slices(ffn, source, sparse_paths):
    """G of the MoE layer at `ffn`: the dense d_ff over its experts' width."""
    dense_wo, experts_wo = source.get(f"{ffn}/wo"), sparse_paths.get(f"{ffn}/experts/wo")
    if dense_wo is None or experts_wo is None:
        return 1
    return max(1, dense_wo.shape[0] // experts_wo.shape[1])


def _replicated(value, slices, path):
    """Router weights [..., E] where expert e takes expert (e // slices)'s column."""
    num_experts = value.shape[-1]
    if num_experts % slices:
        raise ValueError(
            f"router weight {path!r} has {num_experts} experts, not a multiple of "
            f"the {slices} slices of the dense FFN; `router_init='replicated'` "
            "needs whole FFN copies."
        )
    return np.repeat(value[..., : num_experts // slices], slices, axis=-1)


def _in_moe_layer(path, source):
    """True for a weight inside an FFN whose dense counterpart is a plain FFN."""
    folder = path.split("/ffn/")[0] + "/ffn" if "/ffn/" in path else None
    return folder is not None and any(f"{folder}/{n}" in source for n in _FFN_WEIGHTS)
