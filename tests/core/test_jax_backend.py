"""The core layers on the JAX backend (a separate process: the backend is fixed per process)."""

import pytest

from tests.core.helpers import run_jax_checks


@pytest.mark.slow
@pytest.mark.jax
def test_core_layers_on_jax_backend():
    run_jax_checks(
        "jax_backend_checks.py",
        (
            "reference",
            "gradients",
            "dropless",
            "empty_batch",
            "fit_save_bf16",
            "router_metrics",
            "compiled_decoding",
            "upcycle",
        ),
    )
