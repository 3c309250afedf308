"""A MoE run started from a dense checkpoint: weights upcycled, optimizer state and step carried.

`keras_moe.models.upcycle.upcycle_weights` fills the experts from each layer's
dense FFN. The optimizer's per-variable state follows the same map: a copied
weight's slots are copied; an expert's slots are the dense FFN's, sliced like
the weight for granular experts. Adafactor's factored second moments (`r`,
the mean over the last axis of the squared gradient, and `c`, the mean over
the second-last) are estimated for a slice from the factored form
`v ~ r c / mean(c)`: a slice of `d_ff` keeps its exact `c` (or `r`) entries,
and the other factor is scaled by the slice's share. Routers start with empty
slots. The step counter is the dense run's, so schedules continue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from keras_moe.convert import from_hf, is_hf_folder
from keras_moe.models import EncoderDecoder
from keras_moe.models.dense_config import dense_student_config
from keras_moe.models.upcycle import (
    RouterInit,
    check_upcycle_args,
    expert_slices,
    upcycle_weights,
)
from keras_moe.models.variable_paths import relative_paths
from keras_moe.training.checkpoint.checkpoint_restore import resolve_checkpoint, skipped_variables
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log

if TYPE_CHECKING:
    import keras

# The optimizers' per-variable slot lists (Keras 3): Adafactor, Adam/AdamW/Lion, SGD.
_SLOT_LISTS = ("_r", "_c", "_v", "_momentums", "_velocities", "_velocity_hats", "momentums")


@dataclasses.dataclass
class Upcycle:
    """How a sparse run starts from a dense `init_checkpoint` (gin:
    `CheckpointConfig.upcycle = @Upcycle()`; see `gin/runs/upcycle.gin`).

    Args:
        router_init: "fresh" (the router's own initialisation), "zero" or "replicated"
            (granular experts; see `keras_moe.models.upcycle`).
        noise_std: multiplicative noise on each expert's copy (0: exact).
        seed: seed of that noise.
        optimizer_state: carry the dense run's optimizer state and step
            (False: the optimizer starts empty at step 0).

    Example:
    >>> Upcycle(router_init="zero").check()
    Upcycle(router_init='zero', noise_std=0.0, seed=None, optimizer_state=True)
    >>> Upcycle(router_init="uniform").check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: `Upcycle.router_init` must be one of ('fresh', 'zero', 'replicated'), got 'uniform'.
    """  # noqa: E501 - verbatim output lines

    router_init: RouterInit = "fresh"
    noise_std: float = 0.0
    seed: int | None = None
    optimizer_state: bool = True

    def check(self) -> Upcycle:
        """Checks every setting; returns self. Raises `TrainingConfigError` naming it."""
        check_upcycle_args(self.router_init, self.noise_std, "Upcycle.", TrainingConfigError)
        if not isinstance(self.optimizer_state, bool):
            raise TrainingConfigError(
                f"`Upcycle.optimizer_state` must be True or False, got {self.optimizer_state!r}."
            )
        return self

    def load(
        self,
        model: keras.Model,
        dense: keras.Model,
        source: str,
        probe: Callable[[], Any] | None = None,
    ) -> dict:
        """Fills the built, compiled sparse `model` from the `dense` model (its
        weights and, when compiled and built, its optimizer), logs it, and returns
        `upcycle_weights`' report plus `step` and, with `probe` (a function giving
        a batch of model inputs, e.g. the first training batch), `start_gap`: the
        largest difference of the two models' logits on it (`start_gap`)."""
        try:
            # `upcycle_weights` lists of paths; `step` and `start_gap` are added below.
            report: dict[str, Any] = upcycle_weights(
                model, dense, self.router_init, self.noise_std, self.seed
            )
        except ValueError as e:
            raise TrainingConfigError(f"cannot upcycle {source}: {e}") from None
        step = 0
        if (
            self.optimizer_state
            and getattr(dense, "optimizer", None) is not None
            and dense.optimizer.built
        ):
            carry_optimizer_state(model, dense, report)
            step = int(dense.optimizer.iterations.numpy())
        report["step"] = step
        log(
            f"upcycled {source} into {len(report['experts'])} expert weights "
            f"({len(report['routers'])} routers {self.router_init}), continuing at step {step}"
        )
        if probe is not None:
            report["start_gap"], mode = start_gap(model, dense, probe())
            meant_exact = self.noise_std == 0 and (
                _top1_renormalised(model) or self.router_init == "replicated"
            )
            gap = f"{report['start_gap']:.2g} ({mode} mode)"
            if report["start_gap"] <= 1e-3:
                log(
                    f"upcycled start: the first batch's logits are the dense model's "
                    f"(largest difference {report['start_gap']:.2g}, {mode} mode)"
                )
            elif meant_exact:
                log(
                    f"warning: upcycled start: the first batch's logits differ from the dense "
                    f"model's by up to {gap}: tokens over an expert's capacity get 0 from the "
                    'MoE branch; dispatch="dropless" (or a capacity no expert exceeds) starts '
                    "exactly"
                )
            else:
                log(
                    f"upcycled start: the first batch's logits differ from the dense model's by "
                    f"up to {gap}, as this router initialisation or noise makes them"
                )
        return report


def _top1_renormalised(model) -> bool:
    """Whether the model's experts start as copies whose gate is 1 whatever the router
    says (top-1 with `normalize_top_k`): then a fresh router starts exactly too."""
    config = getattr(model, "config", None)
    return (
        config is not None
        and config.sparse_option("k", 1) == 1
        and bool(config.sparse_option("normalize_top_k", False))
    )


def start_gap(sparse: keras.Model, dense: keras.Model, inputs: Any) -> tuple[float, str]:
    """The largest absolute difference of the two models' logits on `inputs`, and the
    mode it was measured in: "training" (the first step's routing and capacity) when
    the sparse model draws no random numbers in training (no dropout, jitter or
    expert dropout), else "inference"."""
    config = sparse.config
    # A training call of a layer with loss-free balancing would also move its bias.
    noisy = config.dropout_rate or any(
        config.sparse_option(name, 0.0)
        for name in ("jitter_noise", "expert_dropout_rate", "bias_update_rate")
    )
    training = not noisy
    gap = np.max(
        np.abs(
            np.asarray(sparse(inputs, training=training), np.float64)
            - np.asarray(dense(inputs, training=training), np.float64)
        )
    )
    return float(gap), "training" if training else "inference"


def dense_model_for(
    model: keras.Model, optimizer_like: keras.optimizers.Optimizer | None
) -> keras.Model:
    """The dense `EncoderDecoder` a sparse model upcycles from: the sparse
    config with every MoE layer a dense FFN of `d_ff`, compiled with an
    optimizer of the same class and settings (its state not yet built)."""

    config = getattr(model, "config", None)
    if config is None or not config.is_sparse:
        raise TrainingConfigError(
            "`CheckpointConfig.upcycle` needs a sparse keras_moe model "
            "(a T5Config with MoE layers) to upcycle into."
        )
    dense = EncoderDecoder(dense_student_config(config))
    if optimizer_like is not None:
        optimizer = optimizer_like.__class__.from_config(optimizer_like.get_config())
        dense.compile(**dense.compile_defaults(optimizer=optimizer))
    return dense


def load_upcycled(
    model: keras.Model, path: str, upcycle: Upcycle, probe: Callable[[], Any] | None = None
) -> dict:
    """Starts the sparse `model` from the dense model at `path` (`Upcycle.load`).

    Args:
        model: the built, compiled sparse model.
        path: a dense keras_moe `.weights.h5`, model dir or checkpoint folder
            (its weights and optimizer state), or a Hugging Face T5 folder
            (weights only: the optimizer starts at step 0).
        upcycle: how (router, noise, optimizer state).
        probe: a function giving a batch of model inputs on which the start is
            compared with the dense model's (`Upcycle.load`).

    Returns:
        `Upcycle.load`'s report.

    Raises:
        TrainingConfigError: when the checkpoint is not the dense form of the model.
    """

    if is_hf_folder(path):
        return upcycle.load(model, from_hf(path), f"Hugging Face checkpoint {path}", probe)
    weights = resolve_checkpoint(path, "init_checkpoint")
    carry = upcycle.optimizer_state and model.optimizer is not None
    dense = dense_model_for(model, model.optimizer if carry else None)
    if carry:
        dense.optimizer.build(dense.trainable_variables)
    try:
        skipped = skipped_variables(lambda: dense.load_weights(weights))
    except (ValueError, KeyError, OSError) as e:
        raise TrainingConfigError(
            f"init_checkpoint {weights} is not the dense form of the configured sparse model: {e}"
        ) from None
    if skipped and carry:
        raise TrainingConfigError(
            f"init_checkpoint {weights} does not hold this run's optimizer state "
            f"({skipped[0].strip()}); bind `Upcycle.optimizer_state = False` to start the "
            "optimizer afresh."
        )
    return upcycle.load(model, dense, f"checkpoint {weights}", probe)


def carry_optimizer_state(sparse: keras.Model, dense: keras.Model, report: dict) -> None:
    """Sets the sparse model's optimizer slots and step from the dense model's,
    following `report` (`upcycle_weights`' map). Both optimizers must be of one
    class; the sparse one is built here if it is not yet."""
    target, origin = sparse.optimizer, dense.optimizer
    if type(target) is not type(origin):
        raise TrainingConfigError(
            f"the dense run's optimizer is {type(origin).__name__}, this "
            f"run's {type(target).__name__}; carry state only between "
            "the same optimizer."
        )
    if not target.built:
        target.build(sparse.trainable_variables)
    dense_vars, sparse_vars = relative_paths(dense), relative_paths(sparse)
    dense_slots = _slots(origin, dense.trainable_variables, dense_vars)
    sparse_slots = _slots(target, sparse.trainable_variables, sparse_vars)
    for path in report["copied"]:
        for name, slot in sparse_slots.get(path, {}).items():
            slot.assign(dense_slots[path][name].value)
    for path in report["experts"]:
        folder, _, weight = path.rpartition("/")
        dense_path = f"{folder[: -len('/experts')]}/{weight}"
        d_ff = dense_vars[dense_path].shape[0 if weight == "wo" else 1]
        width = sparse_vars[path].shape[1 if weight == "wo" else 2]
        for name, slot in sparse_slots.get(path, {}).items():
            value = _expert_slot(
                dense_slots[dense_path], name, weight, tuple(slot.shape), d_ff, width
            )
            slot.assign(value.astype(slot.dtype))
    target.iterations.assign(origin.iterations.value)


def _slots(optimizer, variables, paths):
    """{relative path: {slot list name: slot variable}}; refuses state it cannot map."""
    by_id = {id(v): p for p, v in paths.items()}
    out = {by_id[id(v)]: {} for v in variables if id(v) in by_id}
    mapped = {id(optimizer.iterations)}
    for attr in _SLOT_LISTS:
        slots = getattr(optimizer, attr, None)
        if not isinstance(slots, list) or len(slots) != len(variables):
            continue
        for variable, slot in zip(variables, slots, strict=True):
            if slot is not None and id(variable) in by_id:
                out[by_id[id(variable)]][attr] = slot
                mapped.add(id(slot))
    learning_rate = getattr(optimizer, "_learning_rate", None)
    unmapped = [
        v.path for v in optimizer.variables if id(v) not in mapped and v is not learning_rate
    ]
    if unmapped:
        raise TrainingConfigError(
            f"{type(optimizer).__name__}'s state {unmapped[0]!r} has no known place; bind "
            "`Upcycle.optimizer_state = False` to start the optimizer afresh."
        )
    return out


def _expert_slot(slots, name, weight, shape, d_ff, width):
    """One sparse expert slot [E, ...] from the dense FFN weight's slots: the
    experts are `width` wide, expert e takes slice `e mod (d_ff / width)`."""
    value = np.asarray(slots[name].numpy(), dtype=np.float64)
    if value.ndim == 0:  # Adafactor's placeholder of an unfactored variable
        return np.broadcast_to(value, shape).copy()
    cuts = expert_slices(shape[0], d_ff, width)
    if name not in ("_r", "_c"):  # a slot of the weight's own shape
        return np.stack([value[:, cut] if weight != "wo" else value[cut, :] for cut in cuts])
    # wi [d_model, d_ff]: c runs over d_ff, r over d_model; wo [d_ff, d_model]: the reverse.
    over_d_ff = "_c" if weight != "wo" else "_r"
    if name == over_d_ff:
        return np.stack([value[cut] for cut in cuts])
    d_ff_factor = np.asarray(slots[over_d_ff].numpy(), dtype=np.float64)
    mean = d_ff_factor.mean()
    return np.stack([value * (d_ff_factor[cut].mean() / mean if mean > 0 else 1.0) for cut in cuts])
