"""Tokens reach the experts by all-to-all (keras_moe.parallel.token_exchange), see
exchange_checks.py.

Numerics on 8 emulated CPU devices against the same layer without a mesh; the
collectives from libtpu's compiler for a v5e:2x2 slice (4 chips, 2 of 8 experts each).
"""

import pytest

from keras_moe.parallel import token_exchange

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("exchange_checks")]


@pytest.mark.parametrize("mode", ["all_to_all", "gspmd"])
def test_outputs_and_gradients_match_the_layer_without_a_mesh(exchange_result, mode):
    numerics = exchange_result["numerics"]
    assert numerics["dropped_any"]  # capacity factor 1.0 drops tokens: slots matter
    res = numerics[mode]
    assert res["max_y_diff"] < 1e-5
    assert res["grad_scale"] > 1.0  # the comparison is not vacuous
    # Float32 sums in another order; a token in the wrong expert's slot is O(scale).
    assert res["max_grad_diff"] < 1e-5 * res["grad_scale"]


def _kinds(collectives):
    return sorted(c["kind"] for c in collectives)


def test_forward_moves_tokens_by_exactly_two_all_to_alls_on_tpu(exchange_result):
    forward = exchange_result["tpu"]["all_to_all"]["forward"]
    assert _kinds(forward) == ["all-to-all", "all-to-all"]
    # Each carries one chip's expert buffers [E, G/4, C, d] = 8 * 2 * 4 * 16 values
    # (one group per sequence of 32 tokens, capacity 32 * 1.0 / 8 = 4). The TPU
    # compiler sends them as bfloat16: its default-precision einsums round the
    # float32 tokens to bfloat16 anyway, so it moves the rounding before the exchange.
    assert all(c["group_size"] == 4 for c in forward)
    values = 8 * 2 * 4 * 16
    assert [c["result_bytes"] for c in forward] in ([values * 2] * 2, [values * 4] * 2)


def test_backward_adds_two_all_to_alls_and_no_all_gather(exchange_result):
    both = exchange_result["tpu"]["all_to_all"]["forward_backward"]
    kinds = _kinds(both)
    assert kinds.count("all-to-all") == 4 and "all-gather" not in kinds
    # The one all-reduce sums the replicated router kernel's gradient [d, E].
    assert [c["result_bytes"] for c in both if c["kind"] == "all-reduce"] == [16 * 8 * 4]


def test_gspmd_exchange_moves_more_in_the_backward(exchange_result):
    gspmd = exchange_result["tpu"]["gspmd"]["forward_backward"]
    explicit = exchange_result["tpu"]["all_to_all"]["forward_backward"]
    moved = [
        sum(c["received_bytes"] for c in run if c["kind"] != "all-reduce")
        for run in (explicit, gspmd)
    ]
    assert moved[1] > moved[0]


def test_all_to_all_refuses_a_single_group_by_name(exchange_result):
    message = exchange_result["numerics"]["batch_group_error"]
    assert message and "expert_exchange='all_to_all'" in message
    assert "group_size='batch'" in message


LOCAL_CASES = [
    f"{group} {mesh}"
    for group in ("batch", 8, 40)
    for mesh in ({"data": 2, "expert": 4}, {"data": 8}, {"expert": 8})
]


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_groups_on_a_mesh_are_each_shards_local_batch(exchange_result, case):
    res = exchange_result["local_groups"][case]
    # The same numbers as the layer without a mesh applied to each shard's 2 sequences...
    assert res["max_diff_per_shard"] < 1e-5, res
    if not case.startswith("8 "):
        # ...which differ from one group of all 16 (8-token groups never crossed shards).
        assert res["dropped_per_shard"] > 0 and res["max_diff_whole"] > 1e-2, res
    expected = "gspmd" if "expert" not in case else "all_to_all"
    assert res["exchanges"] == [expected], res


def test_an_integer_group_that_does_not_divide_a_shard_is_refused(exchange_result):
    message = exchange_result["local_groups"]["indivisible_error"]
    assert message and "`group_size`=16" in message and "24 tokens" in message
    assert "8 shards" in message and "pad_to_group_size=True" in message


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="expert_exchange.*all_to_all"):
        token_exchange.set_expert_exchange("alltoall")
    assert token_exchange.get_expert_exchange() == "auto"


@pytest.mark.parametrize("router", ["top1", "top2"])
def test_dropless_with_sharded_experts_matches_the_layer_without_a_mesh(exchange_result, router):
    """Rows travel to their experts' devices and back: outputs, gradients and losses as on one
    device (a row at the wrong expert, or lost, moves an output by O(scale))."""
    res = exchange_result["dropless"][router]
    assert res["exchanges"] == ["all_to_all"]  # the row exchange, not gathered weights
    assert res["y_scale"] > 0.1 and res["grad_scale"] > 1.0
    assert res["max_y_diff"] < 1e-5 * res["y_scale"] * 10
    assert res["max_grad_diff"] < 1e-5 * res["grad_scale"]
    assert res["max_loss_diff"] < 1e-6


def test_a_dropless_receive_buffer_drops_what_does_not_fit_and_counts_it(exchange_result):
    res = exchange_result["dropless"]["buffer_0.6"]
    assert 0.05 < res["zero_fraction"] < 0.9  # 0.6 x the rows cannot hold all of them
    assert abs(res["dropped_fraction"] - res["zero_fraction"]) < 1e-6
    assert res["max_diff_of_the_others"] < 1e-4


def test_dropless_on_tpu_moves_rows_by_ragged_all_to_all_and_gathers_no_weight(exchange_result):
    kinds = _kinds(exchange_result["dropless_tpu"])
    # Forward: rows out and back; backward: their transposes. The small all-to-alls are the
    # per-expert row counts and offsets.
    assert kinds.count("ragged-all-to-all") == 4
    assert "all-gather" not in kinds
    small = [c for c in exchange_result["dropless_tpu"] if c["kind"] == "all-to-all"]
    assert small and all(c["result_bytes"] <= 64 for c in small)
