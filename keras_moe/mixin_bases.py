"""The bases a type checker sees for this package's mixins of Keras classes.

A mixin such as `FeedForwardMixin` calls `self.add_weight` or `super().fit`, which
exist on the Keras class it is mixed into. At run time its base is `object`, so the
method resolution order is the one the concrete class spells out; a type checker
sees the Keras class instead.

Example:
>>> LayerMixinBase is object and ModelMixinBase is object
True
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

    LayerMixinBase = keras.layers.Layer
    ModelMixinBase = keras.Model
else:
    LayerMixinBase = ModelMixinBase = object
