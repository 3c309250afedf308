"""The expert-load history: heat-map data, its files, and a resumed logger extending it."""

import json

import keras
import numpy as np

import keras_moe
from keras_moe.training.run import expert_load, load_history
from keras_moe.training.run.fit_callbacks import TrainingLogger


def _entry(step, loads, dropped):
    return {"step": step, "load": loads, "dropped_fraction": dropped}


def test_heat_map_data_is_experts_by_steps_per_layer():
    entries = [
        _entry(10, {"enc": [0.5, 0.25, 0.25], "dec": [1.0, 0.0, 0.0]}, {"enc": 0.1, "dec": 0.2}),
        _entry(20, {"enc": [0.2, 0.3, 0.5]}, {"enc": 0.0}),  # dec not measured
        _entry(30, {"enc": [0.0, 0.0, 1.0], "dec": [0.2, 0.2, 0.6]}, {"enc": 0.4}),
    ]
    steps, load, dropped = load_history.history_matrix(entries, "enc")
    assert steps.tolist() == [10, 20, 30]
    # Rows are experts, columns steps: expert 2's share grows 0.25 -> 0.5 -> 1.
    np.testing.assert_array_equal(load, [[0.5, 0.2, 0.0], [0.25, 0.3, 0.0], [0.25, 0.5, 1.0]])
    np.testing.assert_array_equal(dropped, [0.1, 0.0, 0.4])

    steps, load, dropped = load_history.history_matrix(entries, "dec")
    assert steps.tolist() == [10, 30]
    np.testing.assert_array_equal(load, [[1.0, 0.2], [0.0, 0.2], [0.0, 0.6]])
    assert dropped[0] == 0.2 and np.isnan(dropped[1])  # step 30 has no dec drop
    assert load_history.layers_of(entries) == ["enc", "dec"]


def test_history_files_round_trip_and_resume_cut(tmp_path):
    entries = [_entry(s, {"enc": [0.5, 0.5]}, {"enc": 0.0}) for s in (5, 10, 15)]
    png = load_history.write_history(str(tmp_path), entries)
    assert png == str(tmp_path / "expert_load_history.png")
    assert (tmp_path / "expert_load_history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_history.read_history(str(tmp_path)) == entries
    assert [e["step"] for e in load_history.read_history(str(tmp_path), up_to_step=10)] == [5, 10]
    assert load_history.read_history(str(tmp_path / "nothing_here")) == []
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave no temporary file


class _Model(keras_moe.RouterMetricsMixin, keras.Model):
    def __init__(self):
        super().__init__(name="model")
        self.moe = keras_moe.TopKFeedForward(8, 8, k=2, name="moe")  # 8 experts

    def call(self, x, training=None):
        return x + self.moe(x, training=training)


def test_resumed_logger_keeps_the_history_up_to_its_step_and_extends_it(tmp_path, rng):
    model = _Model()
    model.compile("adam", "mse")
    x = rng.normal(size=(8, 6, 16)).astype("float32")
    model(x[:1])
    path = next(iter(expert_load.moe_layers(model)))
    # A run measured steps 2, 4 and 6, then was killed; its newest checkpoint is step 4.
    stale = [_entry(s, {path: [1.0] + [0.0] * 7}, {path: 0.5}) for s in (2, 4, 6)]
    (tmp_path / "expert_load_history.json").write_text(json.dumps(stale))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(4)

    logger = TrainingLogger(
        None,
        tokens_per_step=24,
        log_every=100,
        probe_batch=x[:4],
        expert_load_every=2,
        history_dir=str(tmp_path),
    )
    model.fit(x, x, batch_size=4, epochs=1, callbacks=[logger], verbose=0)  # steps 5, 6

    history = json.loads((tmp_path / "expert_load_history.json").read_text())
    assert [e["step"] for e in history] == [2, 4, 6]
    assert history[:2] == stale[:2]
    measured = expert_load.measure_router_pass(model, [x[:4]])[path]
    np.testing.assert_allclose(history[2]["load"][path], measured["load"], rtol=1e-6)
    assert history[2]["dropped_fraction"][path] == measured["dropped_fraction"]
    assert "train_dropped_fraction" in history[2]
    assert (tmp_path / "expert_load_history.png").is_file()


def _drawn(monkeypatch, plot, *args):
    """The figure `plot` draws (instead of writing it), rendered so text has a size."""
    from keras_moe.training.run import expert_load

    drawn = []
    monkeypatch.setattr(expert_load, "save_figure", lambda fig, path: drawn.append(fig))
    plot(*args, "unused.png")
    (fig,) = drawn
    fig.canvas.draw()
    return fig


def test_the_history_plot_spans_the_steps_of_the_run(monkeypatch):
    """Measured at 0, 100, 200 and 300 of a 300-step run: the step axis runs from 0 to
    300 (it ran to 350, half a cell past the end)."""
    from keras_moe.training.run.load_history import plot_history

    entries = [
        {"step": s, "load": {"enc": [0.5, 0.5]}, "dropped_fraction": {"enc": 0.1}}
        for s in (0, 100, 200, 300)
    ]
    fig = _drawn(monkeypatch, plot_history, entries)
    for ax in fig.axes:
        if ax.get_xlabel() == "step" or ax.get_ylabel() in ("expert", "dropped"):
            assert ax.get_xlim() == (0.0, 300.0), (ax.get_ylabel(), ax.get_xlim())


def test_expert_load_plot_labels_do_not_overlap_at_32_or_128_experts(monkeypatch):
    from keras_moe.training.run.expert_load import plot_expert_load

    for num_experts in (8, 32, 128):
        load = np.full(num_experts, 1.0 / num_experts)
        fig = _drawn(monkeypatch, plot_expert_load, {"encoder/ffn": load, "decoder/ffn": load})
        for ax in fig.axes:
            boxes = [
                label.get_window_extent() for label in ax.get_xticklabels() if label.get_text()
            ]
            assert len(boxes) >= min(num_experts, 8), num_experts
            for left, right in zip(boxes, boxes[1:], strict=False):
                assert left.x1 < right.x0, (num_experts, left, right)
