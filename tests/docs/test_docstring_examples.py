"""The `>>>` examples in docstrings run as written and print what they show (doctest).

Each module listed here has examples that are complete (they import or build
what they use) and correct. A module joins the list once its examples are.
"""

import doctest
import importlib
import io

import pytest

import gin

MODULES = [
    "benchmarks.batch_files",
    "benchmarks.distill",
    "benchmarks.dropless_tpu",
    "benchmarks.memory_plan",
    "benchmarks.quality",
    "keras_moe.compat",
    "keras_moe.convert.hf",
    "keras_moe.dispatch",
    "keras_moe.dispatch_dropless",
    "keras_moe.dispatch_einsum",
    "keras_moe.dispatch_gather",
    "keras_moe.grouped_matmul",
    "keras_moe.distill.builder",
    "keras_moe.distill.distiller",
    "keras_moe.distill.init_from_teacher",
    "keras_moe.distill.objective",
    "keras_moe.expert_parallel",
    "keras_moe.experts",
    "keras_moe.dense_feedforward",
    "keras_moe.feedforward",
    "keras_moe.feedforward_mixin",
    "keras_moe.gin_config",
    "keras_moe.gin_errors",
    "keras_moe.gin_unread",
    "keras_moe.layers",
    "keras_moe.layouts",
    "keras_moe.local_groups",
    "keras_moe.metrics",
    "keras_moe.models.attention",
    "keras_moe.models.blocks",
    "keras_moe.models.builder",
    "keras_moe.models.config",
    "keras_moe.models.data",
    "keras_moe.models.decoding",
    "keras_moe.models.flat_moe_gin",
    "keras_moe.models.normalization",
    "keras_moe.models.objective",
    "keras_moe.models.position_bias",
    "keras_moe.models.search",
    "keras_moe.models.serving",
    "keras_moe.models.sparse_ffn",
    "keras_moe.models.sparse_ffn_checks",
    "keras_moe.models.transformer",
    "keras_moe.dropless_exchange",
    "keras_moe.moe",
    "keras_moe.replica_context",
    "keras_moe.router_losses",
    "keras_moe.routing_scope",
    "keras_moe.shared_experts",
    "keras_moe.routing.base",
    "keras_moe.routing.expert_choice",
    "keras_moe.routing.selection",
    "keras_moe.routing.token_choice",
    "keras_moe.sharding",
    "keras_moe.tensor_types",
    "keras_moe.startup",
    "keras_moe.token_exchange",
    "keras_moe.training.checkpoint",
    "keras_moe.training.checkpoint_config",
    "keras_moe.training.checkpoint_manager",
    "keras_moe.training.checkpoint_restore",
    "keras_moe.training.cli",
    "keras_moe.training.compile_memory",
    "keras_moe.training.compile_only",
    "keras_moe.training.compile_progress",
    "keras_moe.training.compile_report",
    "keras_moe.training.console",
    "keras_moe.training.expert_load",
    "keras_moe.training.hlo_collectives",
    "keras_moe.tasks.docs",
    "keras_moe.training.data",
    "keras_moe.training.dataset_config",
    "keras_moe.training.dtype_policy",
    "keras_moe.training.log",
    "keras_moe.training.mesh",
    "keras_moe.training.multihost",
    "keras_moe.training.placement",
    "keras_moe.training.roofline",
    "keras_moe.training.rng_state",
    "keras_moe.training.run",
    "keras_moe.training.schedules",
    "keras_moe.training.sharded_checkpoint",
    "keras_moe.training.summary",
    "keras_moe.training.train_config",
    "keras_moe.training.tpu_topology",
    "keras_moe.training.trainer",
    "keras_moe.validation",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    try:
        for test in finder.find(module, name, globs=dict(vars(module))):
            runner.run(test, out=report.write)
    finally:
        gin.clear_config()
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{name} has no >>> examples"
    assert result.failed == 0, report.getvalue()
