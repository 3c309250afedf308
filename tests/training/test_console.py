"""Start-up noise is filtered from stderr; real errors pass through."""

import os

import pytest


def test_filtered_stderr_keeps_real_errors_and_drops_known_noise(capfd):
    from keras_moe.startup import filtered_stderr

    capfd.readouterr()
    with filtered_stderr():  # descriptor 2 itself, as C++ code writes it
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called "
                    b"are written to STDERR\n")
        os.write(2, b"I0000 1 cpu_feature_guard.cc:227] This TensorFlow binary is "
                    b"optimized to use available CPU instructions\n")
        os.write(2, b"E0000 1 some_kernel.cc:9] a real error\n")
    with pytest.raises(RuntimeError, match="boom"):
        with filtered_stderr():
            os.write(2, b"written before a crash\n")
            raise RuntimeError("boom")
    assert capfd.readouterr().err.splitlines() == ["E0000 1 some_kernel.cc:9] a real error",
                                                   "written before a crash"]


# The CLIs' consoles are checked on the README's commands:
# tests/docs/test_readme_snippets.py::test_readme_command_line_training_and_eval.
