"""What the training CLI leaves for TensorBoard and the expert-load history, run as users run it."""

import collections
import glob
import json
import os
import re
import shutil

import pytest

from tests.training.helpers import cli_bindings, run_cli_here
from tests.training.tiny_run import GROUP, RUN, tiny_run

# Keras' TensorBoard callback names a metric `batch_<name>` and `epoch_<name>`.
KERAS_FORMS = re.compile(r"^(batch_|epoch_)")
ROUTER_TAG = re.compile(r"^moe/(.+)/([a-z_]+)$")


def _tags(run_dir):
    """`{tag: [steps]}` of every event file in `run_dir`."""
    import tensorflow as tf

    tags = collections.defaultdict(list)
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags[value.tag].append(event.step)
    return tags


def _metric(tag):
    """The metric a tag shows, whatever form it takes: `batch_loss`, `epoch_loss` and
    `loss` are one metric; so are `batch_encoder_layer_1/ffn/z_loss`,
    `encoder_layer_1/ffn/z_loss` and `moe/encoder_layer_1/ffn/z_loss`."""
    name = KERAS_FORMS.sub("", tag)
    return name[len("moe/") :] if name.startswith("moe/") else name


def _router_tags(tags):
    return {t for t in tags if ROUTER_TAG.match(t) and "/expert_load/" not in t}


def _train(model_dir, steps):
    bindings = RUN + [f"TRAIN_STEPS = {steps}"]
    result = run_cli_here(
        ["--gin_file=tiny_local.gin", f"--model_dir={model_dir}", *cli_bindings(bindings)]
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def readme_run(tmp_path_factory):
    return tiny_run(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.xdist_group(GROUP)
def test_cli_writes_one_tag_per_metric_validation_beside_train_and_load_history(
    tmp_path, readme_run
):
    """The README's first command (10 steps of the TINY model) leaves what the README
    says it leaves; a run resumed from it extends the expert-load history."""
    model_dir = tmp_path / "run"
    shutil.copytree(readme_run[0], model_dir)  # this test resumes it below

    runs = sorted(os.listdir(model_dir / "logs"))
    assert runs == ["train", "validation"], runs
    train, validation = (_tags(model_dir / "logs" / run) for run in runs)
    for name, tags in (("train", train), ("validation", validation)):
        forms = collections.defaultdict(set)
        for tag in tags:
            forms[_metric(tag)].add(tag)
        repeated = {m: sorted(t) for m, t in forms.items() if len(t) > 1}
        assert not repeated, f"{name}: metrics written under several tags: {repeated}"

    # Two MoE layers (encoder and decoder), each with its router statistics,
    # under the same tags in both runs, as the loss and the accuracy.
    router = _router_tags(train)
    layers = {ROUTER_TAG.match(t).group(1) for t in router}
    assert len(layers) == 2 and len(router) >= 2 * 5, sorted(router)
    assert _router_tags(validation) == router
    for tag in ("loss", "accuracy", "neg_log_perplexity"):
        assert tag in train and tag in validation, tag
    assert set(validation) <= set(train), sorted(set(validation) - set(train))
    assert sorted(train["loss"]) == [5, 10]
    assert sorted(validation["loss"]) == [0, 5, 10]
    assert sorted(train[f"moe/{sorted(layers)[0]}/expert_load/expert_0"]) == [5, 10]

    assert os.path.isfile(model_dir / "expert_load.png")
    assert os.path.getsize(model_dir / "expert_load_history.png") > 0
    history = json.loads((model_dir / "expert_load_history.json").read_text())
    assert [entry["step"] for entry in history] == [5, 10]
    for entry in history:
        assert set(entry["load"]) == layers
        for load in entry["load"].values():
            assert len(load) == 4 and abs(sum(load) - 1.0) < 1e-6  # TINY: 4 experts
        assert set(entry["dropped_fraction"]) == layers

    # A resumed run (from the step-10 checkpoint) extends the history.
    _train(model_dir, 15)
    history = json.loads((model_dir / "expert_load_history.json").read_text())
    assert [entry["step"] for entry in history] == [5, 10, 15]
