"""The sparse-FFN spec of a T5 model: which MoE layer its sparse layers are.

`T5Config.sparse_ffn` takes the layer the way Flaxformer injects its sparse
FFN: a factory (a layer class, a `functools.partial`, or a gin reference such
as `@SwitchFeedForward`) or an unbuilt template layer. The config keeps it as
plain data, `{"class_name": <Keras registered name>, "config": <the layer's
arguments>}`, so it is saved with checkpoints and each sparse layer of the
model is a fresh layer made from it (`SparseFfnSpec.make_layer`).

Making the spec reads the arguments and builds no layer: a class, a
`functools.partial` of one, a template layer and a spec dict are read as they
are, and `SparseFfnSpec.check` tests them with the layer's own validator
(`MoeLayer.check_arguments`, which its constructor runs too), so a bad value
is refused in the constructor's words before any layer exists. Only a factory
whose arguments are not visible (a gin reference, a function) is called once:
gin injects its bindings at that call, and records them for
`operative_config.gin` only then.

What the model decides is not part of the spec: the layer's name and dtype
policy, `causal` (decoder), `track_metrics` and `metrics_prefix`, and
`pad_to_group_size` with an integer `group_size` (sequences of any length).

Example:
>>> import functools
>>> from keras_moe import SwitchFeedForward
>>> spec = normalize_spec(functools.partial(SwitchFeedForward, num_experts=4, d_ff=8))
>>> spec["class_name"], spec["config"]["num_experts"], spec["config"]["d_ff"]
('keras_moe>SwitchFeedForward', 4, 8)
>>> view = SparseFfnSpec.from_dict(spec)
>>> view.num_experts, view.get("train_capacity_factor")  # the second: the class default
(4, 1.25)
>>> layer = view.make_layer(name="ffn", causal=True)
>>> type(layer).__name__, layer.causal, layer.num_experts
('SwitchFeedForward', True, 4)
"""

import copy
import dataclasses
import functools
import inspect
import random
from typing import Any, Callable, Dict, Optional, Union

import keras

from keras_moe import compat
from keras_moe.layers.moe import MoeLayer
from keras_moe.models.model_decided import MODEL_DECIDED, _refuse_given, _refuse_set_on

_MISSING = object()
SpecValue = Union[Dict[str, Any], MoeLayer, Callable[..., MoeLayer], type]


def _layer_class(class_name):
    layer_class = keras.saving.get_registered_object(class_name)
    if layer_class is None or not (
        isinstance(layer_class, type) and issubclass(layer_class, MoeLayer)
    ):
        raise ValueError(
            f"`sparse_ffn` must name a registered keras_moe MoeLayer class, got {class_name!r}."
        )
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


def _constructor_parameters(layer_class):
    """`{name: inspect.Parameter}` of the named arguments of `layer_class` and of
    the MoeLayer constructors its `**kwargs` reach, the class's own first."""
    params = {}
    for klass in layer_class.__mro__:
        if "__init__" in vars(klass):
            for name, param in inspect.signature(klass.__init__).parameters.items():
                if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    params.setdefault(name, param)
        if klass is MoeLayer:
            break
    return params


@dataclasses.dataclass(frozen=True)
class SparseFfnSpec:
    """A typed view of a sparse-FFN spec dict: its class and its arguments.

    Args:
        class_name: the Keras registered name of a `MoeLayer` class.
        config: the layer's arguments (plain data; the model-decided ones left out).

    Example:
    >>> view = SparseFfnSpec("keras_moe>GShardFeedForward", {"num_experts": 4, "d_ff": 8})
    >>> view.layer_class.__name__, view.num_experts, view.d_ff, view.activation
    ('GShardFeedForward', 4, 8, 'relu')
    >>> view.get("selection_bias", False)  # no such argument: the default given
    False
    """

    class_name: str
    config: Dict[str, Any]

    @classmethod
    def from_dict(cls, spec: Dict[str, Any]) -> "SparseFfnSpec":
        """The view of `{"class_name": ..., "config": ...}` (see `normalize_spec`)."""
        if not isinstance(spec, dict) or set(spec) != {"class_name", "config"}:
            keys = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
            raise ValueError(
                "a `sparse_ffn` dict must have exactly the keys 'class_name' and "
                f"'config', got {keys}."
            )
        return cls(spec["class_name"], spec["config"])

    def to_dict(self) -> Dict[str, Any]:
        return {"class_name": self.class_name, "config": self.config}

    @property
    def layer_class(self) -> type[keras.layers.Layer]:
        return _layer_class(self.class_name)

    def _parts(self):
        """The argument dicts to read, the layer's own first."""
        parts = [self.config]
        for part in ("router", "experts"):
            inner = self.config.get(part)
            if isinstance(inner, dict) and isinstance(inner.get("config"), dict):
                parts.append(inner["config"])
        return parts

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """An argument of the layer: given in the spec (its own, else its router's
        or experts'), else the class's default, else `default`.

        Raises:
            KeyError: the layer has no such argument and no `default` is given.
        """
        for part in self._parts():
            if name in part:
                return part[name]
        param = _constructor_parameters(self.layer_class).get(name)
        if param is not None and param.default is not param.empty:
            return param.default
        if default is not _MISSING:
            return default
        raise KeyError(f"the sparse FFN {self.class_name} has no argument {name!r}.")

    @property
    def num_experts(self) -> int:
        return self.get("num_experts")

    @property
    def d_ff(self) -> int:
        return self.get("d_ff")

    @property
    def activation(self) -> str:
        return self.get("activation")

    def check(self, causal: bool = False) -> None:
        """Checks the arguments by reading them, as the layer's constructor would
        (`MoeLayer.check_arguments`); builds nothing.

        Args:
            causal: the decoder's spec: its router must be able to run causally.

        Raises:
            ValueError / TypeError: naming the argument and what is allowed.
        """

        layer_class = self.layer_class
        name = layer_class.__name__
        params = _constructor_parameters(layer_class)
        unknown = sorted(set(self.config) - set(params))
        if unknown:
            raise TypeError(
                f"`sparse_ffn`: {name} takes no argument `{unknown[0]}` "
                f"(it takes {sorted(params)})."
            )
        own = inspect.signature(layer_class.__init__).parameters.values()
        missing = [
            p.name
            for p in own
            if p.name != "self"
            and p.default is p.empty
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and p.name not in self.config
        ]
        if missing:
            raise TypeError(f"`sparse_ffn`: {name} needs the argument `{missing[0]}`.")
        try:
            layer_class.check_arguments({**self.config, "causal": causal})
        except ValueError as error:
            raise ValueError(f"`sparse_ffn` ({name}): {error}") from error

    def make_layer(
        self,
        name: str,
        causal: bool = False,
        track_metrics: bool = False,
        metrics_prefix: Optional[str] = None,
    ) -> MoeLayer:
        """A new layer of the spec, named `name`."""
        config = copy.deepcopy(_strip(self.config))
        if isinstance(config.get("group_size"), int) and not isinstance(config["group_size"], bool):
            config["pad_to_group_size"] = True
        # The constructor itself (not `from_config`, which hides its errors in a
        # TypeError that repeats the whole config).
        return self.layer_class(
            **config,
            name=name,
            causal=causal,
            track_metrics=track_metrics,
            metrics_prefix=metrics_prefix,
        )


def normalize_spec(value: SpecValue, causal: bool = False) -> Dict[str, Any]:
    """The spec of `value` as plain data, checked (`SparseFfnSpec.check`).

    Args:
        value: a MoeLayer class, a `functools.partial` of one, an unbuilt
            template layer, a spec dict, or another callable making a MoeLayer
            (a gin reference: called once, as gin injects bindings then).
        causal: the decoder's spec: its router must be able to run causally.

    Returns:
        `{"class_name": ..., "config": ...}` without the model-decided keys.
    """
    state = random.getstate()
    try:
        spec = SparseFfnSpec.from_dict(_describe_value(value))
        spec.check(causal)
        return {"class_name": spec.class_name, "config": _canonical(spec.layer_class, spec.config)}
    except (ValueError, TypeError) as error:
        if str(error).startswith("`sparse_ffn`"):
            raise
        # Not type(error): gin re-raises errors of its configurables as subclasses
        # whose constructor takes no message.
        kind = ValueError if isinstance(error, ValueError) else TypeError
        raise kind(f"`sparse_ffn`: {error}") from error
    finally:
        # A called factory's seed generators draw from Python's `random`, which
        # `keras.utils.set_random_seed` also seeds for the weights.
        random.setstate(state)


def _same(value, default):
    return value is default or (type(value) is type(default) and value == default)


def _canonical(layer_class, config):
    """One form of the arguments whichever way they were given (a partial, a
    template's `get_config`, a dict): every argument of the class's own
    constructor, its default where not given; the arguments it passes on to
    `MoeLayer` only where they differ from their default."""
    own = {
        p.name: p.default
        for p in inspect.signature(layer_class.__init__).parameters.values()
        if p.default is not p.empty and p.name not in MODEL_DECIDED
    }
    inherited = _constructor_parameters(layer_class)
    out = dict(own, **config)
    return {
        k: v
        for k, v in out.items()
        if k in own or k not in inherited or not _same(v, inherited[k].default)
    }


def _is_registered_class(value):
    return (
        isinstance(value, type)
        and issubclass(value, MoeLayer)
        and keras.saving.get_registered_object(keras.saving.get_registered_name(value)) is value
    )


def _plain(value):
    if isinstance(value, keras.layers.Layer):
        return keras.saving.serialize_keras_object(value)
    return value


def _describe_value(value):
    if isinstance(value, dict):
        return value
    if isinstance(value, MoeLayer):
        if value.built:
            raise ValueError(
                "`sparse_ffn` must be an unbuilt template layer (its weights are "
                "never used); got a built one."
            )
        _refuse_set_on(value)
        return _describe(value)
    func, args, kwargs = value, (), {}
    if isinstance(value, functools.partial):
        func, args, kwargs = value.func, value.args, dict(value.keywords)
    if _is_registered_class(func):
        params = list(_constructor_parameters(func))
        if len(args) > len(params):
            raise TypeError(
                f"`sparse_ffn`: {func.__name__} takes at most {len(params)} "
                f"positional arguments, got {len(args)}."
            )
        for name, arg in zip(params, args, strict=False):
            if name in kwargs:
                raise TypeError(f"`sparse_ffn`: `{name}` is given twice.")
            kwargs[name] = arg
        _refuse_given(kwargs, f"`sparse_ffn` {func.__name__}")
        return {
            "class_name": keras.saving.get_registered_name(func),
            "config": _strip({k: _plain(v) for k, v in kwargs.items()}),
        }
    if callable(value):
        with compat.without_backend_state():
            layer = value(track_metrics=False)
        if not isinstance(layer, MoeLayer):
            raise ValueError(
                f"`sparse_ffn` must make a keras_moe MoeLayer, got {type(layer).__name__}."
            )
        _refuse_set_on(layer)
        return _describe(layer)
    raise ValueError(
        "`sparse_ffn` must be a MoeLayer, a callable making one, or a spec "
        f"dict, got {type(value).__name__}."
    )


def _describe(layer):
    return {
        "class_name": keras.saving.get_registered_name(type(layer)),
        "config": _strip(layer.get_config()),
    }


def make_layer(
    spec: Dict[str, Any],
    name: str,
    causal: bool = False,
    track_metrics: bool = False,
    metrics_prefix: Optional[str] = None,
) -> MoeLayer:
    """A new layer of the spec dict `spec` (see `SparseFfnSpec.make_layer`)."""
    return SparseFfnSpec.from_dict(spec).make_layer(
        name, causal=causal, track_metrics=track_metrics, metrics_prefix=metrics_prefix
    )


def count_sparse_ffn_params(spec: Dict[str, Any], d_model: int) -> int:
    """Weights of one layer of `spec` for `d_model` inputs, without building it."""
    view = SparseFfnSpec.from_dict(spec)
    num_experts, d_ff = view.num_experts, view.d_ff
    gated = view.activation.startswith("gated-")
    bias = view.get("router_bias", None)
    if bias is None:
        bias = view.get("use_bias", False)
    selection_bias = view.get("selection_bias", False)
    routed = (
        num_experts * (3 if gated else 2) * d_model * d_ff
        + d_model * num_experts
        + (num_experts if bias else 0)
        + (num_experts if selection_bias else 0)
    )
    return routed + _count_shared_params(view, d_model, gated)


def _count_shared_params(view, d_model, gated):
    """Weights of the spec's shared expert (0 without one)."""
    config = view.config
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
