"""docs/keras_hub.md's Python blocks run as written (paths moved under tmp_path)."""

import os

import pytest

from tests.docs.test_readme_snippets import code_blocks, run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "keras_hub.md")


def _blocks(tmp_path):
    blocks = code_blocks(PAGE, "python")
    assert len(blocks) == 2
    return [block.replace("/tmp/", f"{tmp_path}/") for block in blocks]


@pytest.mark.slow
def test_the_page_loads_generates_fine_tunes_saves_and_shards(tmp_path):
    load_and_train, mesh = _blocks(tmp_path)
    out = run_python(load_and_train, timeout=600)
    lines = out.splitlines()
    assert lines[0] == "SparseQwen3MoeCausalLM", out
    assert float(lines[1]) < 1e-5, out
    assert "transformer_layer_0/max_violation" in out, out
    assert os.path.exists(tmp_path / "qwen3-moe-tiny.keras")
    # The settings the page gives on the command line (run_python drops XLA_FLAGS).
    settings = (
        "import os\nos.environ.update(KERAS_BACKEND='jax', JAX_PLATFORMS='cpu', "
        "XLA_FLAGS='--xla_force_host_platform_device_count=8')\n"
    )
    sharded = run_python(settings + mesh, timeout=600)
    assert "'expert'" in sharded, sharded
