"""Initialising a dense student from a sparse teacher (Switch Transformer §4.2).

The paper initialises the student with the teacher's non-expert weights. Here
a student variable is *shared* when the teacher has a variable at the same
path relative to its model (e.g. `encoder_layer_0/attention/query`,
`token_embedding/embeddings`, `decoder_layer_1/ffn_norm/scale`,
`encoder_position_bias/embeddings`, and `encoder_layer_0/ffn/wi` when layer 0
is dense in both). Shared variables are copied exactly. A dense FFN at a
position where the teacher has experts (`.../ffn/wi` in the student against
`.../ffn/experts/wi` and `.../ffn/router/kernel` in the teacher) has no shared
path: by default it keeps its fresh initialisation; `expert_init="mean"`
(mean of the experts) or `"expert0"` (the first expert) fill it from the
experts instead. The router is never copied.
"""

from keras import ops

from keras_moe.models.dense_config import dense_student_config as dense_student_config
from keras_moe.models.variable_paths import relative_paths

EXPERT_INITS = ("none", "mean", "expert0")


def _expert_source(teacher_paths, student_path):
    """Teacher expert variable for a student dense FFN variable `.../ffn/<name>`, or None."""
    folder, _, name = student_path.rpartition("/")
    if not folder.endswith("ffn"):
        return None
    return teacher_paths.get(f"{folder}/experts/{name}")


def init_student_from_teacher(student, teacher, expert_init="none"):
    """Copies the teacher's shared (non-expert) weights into the student, in place.

    Args:
        student: a built `EncoderDecoder` (usually dense).
        teacher: a built `EncoderDecoder` (usually Switch) with the same
            `vocab_size`, `d_model`, heads and layer counts.
        expert_init: what a student FFN gets where the teacher has experts:
            "none" (keep its fresh initialisation; the paper's recipe),
            "mean" (mean of the experts' weights) or "expert0" (expert 0's).

    Returns:
        dict with lists of relative paths: `copied` (shared, copied exactly),
        `from_experts` (filled by `expert_init`), `fresh` (left as initialised).

    Raises:
        ValueError: `expert_init` unknown; a shared path with different shapes.

    Example:
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> teacher = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=2, num_decoder_layers=2, activation="relu",
    ...     encoder_sparse_step=2, decoder_sparse_step=2,
    ...     sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=32, activation="relu")))
    >>> student = EncoderDecoder(dense_student_config(teacher.config))
    >>> report = init_student_from_teacher(student, teacher)
    >>> report["fresh"]  # the dense FFNs where the teacher has experts (layers 1)
    ['encoder_layer_1/ffn/wi', 'encoder_layer_1/ffn/wo',
     'decoder_layer_1/ffn/wi', 'decoder_layer_1/ffn/wo']
    >>> len(report["copied"]), report["from_experts"]
    (44, [])
    >>> report = init_student_from_teacher(student, teacher, expert_init="mean")
    >>> report["from_experts"][:2], report["fresh"]
    (['encoder_layer_1/ffn/wi', 'encoder_layer_1/ffn/wo'], [])
    """
    if expert_init not in EXPERT_INITS:
        raise ValueError(f"`expert_init` must be one of {EXPERT_INITS}, got {expert_init!r}.")
    src = relative_paths(teacher)
    dst = relative_paths(student)
    report = {"copied": [], "from_experts": [], "fresh": []}
    for path, var in dst.items():
        if path in src:
            source = src[path]
            if tuple(source.shape) != tuple(var.shape):
                raise ValueError(
                    f"student variable {path!r} has shape {tuple(var.shape)} but the teacher's "
                    f"has {tuple(source.shape)}; the student must keep the teacher's d_model, "
                    "heads, d_kv, d_ff and vocab_size for its shared weights to be copied."
                )
            var.assign(ops.cast(source.value, var.dtype))
            report["copied"].append(path)
            continue
        experts = _expert_source(src, path) if expert_init != "none" else None
        if experts is not None and tuple(experts.shape[1:]) == tuple(var.shape):
            value = ops.mean(experts.value, axis=0) if expert_init == "mean" else experts.value[0]
            var.assign(ops.cast(value, var.dtype))
            report["from_experts"].append(path)
        elif experts is not None:
            raise ValueError(
                f"`expert_init={expert_init!r}`: student variable {path!r} has shape "
                f"{tuple(var.shape)}, the teacher's experts {tuple(experts.shape)}; set the "
                "student's d_ff (and activation) to the experts' or use expert_init='none'."
            )
        else:
            report["fresh"].append(path)
    return report
