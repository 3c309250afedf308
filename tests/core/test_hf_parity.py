"""SwitchFeedForward vs HF transformers' SwitchTransformersSparseMLP (torch, CPU), same weights."""

import numpy as np
import pytest
import torch  # test-only reference; .ci/run installs torch==2.13.0
from transformers import SwitchTransformersConfig
from transformers.models.switch_transformers import modeling_switch_transformers as switch

import keras_moe


def _hf_mlp(num_experts, expert_capacity, d_model=16, d_ff=32):
    config = SwitchTransformersConfig(
        d_model=d_model,
        d_ff=d_ff,
        num_experts=num_experts,
        expert_capacity=expert_capacity,
        router_jitter_noise=0.0,
        dropout_rate=0.0,
        dense_act_fn="relu",
        router_bias=False,
    )
    torch.manual_seed(0)
    mlp = switch.SwitchTransformersSparseMLP(config).eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0, 0.5)
    return mlp


def _copy_to_keras(mlp, num_experts, capacity, d_model=16, d_ff=32):
    layer = keras_moe.SwitchFeedForward(
        num_experts=num_experts,
        d_ff=d_ff,
        eval_capacity_factor=1e-6,
        min_expert_capacity=capacity,
        dispatch="gather",
        group_size="sequence",  # as HF
    )
    layer.build((None, 8, d_model))
    layer.router.kernel.assign(mlp.router.classifier.weight.detach().numpy().T)
    wi = np.stack(
        [mlp.experts[f"expert_{e}"].wi.weight.detach().numpy().T for e in range(num_experts)]
    )
    wo = np.stack(
        [mlp.experts[f"expert_{e}"].wo.weight.detach().numpy().T for e in range(num_experts)]
    )
    layer.experts.wi.assign(wi)
    layer.experts.wo.assign(wo)
    return layer


@pytest.mark.parametrize("capacity", [8, 2])  # 8: nothing can drop; 2: tokens drop
def test_switch_layer_matches_hf_sparse_mlp(rng, capacity):
    num_experts = 4
    mlp = _hf_mlp(num_experts, capacity)
    layer = _copy_to_keras(mlp, num_experts, capacity)
    x = rng.normal(size=(3, 8, 16)).astype("float32")
    with torch.no_grad():
        expected = mlp(torch.from_numpy(x)).numpy()
    for dispatch in ("gather", "einsum"):
        layer.dispatcher = keras_moe.get_dispatcher(dispatch)
        got = np.asarray(layer(x, training=False))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    if capacity == 2:
        assert (np.abs(expected).sum(-1) == 0).any()  # the drop case really dropped
