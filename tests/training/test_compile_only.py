"""`keras-moe-compile`: the TPU compiler (libtpu) compiles a train step for a v5e slice on CPU.

The tiny Switch model (4 of its 8 experts per chip) is compiled for v5e:2x2
through the CLI in a subprocess; its report is checked against a count of the
model's weights made here by hand from the config. libtpu is part of the test
install (`jax[tpu]`), so a missing libtpu fails these tests with the install
hint rather than skipping them.
"""

import configparser
import json
import os
import re
import subprocess
import sys

import pytest

from tests.shared_runs import built_once
from tests.training.helpers import REPO, run_cli

MODULE = "keras_moe.tpu_compile.compile_cli"
FILES = ["--gin_file=tiny_local.gin", "--gin_file=switch_tiny.gin"]
# The default routing groups (group_size="batch"): one per shard of the batch.
BINDINGS = [
    "BATCH_SIZE = 8",
    'TASK_FEATURE_LENGTHS = {"inputs": 32, "targets": 8}',
    'train.mesh_shape = {"data": 1, "expert": 4, "model": 1}',
]
# What the CLI would set itself (it re-executes without them); set here so the
# main run starts once.
ENV = {
    "KERAS_BACKEND": "jax",
    "JAX_PLATFORMS": "cpu",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
}


# The tests of the shared compiles run on one pytest worker, one after the other (the
# compiles are built once either way; this keeps the other worker from waiting on them).
SHARED = pytest.mark.xdist_group("compile_only")


def _args(bindings=BINDINGS, topology="v5e:2x2"):
    return [*FILES, *[f"--gin_bindings={b}" for b in bindings], f"--topology={topology}"]


@pytest.fixture(scope="session")
def libtpu():
    from keras_moe.tpu_compile import compile_only

    missing = compile_only.libtpu_missing_message()
    if missing:
        pytest.fail(missing + " (scripts/install.sh test installs it)")


def _compiled_once(tmp_path_factory, name, extra):
    """The CLI's (stdout, stderr) for `extra` arguments, from one run shared by the
    pytest workers (the compile takes tens of seconds)."""

    def build(path):
        done = run_cli([*_args(), *extra], timeout=300, env=ENV, module=MODULE)
        (path / "stdout").write_text(done.stdout)
        (path / "stderr").write_text(done.stderr)
        (path / "returncode").write_text(str(done.returncode))

    path = built_once(tmp_path_factory, name, build)
    done = subprocess.CompletedProcess(
        MODULE,
        int((path / "returncode").read_text()),
        (path / "stdout").read_text(),
        (path / "stderr").read_text(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def report_run(libtpu, tmp_path_factory):
    return _compiled_once(tmp_path_factory, "compile_v5e_2x2", ["--json"])


@pytest.fixture(scope="session")
def report(report_run):
    return json.loads(report_run.stdout[report_run.stdout.index("{") :])


@SHARED
def test_each_stage_is_announced_on_stderr_in_order_and_nothing_else(report_run):
    # The JSON report alone is on stdout; stderr has the stage lines, and neither
    # TensorFlow's nor libtpu's start-up lines (no TPU, no GPU on this host).
    assert report_run.stdout.lstrip().startswith("{")
    lines = report_run.stderr.strip().splitlines()
    stages = [line for line in lines if not line.startswith("keras-moe-compile: still ")]
    assert [line.split(": ", 1)[0] for line in lines] == ["keras-moe-compile"] * len(lines), lines
    expected = [
        "loading the TPU compiler (libtpu) for v5e:2x2",
        "reading the gin job",
        "building the abstract model",
        "lowering the train step (1.4M parameters)",
        "compiling for 4 chips of v5e:2x2 with the TPU compiler (expect seconds for "
        "tiny models, 10-25 minutes for Switch-Base-128",
        "compiled in ",
    ]
    assert len(stages) == len(expected), lines
    for line, start in zip(stages, expected, strict=False):
        assert line.startswith("keras-moe-compile: " + start), (line, start)


def hand_count_param_bytes(expert_shards):
    """Per-chip bytes of the tiny Switch model's weights (float32), from its config alone.

    models/tiny.gin + switch_tiny.gin: vocab 8100, d_model 64, 4 heads of 16, d_ff 128,
    2 + 2 layers, relu (one input matrix), untied embeddings, 32 relative-position
    buckets; 8 experts in layer 1 of encoder and decoder. The experts' stacked weights
    are split over the "expert" axis, everything else is replicated.
    """
    vocab, d, heads, d_kv, d_ff, experts, buckets = 8100, 64, 4, 16, 128, 8, 32
    inner = heads * d_kv
    attention = 4 * d * inner
    dense_ffn = 2 * d * d_ff
    router = d * experts
    expert_weights = 2 * experts * d * d_ff // expert_shards
    encoder = [
        2 * d + attention + dense_ffn,  # layer 0: dense
        2 * d + attention + router + expert_weights,
    ]  # layer 1: sparse
    decoder = [3 * d + 2 * attention + dense_ffn, 3 * d + 2 * attention + router + expert_weights]
    total = (
        2 * vocab * d  # token embedding + lm head (untied)
        + 2 * buckets * heads  # encoder and decoder relative position bias
        + sum(encoder)
        + sum(decoder)
        + 2 * d
    )  # final layer norms
    return 4 * total


@SHARED
def test_v5e_2x2_report(report):
    assert report["topology"] == "v5e:2x2"
    assert report["chips"] == 4
    assert report["device_kind"].startswith("TPU v5")
    assert report["mesh"] == {"data": 1, "expert": 4, "model": 1}
    assert report["dispatch"] == "einsum"  # what "auto" is on TPU (this host would pick gather)
    assert report["fits"] is True and report["error"] is None
    assert report["hbm_bytes"] == 16 * 2**30
    assert report["flops_per_chip"] > 0
    assert report["collectives"]["all_to_all"] >= 1
    assert 0 < report["peak_bytes"] < report["hbm_bytes"]
    roof = report["roofline"]  # v5e's published peaks against the compiled program
    assert roof["compute_seconds"] == pytest.approx(report["flops_per_chip"] / 197e12)
    assert roof["bound_seconds"] == max(
        roof["compute_seconds"], roof["memory_seconds"], roof["ici_seconds"]
    )
    assert report["collective_bytes_per_chip"]["all_to_all"] > 0 and roof["ici_seconds"] > 0
    assert 0 < roof["mfu_at_bound"] <= 1


@SHARED
def test_default_groups_stay_on_their_chip_and_the_exchange_is_reported(report):
    # group_size="batch" on the mesh is each chip's 2 sequences: no token is
    # all-gathered (one group of the global batch compiled to 23 all-gathers), and
    # each MoE layer's buffers move by the all-to-all: 2 forward + 2 backward.
    assert report["collectives"]["all_gather"] == 0, report["collectives"]
    assert report["collectives"]["all_to_all"] == 4 * 2
    layers = {c["layer"]: c for c in report["moe_exchange"]}
    assert sorted(layers) == ["decoder_layer_1/ffn", "encoder_layer_1/ffn"]
    # [E, G, C, d]: 4 groups (one per chip) of 2 x 32 encoder and 2 x 8 decoder tokens,
    # capacity 1.25 x tokens / 8 experts (at least min_expert_capacity 4).
    assert layers["encoder_layer_1/ffn"]["buffer"] == [8, 4, 10, 64]
    assert layers["decoder_layer_1/ffn"]["buffer"] == [8, 4, 4, 64]
    for choice in layers.values():
        assert choice["exchange"] == "all_to_all"
        assert "4 routing groups are split over ('expert',)" in choice["reason"]
    from keras_moe.tpu_compile import compile_only

    text = compile_only.format_report(report)
    assert "MoE expert exchange, per layer:" in text
    assert "encoder_layer_1/ffn: all-to-all, buffers [8, 4, 10, 64]" in text


@SHARED
def test_param_bytes_match_a_hand_count(report):
    hand = hand_count_param_bytes(expert_shards=4)
    assert report["parameters"] * 4 == hand_count_param_bytes(expert_shards=1)
    assert report["param_bytes"] == hand
    # Adam (tiny_local.gin): two moments per weight, laid out like it.
    assert report["optimizer_bytes"] >= 2 * hand
    # The compiler's arguments hold the weights, the moments and the batch (TPU
    # tiling may pad them, never shrink them).
    state = report["param_bytes"] + report["optimizer_bytes"]
    assert state <= report["argument_bytes"] <= 1.25 * state + 2**20


@pytest.fixture(scope="session")
def mixed_report(libtpu, tmp_path_factory):
    done = _compiled_once(
        tmp_path_factory, "compile_v5e_2x2_bf16", ["--dtype_policy=mixed_bfloat16", "--json"]
    )
    return json.loads(done.stdout[done.stdout.index("{") :])


@SHARED
def test_mixed_bfloat16_computes_in_bfloat16_with_float32_weights(report, mixed_report):
    assert report["dtype_policy"] == "float32"  # tiny_local.gin: defaults.gin's train.dtype_policy
    assert report["compute_dtype"] == "float32"
    assert "bf16" not in report["matmul_dtypes"] and report["matmul_dtypes"]["f32"] > 0
    assert mixed_report["dtype_policy"] == "mixed_bfloat16"
    assert mixed_report["compute_dtype"] == "bfloat16"
    assert mixed_report["param_dtype"] == "float32"
    # The weights and Adam's moments stay float32: the same bytes as the float32
    # compile, i.e. the hand count.
    assert mixed_report["param_bytes"] == hand_count_param_bytes(expert_shards=4)
    assert mixed_report["optimizer_bytes"] == report["optimizer_bytes"]
    # The layers' matmuls are bfloat16; what stays float32 is the routers' logits
    # (and their gradients) and the routing's one-hot dispatch/combine plan.
    matmuls = mixed_report["matmul_dtypes"]
    assert matmuls["bf16"] > matmuls.get("f32", 0) > 0, matmuls


# Refusals that need no re-run of the CLI: one process calls its main() for each
# (the same code path as the command line, started once).
REFUSALS = {
    "dtype_flag": [*_args(), "--dtype_policy=float16"],
    # Without the flag the job's own train.dtype_policy is read (and checked).
    "dtype_binding": _args(BINDINGS + ['train.dtype_policy = "float16"']),
    "topology": _args(topology="v9z:2x2"),
    # A batch the mesh cannot split (every chip would compute all of it): refused as
    # keras-moe-train refuses it, from the job's BATCH_SIZE or from --batch_size.
    # (v5litepod-4, tpu_scripts/' name of v5e:2x2, is read as that slice.)
    "batch_over_4_data_chips": _args(
        BINDINGS[1:]
        + ["BATCH_SIZE = 6", 'train.mesh_shape = {"data": 4, "expert": 1, "model": 1}'],
        topology="v5litepod-4",
    ),
    "batch_flag_over_2x2": [
        *_args(
            BINDINGS[1:]
            + ["BATCH_SIZE = 8", 'train.mesh_shape = {"data": 2, "expert": 2, "model": 1}']
        ),
        "--batch_size=7",
    ],
}
REFUSAL_RUNNER = """
import json, sys
from keras_moe.tpu_compile.compile_cli import main
for name, argv in json.loads(sys.argv[1]).items():
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    print(f"=== {name} exited {code}", file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="session")
def refusals(libtpu, tmp_path_factory):
    """{case: (exit code, stderr)} of the REFUSALS cases, run once for all pytest workers."""

    def build(path):
        env = dict(
            os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **ENV
        )
        done = subprocess.run(
            [sys.executable, "-c", REFUSAL_RUNNER, json.dumps(REFUSALS)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        (path / "stderr").write_text(done.stderr)

    stderr = (built_once(tmp_path_factory, "compile_refusals", build) / "stderr").read_text()
    out, start = {}, 0
    for match in re.finditer(r"^=== (\w+) exited (\S+)$", stderr, flags=re.M):
        out[match.group(1)] = (match.group(2), stderr[start : match.start()])
        start = match.end()
    assert sorted(out) == sorted(REFUSALS), stderr[-3000:]
    return out


@SHARED
def test_bad_dtype_policy_is_refused(refusals):
    code, stderr = refusals["dtype_flag"]
    assert code == "2", stderr[-2000:]
    assert "--dtype_policy" in stderr and "mixed_bfloat16" in stderr
    code, stderr = refusals["dtype_binding"]
    assert code == "2", stderr[-2000:]
    assert "train.dtype_policy must be one of" in stderr
    assert "'float16'" in stderr


@SHARED
def test_unknown_topology_is_refused(refusals):
    code, stderr = refusals["topology"]
    assert code == "2", stderr[-2000:]
    assert "unknown TPU topology 'v9z:2x2'" in stderr
    assert "v5e:4x4" in stderr  # the known ones are listed


@SHARED
def test_a_batch_the_mesh_cannot_split_is_refused_in_one_line(refusals):
    for case, name, value, devices in (
        ("batch_over_4_data_chips", "BATCH_SIZE", 6, 4),
        ("batch_flag_over_2x2", "--batch_size", 7, 4),
    ):
        code, stderr = refusals[case]
        assert code == "2", (case, stderr[-2000:])
        errors = [line for line in stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and errors[0].startswith("keras-moe-compile: error: "), stderr
        assert f"{name}={value} does not split over the device mesh" in errors[0]
        assert f"= {devices} devices" in errors[0] and "fits" not in stderr, errors[0]


@pytest.mark.e2e
def test_mesh_product_must_equal_chip_count(libtpu):
    # Without the environment: the CLI sets KERAS_BACKEND=jax etc. itself (re-runs).
    env = {k: "" for k in ENV}
    env["KERAS_BACKEND"] = "tensorflow"
    bindings = BINDINGS[:-1] + ['train.mesh_shape = {"data": 1, "expert": 8, "model": 1}']
    done = run_cli(_args(bindings), timeout=180, env=env, module=MODULE)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "MeshPlacement.mesh_shape" in done.stderr and "has 8 devices" in done.stderr
    assert "4" in done.stderr


def test_topology_names():
    from keras_moe.tpu_compile import compile_only

    assert compile_only.parse_topology("v5e:4x4") == ("v5e", 16, (4, 4))
    assert compile_only.parse_topology("v4:2x2x2") == ("v4", 8, (2, 2, 2))
    # Cloud TPU accelerator types, as tpu_scripts/ names them (Google's published shapes):
    # v5e and v6e count chips, v4 and v5p TensorCores (two per chip).
    for accelerator_type, topology in (
        ("v5litepod-1", "v5e:1x1"),
        ("v5litepod-4", "v5e:2x2"),
        ("v5litepod-8", "v5e:2x4"),
        ("v5litepod-16", "v5e:4x4"),
        ("v5litepod-64", "v5e:8x8"),
        ("v5litepod-256", "v5e:16x16"),
        ("v6e-32", "v6e:4x8"),
        ("v4-8", "v4:2x2x1"),
        ("v4-16", "v4:2x2x2"),
        ("v4-32", "v4:2x2x4"),
        ("v4-64", "v4:2x4x4"),
        ("v4-128", "v4:4x4x4"),
        ("v4-4096", "v4:8x16x16"),
        ("v5p-8", "v5p:2x2x1"),
    ):
        assert compile_only.canonical_topology(accelerator_type) == topology, accelerator_type
        assert compile_only.parse_topology(accelerator_type) == compile_only.parse_topology(
            topology
        )
    for bad in ("v5litepod-6", "v5litepod-2", "v4-12"):
        with pytest.raises(compile_only.CompileOnlyError, match=r"unknown Cloud TPU type"):
            compile_only.parse_topology(bad)
    for bad in ("v5e:4x4x4", "v4:2x2", "tpu:4", "", None, "v5e:3x3", "v4:3x2x2"):
        with pytest.raises(compile_only.CompileOnlyError, match="unknown TPU topology"):
            compile_only.parse_topology(bad)


def test_console_script_and_tpu_extra_are_declared():
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    scripts = config["options.entry_points"]["console_scripts"]
    assert "keras-moe-compile = keras_moe.tpu_compile.compile_cli:main" in scripts
    assert "jax[tpu]==" in config["options.extras_require"]["tpu"]
