"""The compiled search on JAX writes its compilation to a persistent cache that a later
process reads (JAX's own cache-hit event, in a process of its own), and a user's own
choice of cache directory, or `KERAS_MOE_JAX_CACHE=off`, is kept."""

import json
import os

import pytest

from keras_moe.models import compilation_cache
from tests.docs.test_readme_snippets import run_python

GENERATE = """
import json
import jax
import keras
import numpy as np
from keras_moe.models import EncoderDecoder, T5Config

events = []
jax.monitoring.register_event_listener(lambda name, **kwargs: events.append(name))
keras.utils.set_random_seed(0)
model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                                num_encoder_layers=1, num_decoder_layers=1))
tokens = model.generate(np.array([[5, 6, 7, 1]], "int32"), max_length=6)
print(json.dumps({"tokens": np.asarray(tokens).tolist(), "events": events,
                  "cache_dir": jax.config.jax_compilation_cache_dir}))
"""


def _generate_in_a_new_process(**env):
    # An empty JAX_COMPILATION_CACHE_DIR: no directory of the user's own.
    out = run_python(
        GENERATE,
        timeout=300,
        env={
            "KERAS_BACKEND": "jax",
            "JAX_PLATFORMS": "cpu",
            "JAX_COMPILATION_CACHE_DIR": "",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            **env,
        },
    )
    return json.loads(out.strip().splitlines()[-1])


def _files(path):
    return sorted(name for _, _, names in os.walk(path) for name in names)


@pytest.mark.slow
def test_a_later_process_reads_the_compiled_search_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = _generate_in_a_new_process(KERAS_MOE_JAX_CACHE=str(cache))
    assert first["cache_dir"] == str(cache)
    assert "/jax/compilation_cache/cache_hits" not in first["events"]
    written = _files(cache)
    assert written, "the first process wrote no compilation"
    second = _generate_in_a_new_process(KERAS_MOE_JAX_CACHE=str(cache))
    assert "/jax/compilation_cache/cache_hits" in second["events"]
    assert second["tokens"] == first["tokens"]


def test_a_users_own_cache_directory_or_off_is_kept(monkeypatch, tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setenv("KERAS_MOE_JAX_CACHE", "off")
    assert compilation_cache.use_persistent_cache() is None
    assert jax.config.jax_compilation_cache_dir == before
    monkeypatch.setenv("KERAS_MOE_JAX_CACHE", str(tmp_path / "ours"))
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
    try:
        assert compilation_cache.use_persistent_cache() == str(tmp_path / "theirs")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "theirs")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert not (tmp_path / "ours").exists()

    blocked = tmp_path / "a_file"
    blocked.write_text("")  # a cache directory that cannot be made: a warning, no cache
    monkeypatch.setenv("KERAS_MOE_JAX_CACHE", str(blocked / "cache"))
    with pytest.warns(UserWarning, match="KERAS_MOE_JAX_CACHE"):
        assert compilation_cache.use_persistent_cache() is None
    assert jax.config.jax_compilation_cache_dir == before


def test_the_environment_variable_names_a_directory_the_default_or_off():
    home = {"XDG_CACHE_HOME": "/x"}
    assert compilation_cache.chosen_cache_dir(home) == "/x/keras_moe/jax"
    assert (
        compilation_cache.chosen_cache_dir({**home, "KERAS_MOE_JAX_CACHE": " "})
        == "/x/keras_moe/jax"
    )
    for off in ("off", "OFF", "0", "false", "none"):
        assert compilation_cache.chosen_cache_dir({"KERAS_MOE_JAX_CACHE": off}) is None
    assert compilation_cache.chosen_cache_dir({"KERAS_MOE_JAX_CACHE": "/c"}) == "/c"
