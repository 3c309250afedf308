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
    "benchmarks.memory_plan_tables",
    "benchmarks.quality_stats",
    "keras_moe.arguments",
    "keras_moe.compat",
    "keras_moe.convert.hf",
    "keras_moe.convert.hf_config",
    "keras_moe.dispatch",
    "keras_moe.dispatch.dropless",
    "keras_moe.dispatch.einsum",
    "keras_moe.dispatch.gather",
    "keras_moe.dispatch.grouped_matmul",
    "keras_moe.dispatch.grouped_matmul_looped",
    "keras_moe.distill.distiller_builder",
    "keras_moe.distill.distiller",
    "keras_moe.distill.init_from_teacher",
    "keras_moe.distill.distillation_objective",
    "keras_moe.layers.expert_parallel",
    "keras_moe.layers.experts",
    "keras_moe.layers.dense_feedforward",
    "keras_moe.layers.feedforward",
    "keras_moe.layers.feedforward_mixin",
    "keras_moe.gin_config.parse",
    "keras_moe.gin_config.errors",
    "keras_moe.gin_config.unread",
    "keras_moe.layers",
    "keras_moe.parallel.layouts",
    "keras_moe.parallel.local_groups",
    "keras_moe.log_filters",
    "keras_moe.routing.metrics",
    "keras_moe.mixin_bases",
    "keras_moe.models.adafactor",
    "keras_moe.models.attention",
    "keras_moe.models.blocks",
    "keras_moe.models.model_builder",
    "keras_moe.models.config",
    "keras_moe.models.keras_features",
    "keras_moe.models.decoding",
    "keras_moe.gin_config.flat_moe_gin",
    "keras_moe.models.normalization",
    "keras_moe.models.seq2seq_objective",
    "keras_moe.models.position_bias",
    "keras_moe.models.progress",
    "keras_moe.models.search",
    "keras_moe.models.search_loops",
    "keras_moe.models.serving",
    "keras_moe.models.sparse_ffn",
    "keras_moe.models.text_io",
    "keras_moe.models.transformer",
    "keras_moe.models.upcycle",
    "keras_moe.models.variable_paths",
    "keras_moe.dispatch.dropless_exchange",
    "keras_moe.layers.moe",
    "keras_moe.layers.moe_arguments",
    "keras_moe.parallel.replica_context",
    "keras_moe.routing.losses",
    "keras_moe.routing.scope",
    "keras_moe.layers.shared_experts",
    "keras_moe.routing.base",
    "keras_moe.routing.expert_choice",
    "keras_moe.routing.selection",
    "keras_moe.routing.token_choice",
    "keras_moe.parallel.sharding",
    "keras_moe.tensor_types",
    "keras_moe.startup",
    "keras_moe.parallel.token_exchange",
    "keras_moe.training.checkpoint",
    "keras_moe.training.checkpoint.checkpoint_config",
    "keras_moe.training.checkpoint.checkpoint_manager",
    "keras_moe.training.checkpoint.checkpoint_restore",
    "keras_moe.training.train_cli",
    "keras_moe.tpu_compile.compile_memory",
    "keras_moe.tpu_compile.compile_only",
    "keras_moe.tpu_compile.compile_progress",
    "keras_moe.training.run.expert_load",
    "keras_moe.training.run.load_history",
    "keras_moe.tpu_compile.hlo_collectives",
    "keras_moe.tasks.docs",
    "keras_moe.training.run.input_pipeline",
    "keras_moe.training.run.dataset_config",
    "keras_moe.training.run.dtype_policy",
    "keras_moe.training.log",
    "keras_moe.training.placement.mesh",
    "keras_moe.training.placement.multihost",
    "keras_moe.training.placement.strategy_placement",
    "keras_moe.training.placement.mesh_placement",
    "keras_moe.tpu_compile.roofline",
    "keras_moe.training.checkpoint.rng_state",
    "keras_moe.training.run.training_run",
    "keras_moe.training.run.schedules",
    "keras_moe.training.checkpoint.sharded_checkpoint",
    "keras_moe.training.checkpoint.upcycle_checkpoint",
    "keras_moe.training.run.summary",
    "keras_moe.training.train_config",
    "keras_moe.tpu_compile.tpu_topology",
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
