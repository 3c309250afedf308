"""The code blocks of README.md and docs/{sharding,serving,hf_checkpoints}.md run as written.

Each Python block runs in a fresh interpreter exactly as it appears, followed
by a few checks of what it built. The README's command-line block runs with
only documented arguments added (fewer steps, a temporary `--model_dir`).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.training.helpers import REPO

README = os.path.join(REPO, "README.md")
SHARDING = os.path.join(REPO, "docs", "sharding.md")
SERVING = os.path.join(REPO, "docs", "serving.md")
HF = os.path.join(REPO, "docs", "hf_checkpoints.md")
HF_FOLDER = "/tmp/switch-tiny-hf"  # the page's paths; the tests move them under tmp_path
# Start-up lines and known-harmless warnings the CLIs keep off the console.
CONSOLE_NOISE = ("cuInit", "cudart_stub", "absl::InitializeLog", "cpu_feature_guard",
                 "uncached FunctionDataset", "shuffle=True")


def code_blocks(path, language):
    """The fenced blocks of `language` in a Markdown file, in order."""
    text = open(path, encoding="utf-8").read()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def run_python(code, timeout, env=None):
    full_env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    full_env.pop("XLA_FLAGS", None)  # a block that needs it sets it itself
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n" \
                                   f"{result.stderr[-3000:]}"
    return result.stdout


def test_the_blocks_this_file_runs_are_the_ones_in_the_docs():
    assert len(code_blocks(README, "python")) == 3
    assert len(code_blocks(README, "bash")) == 2
    assert len(code_blocks(SHARDING, "python")) == 2
    assert len(code_blocks(SERVING, "python")) == 1
    assert not code_blocks(SERVING, "bash")
    assert len(code_blocks(HF, "python")) == 1
    assert len(code_blocks(HF, "bash")) == 1
    assert "`docs/hf_checkpoints.md`" in open(README, encoding="utf-8").read()


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
    out = run_python(_hf_block_in(tmp_path) + (
        "import tensorflow as tf, tensorflow_text\n"
        f"served = tf.saved_model.load({str(tmp_path / 'switch-tiny-hf-served')!r})\n"
        "text = served.signatures['generate_text'](inputs=tf.constant(['The module reads a file.']))\n"
        "print('served text', text['outputs'].numpy()[0].decode() == vocab.decode(ours[0].tolist()))\n"
        "with torch.no_grad():\n"
        "    hf8 = hf.generate(input_ids=torch.tensor(inputs), max_length=8, do_sample=False,\n"
        "                      num_beams=1).numpy()\n"
        "print('hf max_length=8', hf8.tolist())\n"), timeout=600)
    printed = code_blocks(HF, "text")[0].strip()  # the output the page shows
    assert printed in out, out[-3000:]
    assert "served text True" in out, out[-3000:]
    assert "hf max_length=8 [[0, 3363, 3363, 3363, 3363, 3363, 3363, 3363]]" in out, out[-3000:]

    block = code_blocks(HF, "bash")[0].replace("\\\n", " ").replace("/tmp/", f"{tmp_path}/")
    command = shlex.split(block, comments=True)
    assert command[0] == "keras-moe-train"
    shrink = [f"--gin_bindings={b}" for b in (
        "TRAIN_STEPS = 2", "BATCH_SIZE = 4", "train.checkpoint_every = 2",
        "train.summary_batches = 0", "train.expert_load_every = 0")]
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run([shutil.which(command[0])] + command[1:] + shrink, cwd=str(tmp_path),
                            env=env, capture_output=True, text=True, timeout=600)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-4000:]
    assert f"initialised the model from Hugging Face checkpoint {tmp_path}/switch-tiny-hf" \
        in console, console[-4000:]
    untied = [a for a in command[1:] if "tie_word_embeddings" not in a]
    assert len(untied) == len(command) - 2
    result = subprocess.run(
        [shutil.which(command[0])] + untied + shrink + [f"--model_dir={tmp_path}/other"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "different architecture" in result.stderr, \
        (result.stdout + result.stderr)[-4000:]


def test_sharding_doc_rules_are_the_librarys():
    block = code_blocks(SHARDING, "python")[0]
    namespace = {}
    exec(block, namespace)
    from keras_moe import layouts

    assert namespace["DEFAULT_RULES"] == layouts.DEFAULT_RULES


def test_sharding_doc_jax_example():
    block = code_blocks(SHARDING, "python")[1]
    out = run_python(block, timeout=300, env={"JAX_PLATFORMS": "cpu"})
    assert out.strip().splitlines()[-1] == "(2, 32, 64)", out


def test_serving_doc_exports_and_loads_the_search():
    block = code_blocks(SERVING, "python")[0]
    # The SavedModel pads its inputs to max_input_length: compare with generate()
    # on the same padded input (a random model's beams can flip on the last bit).
    out = run_python(block + (
        "import json\n"
        "padded = np.pad(np.array([[37, 5, 892, 1]]), ((0, 0), (0, 60)))\n"
        "same = model.generate(padded, max_length=16, method='beam', num_beams=4)\n"
        "print('EQUAL', json.dumps(ids['output_tokens'].numpy()[0, :same.shape[1]].tolist()"
        " == same[0].tolist()))\n"), timeout=300)
    assert "(1, 16)" in out and "EQUAL true" in out, out
