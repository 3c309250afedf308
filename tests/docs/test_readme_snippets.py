"""The code blocks of README.md and docs/{sharding,serving,hf_checkpoints}.md run as written.

Each Python block runs exactly as it appears, followed by a few checks of what
it built: in this test process, as in a notebook's long-lived kernel (the JAX
block, whose backend is fixed per process, in a fresh interpreter). The
README's command-line block runs with only documented arguments added (fewer
steps, a temporary `--model_dir`).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.training.helpers import REPO, run_cli_here

README = os.path.join(REPO, "README.md")
SHARDING = os.path.join(REPO, "docs", "sharding.md")
SERVING = os.path.join(REPO, "docs", "serving.md")
HF = os.path.join(REPO, "docs", "hf_checkpoints.md")
HF_FOLDER = "/tmp/switch-tiny-hf"  # the page's paths; the tests move them under tmp_path
# Start-up lines and known-harmless warnings the CLIs keep off the console.
CONSOLE_NOISE = (
    "cuInit",
    "cudart_stub",
    "absl::InitializeLog",
    "cpu_feature_guard",
    "uncached FunctionDataset",
    "shuffle=True",
)


def code_blocks(path, language):
    """The fenced blocks of `language` in a Markdown file, in order."""
    text = open(path, encoding="utf-8").read()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def run_python(code, timeout, env=None):
    full_env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    full_env.pop("XLA_FLAGS", None)  # a block that needs it sets it itself
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    return result.stdout


def exec_here(code):
    """Runs `code` in a fresh namespace in this process; returns what it printed."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "<doc block>", "exec"), {"__name__": "__doc_block__"})
    return printed.getvalue()


def test_the_blocks_this_file_runs_are_the_ones_in_the_docs():
    assert len(code_blocks(README, "python")) == 3
    # The third is docs/sharding.md's (below), the fourth tests/training/test_upcycle_cli.py's.
    assert len(code_blocks(README, "bash")) == 4
    assert len(code_blocks(SHARDING, "python")) == 2
    assert len(code_blocks(SERVING, "python")) == 1
    assert not code_blocks(SERVING, "bash")
    assert len(code_blocks(HF, "python")) == 1
    assert len(code_blocks(HF, "bash")) == 1
    assert "`docs/hf_checkpoints.md`" in open(README, encoding="utf-8").read()


@pytest.mark.e2e
def test_readme_deepseek_v3_router():
    block = code_blocks(README, "python")[1]
    out = exec_here(
        block
        + (
            "import numpy as np\n"
            "x = np.random.default_rng(0).normal(size=(2, 16, 32)).astype('float32')\n"
            "y = moe(x, training=True)\n"
            "moved = float(np.abs(router.expert_bias.numpy()).max())\n"
            "print('shape', tuple(y.shape), 'moved', round(moved, 6))\n"
        )
    )
    assert "shape (2, 16, 32) moved 0.001" in out, out


@pytest.mark.e2e
def test_readme_layer_quick_start():
    block = code_blocks(README, "python")[0]
    out = exec_here(
        block
        + (
            "import numpy as np\n"
            "x = np.random.default_rng(0).normal(size=(4, 128, 512)).astype('float32')\n"
            "y = model(x)\n"
            "print('shape', tuple(y.shape), 'losses', len(model.losses))\n"
        )
    )
    # The MoE branch adds its aux and z losses to the model.
    assert "shape (4, 128, 1) losses 2" in out, out


@pytest.mark.slow
def test_readme_notebook_quick_start(caplog):
    """As written it trains, decodes text to text, and prints short lines, a router
    table, and no warning."""
    import logging
    import warnings

    block = code_blocks(README, "python")[2]
    lines = block.strip().splitlines()
    generate = lines.index(next(line for line in lines if line.startswith("model.generate(")))
    block = "\n".join(lines[:generate]) + "\ntext = " + "\n".join(lines[generate:]) + "\n"
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        out = exec_here(
            block
            + (
                "loss = history.history['loss']\n"
                "router = [k for k in history.history if k.endswith('/dropped_fraction')]\n"
                "print('loss', loss[0], 'router', len(router), 'text', repr(text))\n"
            )
        )
    match = re.search(r"loss (\S+) router (\d+) text \['(.*)'\]", out)
    assert match, out
    assert float(match.group(1)) < 9.0  # from ln(8100) = 9.0 at init
    assert int(match.group(2)) == 2 and match.group(3)
    assert not [str(w.message) for w in caught if w.category is not DeprecationWarning]
    assert not [r.getMessage() for r in caplog.records], caplog.text
    shown = [
        line
        for line in re.sub(r"\x1b\[[0-9;]*m|\x08", "", out).replace("\r", "\n").splitlines()
        if not line.startswith("loss ")
    ]  # this test's own line
    assert max(len(line.rstrip()) for line in shown) <= 160, max(shown, key=len)
    assert "MaxVio:" in out and "decoder_layer_1/ffn" in out  # the table and its legend


@pytest.mark.slow
def test_readme_command_line_training_and_eval(tmp_path):
    """The pre-training commands, shortened by gin bindings and a temporary
    model_dir, run as a user runs them (no TF_CPP_MIN_LOG_LEVEL of ours): they
    succeed and their consoles are short and clean."""
    block = code_blocks(README, "bash")[1]
    commands = [
        shlex.split(c, comments=True) for c in block.replace("\\\n", " ").splitlines() if c.strip()
    ]
    assert [c[0] for c in commands] == ["keras-moe-train", "keras-moe-eval", "keras-moe-eval"]
    model_dir = str(tmp_path / "run")
    shrink = [
        f"--gin_bindings={b}"
        for b in (
            "TRAIN_STEPS = 2",
            "BATCH_SIZE = 4",
            "CheckpointConfig.every = 2",
            "train.summary_batches = 0",
            "train.expert_load_every = 0",
            "CheckpointConfig.backup_every = None",
            "train.log_every = 1",
            "T5Config.num_encoder_layers = 2",
            "T5Config.num_decoder_layers = 2",
        )
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    consoles = []
    for command in commands:
        executable = shutil.which(command[0])
        assert executable, f"{command[0]} is not on PATH: install the package (scripts/install.sh)"
        args = [
            a if not a.startswith("--model_dir=") else f"--model_dir={model_dir}"
            for a in command[1:]
        ]
        args = [
            a if not a.startswith("--export_dir=") else f"--export_dir={tmp_path}/served"
            for a in args
        ]
        if command[0] == "keras-moe-train":
            args = [a for a in args if "TRAIN_STEPS" not in a] + shrink
        elif not any(a.startswith("--export_dir=") for a in args):
            args += ["--eval_batches=1", "--gin_bindings=BATCH_SIZE = 4"]
        result = subprocess.run(
            [executable] + args,
            cwd=str(tmp_path),
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        consoles.append(result.stdout + result.stderr)
        assert result.returncode == 0, consoles[-1][-6000:]
    assert os.path.isfile(os.path.join(model_dir, "checkpoints", "ckpt-00000002.weights.h5"))
    train, evaluate, export = consoles
    assert "signatures generate_ids, generate_text" in export, export[-3000:]
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the text signature)

    served = tf.saved_model.load(str(tmp_path / "served"))
    out = served.signatures["generate_text"](inputs=tf.constant(["The module"]))["outputs"]
    assert (tuple(out.shape), out.dtype) == ((1,), tf.string)
    for out in consoles:
        for noise in CONSOLE_NOISE:
            assert noise not in out, (noise, out[:4000])
    # Keras' per-epoch line: loss and learning rate, none of the per-layer statistics.
    epoch_lines = [line for line in train.splitlines() if re.match(r"\d+/\d+ - ", line)]
    assert epoch_lines and all(" - lr: " in line and "/ffn/" not in line for line in epoch_lines), (
        epoch_lines
    )
    assert max(len(line) for line in train.splitlines()) < 200
    # Every log step: one router-table row per MoE layer (every other layer, of
    # 2 + 2 here), percentages of dropped tokens.
    tables = re.findall(
        r"MoE layer +dropped +imbalance +MaxVio +confidence +out/in rms\n"
        r"((?: +\S+ +[\d.]+% +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+\n)+)",
        train,
    )
    assert len(tables) == 2, train[:4000]
    assert [row.split()[0] for row in tables[0].splitlines()] == [
        "encoder_layer_1/ffn",
        "decoder_layer_1/ffn",
    ]


def _hf_block_in(tmp_path):
    """The HF page's Python block, writing under `tmp_path` instead of /tmp."""
    block = code_blocks(HF, "python")[0]
    assert HF_FOLDER in block
    return block.replace("/tmp/", f"{tmp_path}/")


@pytest.mark.slow
def test_hf_doc_imports_decodes_exports_and_fine_tunes_a_local_checkpoint(tmp_path):
    """The page's Python block (checkpoint, import, decoding, export), then its
    fine-tuning command from that checkpoint, shortened by gin bindings; without
    the page's tie binding the command is refused."""
    out = exec_here(
        _hf_block_in(tmp_path)
        + (
            "import tensorflow as tf, tensorflow_text\n"
            f"served = tf.saved_model.load({str(tmp_path / 'switch-tiny-hf-served')!r})\n"
            "text = served.signatures['generate_text'](\n"
            "    inputs=tf.constant(['The module reads a file.']))\n"
            "decoded = vocab.decode(ours[0].tolist())\n"
            "print('served text', text['outputs'].numpy()[0].decode() == decoded)\n"
            "with torch.no_grad():\n"
            "    hf8 = hf.generate(input_ids=torch.tensor(inputs), max_length=8, do_sample=False,\n"
            "                      num_beams=1).numpy()\n"
            "print('hf max_length=8', hf8.tolist())\n"
        )
    )
    printed = code_blocks(HF, "text")[0].strip()  # the output the page shows
    assert printed in out, out[-3000:]
    assert "served text True" in out, out[-3000:]
    assert "hf max_length=8 [[0, 3363, 3363, 3363, 3363, 3363, 3363, 3363]]" in out, out[-3000:]

    block = code_blocks(HF, "bash")[0].replace("\\\n", " ").replace("/tmp/", f"{tmp_path}/")
    command = shlex.split(block, comments=True)
    assert command[0] == "keras-moe-train"
    shrink = [
        f"--gin_bindings={b}"
        for b in (
            "TRAIN_STEPS = 2",
            "BATCH_SIZE = 4",
            "CheckpointConfig.every = 2",
            "train.summary_batches = 0",
            "train.expert_load_every = 0",
        )
    ]
    result = run_cli_here(command[1:] + shrink)  # keras-moe-train's main(), in this process
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-4000:]
    assert (
        f"initialised the model from Hugging Face checkpoint {tmp_path}/switch-tiny-hf" in console
    ), console[-4000:]
    # The same command without the tie binding: refused before training.
    untied = [a for a in command[1:] if "tie_word_embeddings" not in a]
    assert len(untied) == len(command) - 2
    refused = run_cli_here(untied + shrink + [f"--model_dir={tmp_path}/other"])
    assert refused.returncode == 2 and "different architecture" in refused.stderr, (
        refused.stdout + refused.stderr
    )[-4000:]


def test_the_readme_mesh_command_is_the_sharding_docs_which_runs_in_the_mesh_tests():
    """tests/training/test_mesh.py runs docs/sharding.md's command on 8 emulated devices;
    the README gives the same command, with the settings a CPU host needs."""
    readme = code_blocks(README, "bash")[2].replace("\\\n", " ").split()
    sharding = code_blocks(SHARDING, "bash")[0].replace("\\\n", " ").splitlines()[0].split()
    assert readme == sharding
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=8" in readme and (
        "PJRT_NPROC=16" in readme
    )


def test_sharding_doc_rules_are_the_librarys():
    block = code_blocks(SHARDING, "python")[0]
    namespace = {}
    exec(block, namespace)
    from keras_moe.parallel import layouts

    assert namespace["DEFAULT_RULES"] == layouts.DEFAULT_RULES


@pytest.mark.e2e
def test_sharding_doc_jax_example():
    block = code_blocks(SHARDING, "python")[1]
    out = run_python(block, timeout=300, env={"JAX_PLATFORMS": "cpu"})
    assert out.strip().splitlines()[-1] == "(2, 32, 64)", out


@pytest.mark.e2e
def test_serving_doc_exports_and_loads_the_search():
    block = code_blocks(SERVING, "python")[0]
    # The SavedModel pads its inputs to max_input_length: compare with generate()
    # on the same padded input (a random model's beams can flip on the last bit).
    out = exec_here(
        block
        + (
            "import json\n"
            "padded = np.pad(np.array([[37, 5, 892, 1]]), ((0, 0), (0, 60)))\n"
            "same = model.generate(padded, max_length=16, method='beam', num_beams=4)\n"
            "print('EQUAL', json.dumps(ids['output_tokens'].numpy()[0, :same.shape[1]].tolist()"
            " == same[0].tolist()))\n"
        )
    )
    assert "(1, 16)" in out and "EQUAL true" in out, out
