"""T5.1.1 / Switch / GShard encoder-decoder models for keras_moe."""

from keras_moe.models import decoding, seq2seq_objective
from keras_moe.models.attention import T5Attention
from keras_moe.models.blocks import DecoderBlock, EncoderBlock
from keras_moe.models.config import (
    T5Config,
    count_params,
    hf_sparse_layers,
    sparse_layers_from_step,
)
from keras_moe.models.keras_features import seqio_to_keras
from keras_moe.models.model_builder import build_model
from keras_moe.models.normalization import RMSNorm
from keras_moe.models.position_bias import RelativePositionBias, relative_position_bucket
from keras_moe.models.seq2seq_objective import (
    NegLogPerplexity,
    TokenCrossEntropy,
    compile_defaults,
    token_cross_entropy,
    token_log_likelihood,
)
from keras_moe.models.transformer import EncoderDecoder

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "EncoderDecoder",
    "NegLogPerplexity",
    "RMSNorm",
    "RelativePositionBias",
    "T5Attention",
    "T5Config",
    "TokenCrossEntropy",
    "build_model",
    "compile_defaults",
    "count_params",
    "decoding",
    "hf_sparse_layers",
    "relative_position_bucket",
    "seq2seq_objective",
    "seqio_to_keras",
    "sparse_layers_from_step",
    "token_cross_entropy",
    "token_log_likelihood",
]
