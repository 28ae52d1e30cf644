"""Keras layers of the attentional encoder-decoder."""

from layers.attention_decoder import AttentionDecoder
from layers.bahdanau_attention import BahdanauAttention
from layers.causal_self_attention import CausalSelfAttention
from layers.encoder_decoder_model import EncoderDecoderModel
from layers.luong_attention import LuongAttention
from layers.multi_head_cross_attention import MultiHeadCrossAttention
from layers.recurrent_encoder import RecurrentEncoder
from layers.scaled_dot_product_attention import ScaledDotProductAttention
from layers.scheduled_sampling import SamplingSchedule
from layers.seq2seq import Seq2Seq
from layers.source_attention import SourceAttention
from layers.state_bridge import StateBridge
from layers.transformer import Transformer
from layers.transformer_decoder_layer import TransformerDecoderLayer

__all__ = [
    "AttentionDecoder",
    "BahdanauAttention",
    "CausalSelfAttention",
    "EncoderDecoderModel",
    "LuongAttention",
    "MultiHeadCrossAttention",
    "RecurrentEncoder",
    "SamplingSchedule",
    "ScaledDotProductAttention",
    "Seq2Seq",
    "SourceAttention",
    "StateBridge",
    "Transformer",
    "TransformerDecoderLayer",
]
