"""TF expert parallelism under MirroredStrategy on 8 logical CPUs (see tf_checks.py)."""

import pytest

# One pytest-xdist worker runs all of them, so the check script runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tf_checks")]

CASES = ["gather/relu", "einsum/gated-gelu"]


@pytest.mark.parametrize("case", CASES)
def test_each_replica_runs_its_share_of_experts(tf_result, case):
    assert tf_result[case]["local_experts"] == 1  # 8 experts over 8 replicas


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_unsharded(tf_result, case):
    res = tf_result[case]
    assert res["max_out"] > 1e-4
    assert res["max_out_diff"] < 1e-6


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_unsharded(tf_result, case):
    res = tf_result[case]
    assert len(res["grad_names"]) in (3, 4)
    assert res["max_grad"] > 1e-3
    # Float32 sums over the replicas in another order differ by a few ulp of the
    # largest gradient (1.9e-6 of 9.6 on an AVX-512 CPU); a wrong expert is O(max_grad).
    assert res["max_grad_diff"] < 1e-5 * res["max_grad"]


def test_fit_matches_single_device(tf_result):
    fit = tf_result["fit"]
    assert fit["local_experts"] == 1
    assert fit["weight_change"] > 1e-4  # training moved the weights
    assert fit["max_weight_diff"] < 1e-6


def test_indivisible_experts_error(tf_result):
    assert "divisible by the number of replicas (8)" in (tf_result["indivisible_error"] or "")


@pytest.mark.parametrize("case", CASES)
def test_each_replica_sees_only_its_own_aux_losses(tf_result, case):
    res = tf_result[case]
    assert res["num_losses"] == res["ref_num_losses"] == 2
    # float32 sums over 8 replicas in another order: a few ulps of the loss.
    assert abs(res["loss"] - res["ref_loss"]) <= 4e-6 * max(1.0, abs(res["ref_loss"]))


def test_fit_logs_the_single_device_loss(tf_result):
    fit = tf_result["fit"]
    for got, want in zip(fit["loss"], fit["ref_loss"], strict=False):
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
