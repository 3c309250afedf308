"""`keras.Model` mixin: `fit`, `evaluate` and `predict` follow `route_each_sequence()`.

The scope is read when the MoE layers are traced. Keras traces a model's train,
test and predict functions once and keeps them, so without this mixin a function
traced outside the scope would go on routing whole batches inside it (and the
other way round). The mixin drops a kept function that was traced under the
other mode, so the next call traces it again.
"""

from __future__ import annotations

from typing import Any

from keras_moe.mixin_bases import ModelMixinBase
from keras_moe.routing.scope import route_each_sequence, routing_each_sequence

_FUNCTIONS = {
    "fit": ("train_function", "test_function"),
    "evaluate": ("test_function",),
    "predict": ("predict_function",),
}


EVAL_ROUTINGS = ("groups", "sequence")


class RoutingScopeMixin(ModelMixinBase):
    """Makes `fit`/`evaluate`/`predict` trace again when the thread's
    `keras_moe.route_each_sequence()` scope differs from the one their kept function
    was traced in (`EncoderDecoder` has it), and routes evaluation as `eval_routing` says.

    `eval_routing`: "groups" (default): evaluation (`evaluate`, and `fit`'s
    validation) routes as training does, in the MoE layers' groups, which on
    several devices are each device's share of the batch, so a loss depends on
    the device count; "sequence": each sequence is routed apart, so the loss is
    the same on any number of devices and in any batch (train.eval_routing).
    """

    eval_routing = "groups"

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.eval_routing not in EVAL_ROUTINGS:
            raise ValueError(
                f"`eval_routing` must be one of {EVAL_ROUTINGS}, got {self.eval_routing!r}."
            )
        if self.eval_routing == "sequence":
            with route_each_sequence():
                return super().test_step(*args, **kwargs)
        return super().test_step(*args, **kwargs)

    def _follow_routing_scope(self, method: str) -> None:
        mode = (routing_each_sequence(), self.eval_routing)
        traced = self.__dict__.setdefault("_routing_scope_traced", {})
        for name in _FUNCTIONS[method]:
            if traced.get(name, mode) != mode:
                setattr(self, name, None)
            traced[name] = mode

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self._follow_routing_scope("fit")
        return super().fit(*args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        self._follow_routing_scope("evaluate")
        return super().evaluate(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        self._follow_routing_scope("predict")
        return super().predict(*args, **kwargs)
