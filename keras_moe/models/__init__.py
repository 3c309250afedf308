"""T5.1.1 / Switch / GShard encoder-decoder models for keras_moe."""

from keras_moe.models import decoding
from keras_moe.models import losses
from keras_moe.models.attention import T5Attention
from keras_moe.models.builder import build_model as _build_model_plain
from keras_moe.models.builder import gin_dirs, gin_path
from keras_moe.models.config import (
    T5Config,
    count_params,
    hf_sparse_layers,
    sparse_layers_from_step,
)
from keras_moe.models.data import seqio_to_keras
from keras_moe.models.layers import DenseFeedForward, RMSNorm
from keras_moe.models.losses import (
    NegLogPerplexity,
    TokenCrossEntropy,
    compile_defaults,
    token_cross_entropy,
    token_log_likelihood,
)
from keras_moe.models.position_bias import RelativePositionBias, relative_position_bucket
from keras_moe.models.transformer import DecoderBlock, EncoderBlock, EncoderDecoder

try:  # gin is optional: without it `build_model` is the plain function.
    from keras_moe.models.gin_configurables import build_model, parse_gin
except ImportError:  # pragma: no cover
    build_model = _build_model_plain
    parse_gin = None

__all__ = [
    "DecoderBlock", "DenseFeedForward", "EncoderBlock", "EncoderDecoder", "NegLogPerplexity",
    "RMSNorm", "RelativePositionBias", "T5Attention", "T5Config", "TokenCrossEntropy", "build_model",
    "compile_defaults", "count_params", "decoding", "gin_dirs", "gin_path", "hf_sparse_layers",
    "losses", "parse_gin", "relative_position_bucket", "seqio_to_keras",
    "sparse_layers_from_step", "token_cross_entropy", "token_log_likelihood",
]
