"""The sparse-FFN spec of a T5 model: which MoE layer its sparse layers are.

`T5Config.sparse_ffn` takes the layer the way Flaxformer injects its sparse
FFN: a factory (a layer class, a `functools.partial`, or a gin reference such
as `@SwitchFeedForward`) or an unbuilt template layer. The config keeps it as
plain data, `{"class_name": <Keras registered name>, "config": <the layer's
get_config>}`, so it is saved with checkpoints and each sparse layer of the
model is a fresh layer rebuilt from it. The layer validates its own arguments
when the spec is made, before any weight exists.

What the model decides is not part of the spec: the layer's name and dtype
policy, `causal` (decoder), `track_metrics` and `metrics_prefix`, and
`pad_to_group_size` with an integer `group_size` (sequences of any length).

Example:
>>> import functools
>>> from keras_moe import SwitchFeedForward
>>> spec = normalize_spec(functools.partial(SwitchFeedForward, num_experts=4, d_ff=8))
>>> spec["class_name"], spec["config"]["num_experts"], spec["config"]["d_ff"]
('keras_moe>SwitchFeedForward', 4, 8)
>>> layer = make_layer(spec, name="ffn", causal=True)
>>> type(layer).__name__, layer.causal, layer.num_experts
('SwitchFeedForward', True, 4)
"""

import copy
import random

import keras

from keras_moe import compat
from keras_moe.moe import MoeLayer

# Set by the model for each layer, never taken from the spec.
MODEL_DECIDED = ("name", "dtype", "trainable", "causal", "track_metrics", "metrics_prefix",
                 "return_metrics")

# T5Config's MoE fields before the spec, and their defaults then: old
# checkpoints' configs hold these (see `spec_from_flat_fields`).
FLAT_FIELDS = dict(
    moe_type=None, num_experts=0, expert_d_ff=None, expert_activation=None,
    train_capacity_factor=1.25, eval_capacity_factor=2.0, min_expert_capacity=4,
    group_size="batch", jitter_noise=0.0, expert_dropout_rate=0.0, router_init_scale=None,
    aux_loss_factor=1e-2, z_loss_factor=1e-3, dispatch="auto", router_bias=False,
    router_dtype="float32",
)


def _layer_class(class_name):
    layer_class = keras.saving.get_registered_object(class_name)
    if layer_class is None or not (isinstance(layer_class, type)
                                   and issubclass(layer_class, MoeLayer)):
        raise ValueError(f"`sparse_ffn` must name a registered keras_moe MoeLayer class, "
                         f"got {class_name!r}.")
    return layer_class


def _strip(config):
    config = {k: v for k, v in config.items() if k not in MODEL_DECIDED}
    for key in ("experts", "shared_experts"):  # a MoeLayer's own FFNs follow the model's policy
        sub = config.get(key)
        if isinstance(sub, dict):
            sub = copy.deepcopy(sub)
            sub.get("config", {}).pop("dtype", None)
            config[key] = sub
    return config


def normalize_spec(value, causal=False):
    """The spec of `value` as plain data (see `_normalize`); an argument the
    layer refuses is reported as the sparse FFN's. Making the spec leaves the
    random stream alone: the validation layer's seed generators draw from
    Python's `random`, which `keras.utils.set_random_seed` also seeds for the
    weights. Nor does it start the backend: the validation layer's variables
    are never initialised (see `compat.without_backend_state`)."""
    state = random.getstate()
    try:
        with compat.without_backend_state():
            return _normalize(value, causal)
    except (ValueError, TypeError) as error:
        if str(error).startswith("`sparse_ffn`"):
            raise
        # Not type(error): gin re-raises errors of its configurables as subclasses
        # whose constructor takes no message.
        kind = ValueError if isinstance(error, ValueError) else TypeError
        raise kind(f"`sparse_ffn`: {error}") from error
    finally:
        random.setstate(state)


def _normalize(value, causal):
    """The spec of `value` as plain data, after the layer has validated it.

    Args:
        value: a MoeLayer instance (a template, never built), a callable
            returning one (class, partial, gin reference), or a spec dict.
        causal: make the validation layer causal (the decoder's spec), so a
            router that cannot run causally is refused here.

    Returns:
        `{"class_name": ..., "config": ...}` without the model-decided keys.
    """
    if isinstance(value, dict):
        if set(value) != {"class_name", "config"}:
            raise ValueError("a `sparse_ffn` dict must have exactly the keys 'class_name' and "
                             f"'config', got {sorted(value)}.")
        layer = make_layer(value, name="sparse_ffn", causal=causal)
    elif isinstance(value, MoeLayer):
        if value.built:
            raise ValueError("`sparse_ffn` must be an unbuilt template layer (its weights are "
                             "never used); got a built one.")
        layer = make_layer(_describe(value), name="sparse_ffn", causal=causal)
    elif callable(value):
        layer = value(track_metrics=False)
        if not isinstance(layer, MoeLayer):
            raise ValueError("`sparse_ffn` must make a keras_moe MoeLayer, got "
                             f"{type(layer).__name__}.")
        if causal:
            layer = make_layer(_describe(layer), name="sparse_ffn", causal=True)
    else:
        raise ValueError("`sparse_ffn` must be a MoeLayer, a callable making one, or a spec "
                         f"dict, got {type(value).__name__}.")
    return _describe(layer)


def _describe(layer):
    return {"class_name": keras.saving.get_registered_name(type(layer)),
            "config": _strip(layer.get_config())}


def make_layer(spec, name, causal=False, track_metrics=False, metrics_prefix=None):
    """A new layer of `spec` (see `normalize_spec`), named `name`."""
    layer_class = _layer_class(spec["class_name"])
    config = copy.deepcopy(_strip(spec["config"]))
    if isinstance(config.get("group_size"), int) and not isinstance(config["group_size"], bool):
        config["pad_to_group_size"] = True
    # The constructor itself (not `from_config`, which hides its errors in a
    # TypeError that repeats the whole config).
    return layer_class(**config, name=name, causal=causal, track_metrics=track_metrics,
                       metrics_prefix=metrics_prefix)


def spec_option(spec, name):
    """An argument of the spec's layer: its own, else its router's or experts'."""
    config = spec["config"]
    if name in config:
        return config[name]
    for part in ("router", "experts"):
        inner = config.get(part)
        if isinstance(inner, dict) and name in inner.get("config", {}):
            return inner["config"][name]
    raise KeyError(f"the sparse FFN {spec['class_name']} has no argument {name!r}.")


def spec_from_flat_fields(values):
    """The spec of a config saved with the old flat MoE fields (which are removed
    from `values`), or None for a dense one.

    Args:
        values: a `T5Config.to_dict()` of a checkpoint from before the spec.
    """
    flat = {name: values.pop(name, default) for name, default in FLAT_FIELDS.items()}
    if flat["moe_type"] is None:
        return None
    from keras_moe.feedforward import GShardFeedForward, SwitchFeedForward

    layer_class = {"switch": SwitchFeedForward, "gshard": GShardFeedForward}.get(flat["moe_type"])
    if layer_class is None:
        raise ValueError(f"`moe_type` must be None, 'switch' or 'gshard', got "
                         f"{flat['moe_type']!r}.")
    layer = layer_class(
        flat["num_experts"], flat["expert_d_ff"] or values.get("d_ff", 2048),
        activation=flat["expert_activation"] or values.get("activation", "gated-gelu"),
        init_scale=values.get("init_scale", 1.0),
        **{name: flat[name] for name in (
            "train_capacity_factor", "eval_capacity_factor", "min_expert_capacity",
            "group_size", "jitter_noise", "expert_dropout_rate", "router_init_scale",
            "aux_loss_factor", "z_loss_factor", "dispatch", "router_bias", "router_dtype")},
        track_metrics=False)
    return _describe(layer)


def count_sparse_ffn_params(spec, d_model):
    """Weights of one layer of `spec` for `d_model` inputs, without building it."""
    num_experts = spec_option(spec, "num_experts")
    d_ff = spec_option(spec, "d_ff")
    gated = spec_option(spec, "activation").startswith("gated-")
    try:
        bias = spec_option(spec, "router_bias")
    except KeyError:
        bias = spec_option(spec, "use_bias")
    try:
        selection_bias = spec_option(spec, "selection_bias")
    except KeyError:
        selection_bias = False
    routed = num_experts * (3 if gated else 2) * d_model * d_ff + d_model * num_experts + (
        num_experts if bias else 0) + (num_experts if selection_bias else 0)
    return routed + _count_shared_params(spec, d_model, gated)


def _count_shared_params(spec, d_model, gated):
    """Weights of the spec's shared expert (0 without one)."""
    config = spec["config"]
    shared = config.get("shared_experts")
    if isinstance(shared, dict):  # a MoeLayer's own SharedExpertFeedForward
        inner = shared.get("config", {})
        d_ff, gate = inner["d_ff"], inner.get("gate", False)
        gated = inner.get("activation", "gated-silu").startswith("gated-")
    elif config.get("shared_d_ff"):
        d_ff, gate = config["shared_d_ff"], config.get("shared_expert_gate", False)
    else:
        return 0
    return (3 if gated else 2) * d_model * d_ff + (d_model if gate else 0)
