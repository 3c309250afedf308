"""What a user sees on the console: no start-up noise, short progress lines, a router table."""

import os
import re
import subprocess
import sys

from tests.training.helpers import REPO, cli_bindings, run_cli

NOISE = ("cuInit", "cudart_stub", "absl::InitializeLog", "cpu_feature_guard",
         "uncached FunctionDataset", "shuffle=True")


def test_filtered_stderr_keeps_real_errors_and_drops_known_noise():
    script = (
        "import os\n"
        "from keras_moe.startup import filtered_stderr\n"
        "with filtered_stderr():\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called "
        "are written to STDERR\\n')\n"
        "    os.write(2, b'I0000 1 cpu_feature_guard.cc:227] This TensorFlow binary is "
        "optimized to use available CPU instructions\\n')\n"
        "    os.write(2, b'E0000 1 some_kernel.cc:9] a real error\\n')\n"
        "try:\n"
        "    with filtered_stderr():\n"
        "        os.write(2, b'written before a crash\\n')\n"
        "        raise RuntimeError('boom')\n"
        "except RuntimeError:\n"
        "    pass\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["E0000 1 some_kernel.cc:9] a real error",
                                          "written before a crash"]


def test_train_and_eval_consoles_are_short_and_clean(tmp_path):
    model_dir = str(tmp_path / "run")
    # As a user runs it: no TF_CPP_MIN_LOG_LEVEL of our own.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update({"PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1"})
    train = subprocess.run(
        [sys.executable, "-m", "keras_moe.training", "--gin_file=tiny_local.gin",
         f"--model_dir={model_dir}"] + cli_bindings(["TRAIN_STEPS = 4", "LOG_EVERY = 2",
                                                     "CHECKPOINT_EVERY = 4"]),
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = train.stdout + train.stderr
    assert train.returncode == 0, out[-4000:]
    for noise in NOISE:
        assert noise not in out, (noise, out[:4000])
    # Keras' per-epoch line: loss and learning rate, none of the per-layer statistics.
    epoch_lines = [line for line in out.splitlines() if re.match(r"\d+/\d+ - ", line)]
    assert epoch_lines and all(" - lr: " in line and "/ffn/" not in line
                               for line in epoch_lines), epoch_lines
    assert max(len(line) for line in out.splitlines()) < 200
    # Every log step: one router-table row per MoE layer, percentages of dropped tokens.
    tables = re.findall(r"MoE layer +dropped +imbalance +confidence +out/in rms\n"
                        r"((?: +\S+ +[\d.]+% +[\d.]+ +[\d.]+ +[\d.]+\n)+)", out)
    assert len(tables) == 2, out[:4000]
    assert [row.split()[0] for row in tables[0].splitlines()] == [
        "encoder_layer_1/ffn", "decoder_layer_1/ffn"]

    evaluate = run_cli([f"--model_dir={model_dir}"], timeout=300,
                       env={"TF_CPP_MIN_LOG_LEVEL": "0"}, module="keras_moe.training.eval_cli")
    out = evaluate.stdout + evaluate.stderr
    assert evaluate.returncode == 0, out[-4000:]
    for noise in NOISE:
        assert noise not in out, (noise, out[:4000])
