"""`keras-moe-compile`'s progress lines, its advice when a step does not fit, and quiet starts.

The stage lines of a real compile are checked in test_compile_only.py (on the
tiny v5e:2x2 compile it runs anyway); here: the heartbeat, the memory advice
on a fake buffer assignment, the activation all-gather heuristic on fake HLO,
the refusal of a slice libtpu cannot lay out, and a JAX start on this CPU-only
host (libtpu installed) that prints nothing about TPUs.
"""

import io
import os
import subprocess
import sys
import time

import pytest

from tests.training.helpers import REPO, run_cli

MODULE = "keras_moe.tpu_compile.compile_cli"


def test_heartbeat_prints_the_elapsed_time_until_the_body_ends():
    from keras_moe.tpu_compile.compile_progress import CompileProgress

    out = io.StringIO()
    progress = CompileProgress(out, heartbeat_seconds=0.01, prefix="keras-moe-compile: ")
    deadline = time.monotonic() + 60  # only to fail instead of hanging
    with progress.heartbeat("compiling"):
        while out.getvalue().count("still compiling") < 2:
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.005)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(
        line.startswith("keras-moe-compile: still compiling: ") and line.endswith(" s elapsed")
        for line in lines
    ), lines
    with pytest.raises(ValueError, match="heartbeat_seconds"):
        CompileProgress(out, heartbeat_seconds=0)


MEMORY_USAGE_REPORT = """Memory Space: default (color=0)
Total bytes: 17936020992 (16.70GiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
   16.00GiB( 82%);   16.00GiB;      5095424;                6; bf16[128,4,512,16], f32[128,4,512,512]
   16.50GiB( 84%);  512.00MiB;   2689449984;                1; f32[128,4,512,512]
   16.62GiB( 85%);  128.00MiB;   4836933632;                1; s32[8192,4,8,128]
  The rest 861 values are less than 5% of the total size and not shown.

Memory Space: vmem (color=1)
Total bytes: 117437440 (112.00MiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
   64.00MiB( 57%);   64.00MiB;            0;                1; f32[4096,4096]
"""  # noqa: E501 - verbatim output lines


def fake_out_of_memory_report(**changes):
    """A report as compile_train_step returns it when libtpu runs out of HBM."""
    from keras_moe.tpu_compile import compile_memory

    report = {
        "gin_files": ["pretrain_c4_mesh.gin"],
        "topology": "v5e:4x4",
        "chips": 16,
        "device_kind": "TPU v5 lite",
        "generation": "v5e",
        "mesh": {"expert": 16},
        "batch": {"batch_size": 256, "inputs": 512, "targets": 114},
        "dispatch": "einsum",
        "parameters": 7.4e9,
        "param_dtype": "float32",
        "dtype_policy": "float32",
        "compute_dtype": "float32",
        "param_bytes": 2**31,
        "optimizer_bytes": 2**31,
        "hbm_bytes": 16 * 2**30,
        "fits": False,
        "group_size": "sequence",
        "sparse_ffn_classes": ["SwitchFeedForward"],
        "matmul_dtypes": None,
        "largest_allocations": compile_memory.parse_memory_usage_report(MEMORY_USAGE_REPORT),
        "error": "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
        "required for HLO temporaries (16.70G) exceeds available HBM (15.75G).",
        **compile_memory.out_of_memory_entries("RESOURCE_EXHAUSTED: x", 870.0),
    }
    report["error"] = report["error"] if "error" not in changes else changes.pop("error")
    report.update(changes)
    return report


def test_a_step_that_does_not_fit_names_its_largest_buffers_and_the_levers():
    from keras_moe.tpu_compile import compile_only

    report = fake_out_of_memory_report()
    assert [a["bytes"] for a in report["largest_allocations"]] == [
        16 * 2**30,
        512 * 2**20,
        128 * 2**20,
    ]  # HBM only, not vmem's f32[4096,4096]
    text = compile_only.format_report(report)
    assert "fits: NO - RESOURCE_EXHAUSTED" in text
    lines = text.splitlines()
    first = lines.index(
        "  largest HBM buffers per chip (the compiler's buffer assignment; "
        "values sharing a buffer over the step):"
    )
    assert lines[first + 1].split() == ["16.00", "GiB", "bf16[128,4,512,16],", "f32[128,4,512,512]"]
    assert lines[first + 2].split() == ["512", "MiB", "f32[128,4,512,512]"]
    assert lines[first + 3].split() == ["128", "MiB", "s32[8192,4,8,128]"]
    levers = "\n".join(lines[lines.index("  to shrink it:") :])
    assert "BATCH_SIZE = 128 (or --batch_size=128)" in levers
    assert "SwitchFeedForward.group_size (now 'sequence')" in levers
    assert "a larger --topology (now v5e:4x4, 16 chips)" in levers
    assert 'train.dtype_policy = "mixed_bfloat16"' in levers
    assert "rematerialisation: keras_moe has no option for it" in levers

    # Already bfloat16: that lever is not offered again; no dump: said so.
    text = compile_only.format_report(
        fake_out_of_memory_report(dtype_policy="mixed_bfloat16", largest_allocations=None)
    )
    assert 'mixed_bfloat16"' not in text.split("to shrink it:")[1]
    assert "largest buffers: not known" in text


def test_activation_all_gathers_are_told_from_weight_gathers_by_shape():
    from keras_moe.tpu_compile import compile_report, hlo_collectives

    weights = [((8, 64, 128), (2, 64, 128)), ((8100, 64), (8100, 64))]
    hlo = "\n".join(
        [
            # the expert kernel gathered over its 4 shards, and half-way
            "%w = f32[8,64,128]{2,1,0} all-gather(%k), replica_groups={{0,1,2,3}}, dimensions={0}",
            "%h = f32[4,64,128]{2,1,0} all-gather(%k), replica_groups={{0,1}}, dimensions={0}",
            # tokens [groups, tokens, d_model]: an activation, as is a routing buffer
            "%t = bf16[4,512,64]{2,1,0} all-gather(%x), replica_groups={{0,1,2,3}}, dimensions={0},"
            ' metadata={op_name="jit(train_step)/encoder_layer_1/ffn/router"}',
            "%s = (f32[2,10,64], f32[8,10,64]) all-gather-start(%y), replica_groups={{0,1,2,3}}",
            "%r = f32[] all-reduce(%z), replica_groups={{0,1,2,3}}",
        ]
    )
    found = hlo_collectives.activation_all_gathers(hlo, weights, num_devices=4)
    assert [(c.dims, c.op_name) for c in found] == [
        ((4, 512, 64), "jit(train_step)/encoder_layer_1/ffn/router"),
        ((8, 10, 64), ""),
    ]
    assert found[0].received_bytes == 4 * 512 * 64 * 2 * 3 / 4
    report = fake_out_of_memory_report(
        fits=True,
        activation_all_gathers={
            "count": 2,
            "received_bytes": 2**20,
            "largest": [{"dims": [4, 512, 64], "op_name": "enc/router"}],
        },
    )
    text = compile_report.format_report(report)
    assert "  activation all-gathers: 2 (not shaped like a weight; " in text
    assert "[4, 512, 64] (enc/router)" in text


@pytest.mark.e2e
def test_a_slice_libtpu_cannot_lay_out_is_refused_in_one_line():
    env = {
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_WORKER_HOSTNAMES": "localhost",
    }
    done = run_cli(
        ["--gin_file=tiny_local.gin", "--topology=v5e:3x3"], timeout=300, env=env, module=MODULE
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "keras-moe-compile: error: --topology: unknown TPU topology 'v5e:3x3'"
    )
    assert "A and B each 1 or even" in lines[0] and "v5e:4x4" in lines[0]


TPU_CHATTER = ("TPU", "libtpu", "unexpected worker hostname", "InitGoogle")


@pytest.mark.e2e
@pytest.mark.parametrize("jax_platforms", [None, "cpu"])
def test_a_cpu_jax_run_prints_nothing_about_tpus(jax_platforms):
    import importlib.util

    assert importlib.util.find_spec("libtpu") is not None  # the test install has it
    env = {
        k: v for k, v in os.environ.items() if not (k.startswith("TPU_") or k == "JAX_PLATFORMS")
    }
    env.update(KERAS_BACKEND="jax", PYTHONPATH=REPO)
    if jax_platforms:
        env["JAX_PLATFORMS"] = jax_platforms
    code = (
        "import keras_moe, keras, jax; print(keras.backend.backend(), "
        "jax.devices()[0].platform, keras.ops.ones(2).sum())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["jax", "cpu", "2.0"]
    chatter = [
        line for line in done.stderr.splitlines() if any(word in line for word in TPU_CHATTER)
    ]
    assert chatter == []
