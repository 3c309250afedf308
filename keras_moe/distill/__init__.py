"""Distillation of a sparse (Switch) teacher into a dense student (Switch Transformer §4.2).

- `Distiller`: a `keras.Model` wrapping a frozen teacher and a trainable
  student; its loss mixes hard labels and the teacher's soft targets.
- `init_student_from_teacher`: copies the teacher's non-expert weights.
- `dense_student_config`: the teacher's `T5Config` with dense FFNs.
- `build_distiller`: teacher checkpoint -> initialised student -> `Distiller`
  (gin-configurable; `python -m keras_moe.distill --gin_file=distill.gin`).
- `objective`: `distillation_loss`, `hard_loss`, `soft_loss`, `kl_to_teacher`.
"""

from keras_moe.distill.distillation_objective import (
    distillation_loss,
    hard_loss,
    kl_to_teacher,
    soft_loss,
)
from keras_moe.distill.distiller import Distiller
from keras_moe.distill.distiller_builder import build_distiller, load_teacher, resolve_checkpoint
from keras_moe.distill.init_from_teacher import (
    EXPERT_INITS,
    dense_student_config,
    init_student_from_teacher,
    relative_paths,
)

__all__ = [
    "Distiller",
    "EXPERT_INITS",
    "build_distiller",
    "dense_student_config",
    "distillation_loss",
    "hard_loss",
    "init_student_from_teacher",
    "kl_to_teacher",
    "load_teacher",
    "relative_paths",
    "resolve_checkpoint",
    "soft_loss",
]
