"""Keras layers of the attentional encoder-decoder."""

import warnings

from layers.attention_decoder import AttentionDecoder
from layers.bahdanau_attention import BahdanauAttention
from layers.causal_self_attention import CausalSelfAttention
from layers.convolutional_encoder import ConvolutionalEncoder
from layers.encoder_decoder_model import EncoderDecoderModel
from layers.fused_gru import FusedGRU
from layers.fused_lstm import FusedLSTM
from layers.luong_attention import LuongAttention
from layers.multi_head_cross_attention import MultiHeadCrossAttention
from layers.recurrent_encoder import RecurrentEncoder
from layers.recurrent_seq2seq import RecurrentSeq2Seq
from layers.scaled_dot_product_attention import ScaledDotProductAttention
from layers.scheduled_sampling import SamplingSchedule
from layers.self_attention_encoder import SelfAttentionEncoder
from layers.sixteen_bit_dropout import SixteenBitDropout
from layers.source_attention import SourceAttention
from layers.split_sine_positions import SplitSinePositions
from layers.state_bridge import StateBridge
from layers.transformer import Transformer
from layers.transformer_decoder_layer import TransformerDecoderLayer
from layers.transformer_encoder_layer import TransformerEncoderLayer

__all__ = [
    "AttentionDecoder",
    "BahdanauAttention",
    "CausalSelfAttention",
    "ConvolutionalEncoder",
    "EncoderDecoderModel",
    "FusedGRU",
    "FusedLSTM",
    "LuongAttention",
    "MultiHeadCrossAttention",
    "RecurrentEncoder",
    "RecurrentSeq2Seq",
    "SamplingSchedule",
    "ScaledDotProductAttention",
    "SelfAttentionEncoder",
    "SixteenBitDropout",
    "SourceAttention",
    "StateBridge",
    "SplitSinePositions",
    "Transformer",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
]


def __getattr__(name):
    if name == "Seq2Seq":  # the recurrent model's name before RecurrentSeq2Seq
        warnings.warn(
            "layers.Seq2Seq is deprecated: use layers.RecurrentSeq2Seq", DeprecationWarning, 2
        )
        return RecurrentSeq2Seq
    raise AttributeError(f"module 'layers' has no attribute {name!r}")
