"""The console: start-up noise filtered from stderr (real errors pass through), short
progress lines, and router tables that say what their columns mean."""

import os

import pytest

from tests.training.tiny_run import GROUP, tiny_run


def test_filtered_stderr_keeps_real_errors_and_drops_known_noise(capfd):
    from keras_moe.startup import filtered_stderr

    capfd.readouterr()
    with filtered_stderr():  # descriptor 2 itself, as C++ code writes it
        os.write(
            2,
            b"WARNING: All log messages before absl::InitializeLog() is called "
            b"are written to STDERR\n",
        )
        os.write(
            2,
            b"I0000 1 cpu_feature_guard.cc:227] This TensorFlow binary is "
            b"optimized to use available CPU instructions\n",
        )
        os.write(2, b"E0000 1 some_kernel.cc:9] a real error\n")
    with pytest.raises(RuntimeError, match="boom"):
        with filtered_stderr():
            os.write(2, b"written before a crash\n")
            raise RuntimeError("boom")
    assert capfd.readouterr().err.splitlines() == [
        "E0000 1 some_kernel.cc:9] a real error",
        "written before a crash",
    ]


# The CLIs' consoles are checked on the README's commands:
# tests/docs/test_readme_snippets.py::test_readme_command_line_training_and_eval.


@pytest.mark.xdist_group(GROUP)
def test_the_training_console_explains_its_router_table_once(tmp_path_factory):
    """The README's first command prints a router table at every log step; the first
    says what imbalance and MaxVio (and the other columns) mean."""
    _, console = tiny_run(tmp_path_factory)
    headers = [line for line in console.splitlines() if line.strip().startswith("MoE layer")]
    assert len(headers) == 2, console[-3000:]  # steps 5 and 10
    legend = " ".join(
        line.strip()
        for line in console.splitlines()
        if line.startswith("  (") or line.startswith("   ")
    )
    assert console.count("(dropped: tokens no expert took") == 1, console[-3000:]
    assert "MaxVio: the busiest expert's selections over the mean, minus 1" in legend, legend
    assert "imbalance: the busiest expert's share of first choices x experts" in legend, legend


def test_the_notebook_progress_bar_is_short_and_tables_the_router_statistics(capsys):
    from tests.models.helpers import compiled_tiny_switch_and_batch

    model, x = compiled_tiny_switch_and_batch(rows=8)
    history = model.fit(x, epochs=2, batch_size=4, verbose=2).history
    printed = capsys.readouterr().out
    assert any(k.endswith("/ffn/max_violation") for k in history)  # the logs keep them all
    bars = [line for line in printed.splitlines() if "loss:" in line]
    assert len(bars) == 2 and all("/ffn/" not in line for line in bars), printed
    assert printed.count("MoE layer") == 2 and printed.count("(dropped:") == 1, printed
    model.evaluate(x, batch_size=4, verbose=2)
    assert "/ffn/" not in capsys.readouterr().out
