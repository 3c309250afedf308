"""Expert sharding on the JAX backend over 8 emulated CPU devices (see jax_checks.py)."""

import pytest

# One pytest-xdist worker runs all of them, so the check script runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("jax_checks")]

MESHES = {"data=2,expert=4": 4, "data=1,expert=8": 8}
CASES = [
    ("data=2,expert=4", "einsum"),
    ("data=2,expert=4", "gather"),
    ("data=1,expert=8", "einsum"),
]


def test_eight_devices_and_no_op_without_mesh(jax_result):
    assert jax_result["backend"] == "jax"
    assert jax_result["devices"] == 8
    assert jax_result["noop_identity"] is True


@pytest.mark.parametrize("mesh,dispatch", CASES)
def test_expert_weights_are_sharded(jax_result, mesh, dispatch):
    expert_axis = MESHES[mesh]
    shards = jax_result["meshes"][mesh][dispatch]["shards"]
    for name, tail in (("wi", [16, 32]), ("wo", [32, 16])):
        info = shards[name]
        assert info["spec"] == "P('expert', None, None)"
        assert info["num_shards"] == 8
        # Each device holds E / expert_axis experts, and together they hold all 8.
        assert info["shard_shapes"] == [[8 // expert_axis] + tail]
        slices = info["expert_slices"]
        assert len(slices) == expert_axis
        assert sorted(e for s in slices for e in range(*s)) == list(range(8))
    assert shards["router_spec"] == "P(None, None)"


@pytest.mark.parametrize("mesh,dispatch", CASES)
def test_train_step_has_all_to_all(jax_result, mesh, dispatch):
    assert jax_result["meshes"][mesh][dispatch]["hlo"]["all-to-all"] >= 2


@pytest.mark.parametrize("mesh,dispatch", CASES)
def test_loss_and_gradients_match_unsharded(jax_result, mesh, dispatch):
    res = jax_result["meshes"][mesh][dispatch]
    assert res["loss"] == pytest.approx(res["ref_loss"], rel=1e-5)
    assert res["max_grad"] > 1e-3  # the comparison is not vacuous
    # Float32 sums over the replicas in another order differ by a few ulp of the
    # largest gradient (1.9e-6 of 9.6 on an AVX-512 CPU); a wrong expert is O(max_grad).
    assert res["max_grad_diff"] < 1e-5 * res["max_grad"]


def test_tokens_are_split_over_data_and_expert(jax_result):
    data_spec = jax_result["meshes"]["data=2,expert=4"]["data_spec"]
    assert data_spec == "P(('data', 'expert'), None, None)"
    assert jax_result["meshes"]["data=1,expert=8"]["data_spec"] == "P('expert', None, None)"


def test_fit_runs_under_the_distribution(jax_result):
    losses = jax_result["fit_loss"]
    assert len(losses) == 2 and all(0 < v < 10 for v in losses)


def test_switch_t5_fits_sharded(jax_result):
    t5 = jax_result["t5"]
    if isinstance(t5, str):
        pytest.skip(t5)
    assert 0 < t5["loss"][0] < 20
    specs = t5["specs"]
    experts = [p for p in specs if p.endswith("experts/wi") or p.endswith("experts/wo")]
    assert experts and all(specs[p] == "P('expert', None, None)" for p in experts)
    # mlp/heads/vocab go to the "model" axis, which has size 1 here.
    assert specs["token_embedding/embeddings"] == "P(None, None)"


@pytest.mark.parametrize(
    "name,needle",
    [
        ("mesh_size", "4 devices but 8 devices"),
        ("num_experts", "`num_experts`=6 is not divisible by the 'expert' mesh axis size 8"),
        ("unknown_logical", "Unknown logical axis 'experts'"),
        ("unknown_mesh_axis", "Unknown mesh axis 'tensor'"),
        ("indivisible_layer", "'moe6/experts/wi'"),
        ("unknown_tag", "Unknown logical axis 'hidden'"),
    ],
)
def test_setup_errors(jax_result, name, needle):
    message = jax_result["errors"][name]
    assert message is not None, f"{name}: no ValueError"
    assert needle in message


def test_clear_mesh(jax_result):
    assert jax_result["cleared"] is True
