"""A sparsified keras-hub model on a JAX mesh of 8 emulated CPU devices.

Run by tests/keras_hub/test_sparsify.py with the folder of the tiny HF checkpoints;
prints one "OK <family>" line per family: logits on the mesh equal the one-device
model's, every expert weight is split over the "expert" axis, and the compiled
forward moves tokens by all-to-all without gathering any expert weight.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import re  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import keras_moe  # noqa: E402
from tests.keras_hub import checks  # noqa: E402

warnings.filterwarnings("ignore", message=".*dropless.*")
MESH = {"data": 2, "expert": 4}


def expert_weights(model):
    return [v for v in model.weights if re.search(r"/experts/(wi|wo|bi|bo)", v.path)]


def compiled_forward(model, inputs):
    """`(logits, hlo)` of one compiled forward (an eager forward on 8 devices is far slower)."""
    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]
    run = jax.jit(lambda t, o, x: model.stateless_call(t, o, x)[0])
    compiled = run.lower(trainable, other, inputs).compile()
    return np.asarray(compiled(trainable, other, inputs)), compiled.as_text()


def check(folder, family):
    # 8 sequences: the batch splits over all 8 devices, so each routes its own tokens
    # (a batch the mesh cannot split is one routing group, and GSPMD gathers).
    inputs = checks.batch(lengths=(9, 6, 9, 7, 9, 8, 5, 9))
    want = checks.logits(checks.load(folder), inputs)
    keras_moe.parallel.sharding.configure_mesh(MESH)
    try:
        model = checks.load(folder)
        weights = expert_weights(model)
        assert weights, "no expert weights"
        for variable in weights:
            spec = variable.value.sharding.spec
            assert spec[0] == "expert", (variable.path, spec)
        got, hlo = compiled_forward(model, inputs)
        mask = inputs["padding_mask"] > 0
        checks.assert_close(got[mask], want[mask], f"{family} on the mesh vs one device")
        assert "all-to-all" in hlo, f"{family}: no all-to-all in the compiled forward"
        full_shapes = {tuple(v.shape) for v in weights}
        gathered = {
            tuple(int(n) for n in dims.split(","))
            for dims in re.findall(r"= \w+\[([\d,]+)\]\S* all-gather\(", hlo)
        }
        assert not gathered & full_shapes, f"{family}: expert weights all-gathered: {gathered}"
    finally:
        keras_moe.parallel.sharding.clear_mesh()
    print(f"OK {family}", flush=True)


if __name__ == "__main__":
    assert len(jax.devices()) == 8
    for family in sys.argv[2:]:
        check(os.path.join(sys.argv[1], family), family)
