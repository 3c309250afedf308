"""Gin files from before the sparse-FFN spec: their flat `T5Config` MoE fields.

Before `T5Config.sparse_ffn`, a gin file (and every `operative_config.gin` a
run wrote) bound the MoE layer as fields of `T5Config`: `T5Config.moe_type =
'switch'`, `T5Config.num_experts = 8`, `T5Config.aux_loss_factor = 0.01`, ...
`parse_gin` takes these bindings out of gin's config while it parses
(`FlatFieldBindings`) and, once every file and binding is parsed, binds the
spec they make instead (`apply`), with `config.upgrade_flat_moe_fields`, the
function `T5Config.from_dict` uses for saved JSON configs. A file that binds
both the flat fields and a sparse FFN (`T5Config.sparse_ffn = @SwitchFeedForward`
with `T5Config.num_experts = 16`), or flat fields without the `moe_type` every
old file bound, is refused with the binding to write instead.

Example:
>>> from keras_moe.gin_config import parse_gin
>>> config = parse_gin("tiny.gin", ["T5Config.moe_type = 'gshard'", "T5Config.num_experts = 4",
...                                 "T5Config.encoder_sparse_step = 2"])
>>> config.sparse_ffn["class_name"], config.num_experts
('keras_moe>GShardFeedForward', 4)
>>> parse_gin("switch_tiny.gin", "T5Config.num_experts = 16")
Traceback (most recent call last):
...
keras_moe.gin_config.errors.GinConfigError: `T5Config.num_experts` is no longer a field of T5Config: ...bind `SwitchFeedForward.num_experts = ...` instead.
"""  # noqa: E501 - verbatim output lines

from keras_moe import compat
from keras_moe.gin_config.errors import GinConfigError
from keras_moe.models import config as config_lib
from keras_moe.models import flat_moe_fields

# The sparse FFN layer's argument that each flat field became.
LAYER_ARGUMENTS = {
    **{name: name for name in flat_moe_fields.FLAT_FIELDS if name != "moe_type"},
    "expert_d_ff": "d_ff",
    "expert_activation": "activation",
}
# The T5Config fields the translation reads besides the flat ones.
_READ = (
    "d_ff",
    "activation",
    "init_scale",
    "num_encoder_layers",
    "num_decoder_layers",
    "encoder_sparse_step",
    "decoder_sparse_step",
    "encoder_sparse_layers",
    "decoder_sparse_layers",
)
_SPARSE_FFNS = ("sparse_ffn", "encoder_sparse_ffn", "decoder_sparse_ffn")


class FlatFieldBindings:
    """Collects the flat MoE field bindings of `T5Config` while gin parses, leaving
    them out of gin's config (use `intercept` with `compat.gin_binding_hook`)."""

    def __init__(self):
        self.found = {}  # scope -> {field: parsed value}

    def intercept(self, scope, selector, name, value):
        if selector.rsplit(".", 1)[-1] != "T5Config" or name not in flat_moe_fields.FLAT_FIELDS:
            return False
        self.found.setdefault(scope, {})[name] = value
        return True


def _bound(scope, name):
    import gin

    prefix = f"{scope}/" if scope else ""
    try:
        return True, gin.query_parameter(f"{prefix}T5Config.{name}")
    except ValueError:
        return False, None


def _resolved(value):
    """A macro's value (`%D_FF` -> 64); anything else as parsed."""
    import gin.config

    for _ in range(100):  # macros of macros; gin refuses cycles when they are read
        if not (
            isinstance(value, gin.config.ConfigurableReference) and value.selector == "gin.macro"
        ):
            break
        value = compat.gin_macro_value(value.scoped_selector.rsplit("/", 1)[0])
    return value


def _layer_name(value):
    """How a gin file names the sparse FFN `value` (`encoder/SwitchFeedForward`)."""
    import gin.config

    if isinstance(value, gin.config.ConfigurableReference):
        return "/".join(list(value.scopes) + [value.configurable.name])
    if isinstance(value, dict) and isinstance(value.get("class_name"), str):
        return value["class_name"].split(">")[-1]
    return type(value).__name__


def _replacement(field, layer):
    if field == "moe_type":
        return (
            f"the layer class bound to `T5Config.sparse_ffn` is the MoE type: "
            f"bind `T5Config.sparse_ffn = @{layer}` (SwitchFeedForward: top-1, "
            "GShardFeedForward: top-2) instead"
        )
    return f"bind `{layer}.{LAYER_ARGUMENTS[field]} = ...` instead"


def apply(bindings):
    """Binds `T5Config.sparse_ffn` (in each scope) to the spec that the collected
    flat fields make; raises `GinConfigError` naming the replacement binding when
    they cannot come from an old file.

    Args:
        bindings: a `FlatFieldBindings` that saw the whole parse.
    """
    import gin

    for scope, flat in sorted(bindings.found.items()):
        prefix = f"{scope}/" if scope else ""
        first = sorted(flat, key=lambda name: (name != "moe_type", name))[0]
        what = f"`{prefix}T5Config.{first}` is no longer a field of T5Config: "
        layers = [
            value
            for name in _SPARSE_FFNS
            for found, value in [_bound(scope, name)]
            if found and value is not None
        ]
        if layers:
            layer = _layer_name(_resolved(layers[0]))
            raise GinConfigError(
                what + f"the model's sparse layer is {layer} (T5Config.sparse_ffn), which "
                f"owns its arguments; {_replacement(first, layer)}."
            )
        if "moe_type" not in flat:
            raise GinConfigError(
                what + "the sparse layer owns its arguments: bind `T5Config.sparse_ffn = "
                f"@SwitchFeedForward` (or @GShardFeedForward) and "
                f"`SwitchFeedForward.{LAYER_ARGUMENTS[first]} = ...` instead (a gin file "
                "from before the sparse-FFN spec, which also binds T5Config.moe_type, is "
                "translated)."
            )
        values = {
            name: _resolved(value)
            for name in _READ
            for found, value in [_bound(scope, name)]
            if found
        }
        values.update({name: _resolved(value) for name, value in flat.items()})
        try:
            spec = config_lib.upgrade_flat_moe_fields(values)["sparse_ffn"]
        except (TypeError, ValueError) as e:
            raise GinConfigError(
                f"the T5Config MoE fields {sorted(flat)} (a gin file from "
                f"before the sparse-FFN spec) make no sparse FFN: {e}"
            ) from None
        if spec is not None:
            gin.bind_parameter(f"{prefix}T5Config.sparse_ffn", spec)
