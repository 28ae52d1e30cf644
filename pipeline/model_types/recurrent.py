"""Recurrent encoder-decoders with attention (`model.type: rnn`): Bahdanau et al. (2015) and
Luong et al. (2015)."""

from pipeline.core.errors import UserError
from pipeline.core.fields import Field, positive_int, rate
from pipeline.model_types.model_type import ModelType

ENCODER_TYPES = ("recurrent", "transformer", "convolutional")
ATTENTIONS = (
    "bahdanau", "luong_dot", "luong_general", "luong_concat", "scaled_dot", "multi_head", "none",
)  # fmt: skip

KEYS = {
    "cell_type": Field(str, "lstm", "the recurrent cell of the encoder and decoder layers",
                       choices=("lstm", "gru", "simple_rnn")),
    "embedding_dim": positive_int(256, "size of the source and target token embeddings (and a "
                                  "transformer or convolutional encoder's width)"),
    "encoder_type": Field(str, "recurrent", "the encoder: recurrent layers, or Transformer layers "
                          "or gated convolutions, without a loop over time (fast students)",
                          choices=ENCODER_TYPES),
    "encoder_kernel_size": positive_int(3, "convolutional encoder: tokens in each convolution's "
                                        "window (odd)"),
    "encoder_heads": positive_int(4, "transformer encoder: self-attention heads (embedding_dim "
                                  "must divide by it)"),
    "encoder_ffn_dim": positive_int(1024, "transformer encoder: hidden size of the feed-forward "
                                    "networks"),
    "encoder_units": positive_int(256, "units of each encoder layer, per direction"),
    "bidirectional": Field(bool, True, "run every encoder layer in both directions"),
    "merge_mode": Field(str, "concat", "how a bidirectional encoder combines its two directions' "
                        "outputs and states", choices=("concat", "sum")),
    "reverse_source": Field(bool, False, "feed the encoder the source reversed (Sutskever et al., "
                            "2014); its outputs stay in source order"),
    "encoder_output_dropout": rate(None, "dropout rate on the encoder's outputs, the attention's "
                                   "memory (null: model.dropout's)", nullable=True),
    "residual": Field(bool, False, "residual connections: each stacked layer's input added to "
                      "its output, from the second layer on"),
    "decoder_units": positive_int(512, "units of each decoder layer"),
    "attention": Field(str, "bahdanau", "the decoder's attention over the encoder's outputs "
                       "(none: the source reaches it via its initial state only)",
                       choices=ATTENTIONS),
    "attention_units": positive_int(256, "attention size: bahdanau's and luong_concat's score "
                                    "layer, scaled_dot's projections, multi_head's (all heads)"),
    "attention_heads": positive_int(4, "multi_head: the number of attention heads"),
    "attention_normalize": Field(bool, False, "bahdanau: the weight-normalised score, v scaled "
                                 "to a learned norm (Salimans & Kingma, 2016)"),
    # So that the attention can sharpen without its score growing unbounded (see docs).
    "attention_scale": Field(bool, True, "luong_dot and luong_general: multiply the scaled score "
                             "by a learned scalar, initialised to 1"),
    # It keeps early attention from saturating.
    "attention_qk_norm": Field(bool, True, "scaled_dot and multi_head: layer-normalise the "
                               "projected queries and keys before their product"),
    # false (slices of the memory itself) trained as well with fewer weights.
    "attention_project_values": Field(bool, False, "multi_head: mix learned projections of the "
                                      "encoder's outputs (false: equal slices, one per head)"),
    "input_feeding": Field(bool, False, "feed Luong et al.'s attentional vector into the next "
                           "decoder step (needs an attention)"),
    "attention_vector_size": positive_int(None, "size of the attentional vector tanh(W [context; "
                                          "state]) (null: decoder_units)", nullable=True),
    "bridge": Field(str, "dense", "how the encoder's final states start the decoder: through a "
                    "tanh layer, copied (same shapes) or zeros", choices=("dense", "copy", "zero")),
}  # fmt: skip


def memory_dim(model):
    """The width of the encoder's outputs, which the attention reads."""
    if model["encoder_type"] != "recurrent":
        return model["embedding_dim"]
    concat = model["bidirectional"] and model["merge_mode"] == "concat"
    return model["encoder_units"] * (2 if concat else 1)


def check(config, where):
    model = config["model"]
    if model["encoder_type"] == "transformer":
        if model["embedding_dim"] % model["encoder_heads"]:
            raise UserError(
                f"{where}: model.embedding_dim ({model['embedding_dim']}) must be divisible by "
                f"model.encoder_heads ({model['encoder_heads']}) for model.encoder_type "
                "transformer"
            )
    if model["encoder_type"] == "convolutional" and model["encoder_kernel_size"] % 2 == 0:
        raise UserError(
            f"{where}: model.encoder_kernel_size must be odd (a window centred on its token), "
            f"got {model['encoder_kernel_size']}"
        )
    if model["encoder_type"] != "recurrent" and model["reverse_source"]:
        raise UserError(
            f"{where}: model.reverse_source needs model.encoder_type recurrent (a "
            f"{model['encoder_type']} encoder reads the whole source at once)"
        )
    if model["input_feeding"] and model["attention"] == "none":
        raise UserError(f"{where}: model.input_feeding needs model.attention other than none")
    if model["attention"] == "luong_dot" and model["decoder_units"] != memory_dim(model):
        raise UserError(
            f"{where}: model.attention luong_dot needs model.decoder_units "
            f"({model['decoder_units']}) equal to the encoder output size ({memory_dim(model)})"
        )
    if (
        model["attention"] == "multi_head"
        and not model["attention_project_values"]
        and memory_dim(model) % model["attention_heads"]
    ):
        raise UserError(
            f"{where}: model.attention_project_values false needs the encoder output size "
            f"({memory_dim(model)}) to divide by model.attention_heads "
            f"({model['attention_heads']})"
        )


def build_attention(model_config):
    import layers

    name, units = model_config["attention"], model_config["attention_units"]
    if name == "none":
        return None
    if name == "bahdanau":
        return layers.BahdanauAttention(units, normalize=model_config["attention_normalize"])
    if name.startswith("luong_"):
        score = name.removeprefix("luong_")
        # The concat score's v already learns its scale.
        scale = model_config["attention_scale"] and score != "concat"
        return layers.LuongAttention(score, scale=scale, units=units)
    if name == "scaled_dot":
        return layers.ScaledDotProductAttention(
            projection_dim=units, project_values=True, qk_norm=model_config["attention_qk_norm"]
        )
    heads = model_config["attention_heads"]
    return layers.MultiHeadCrossAttention(
        heads,
        key_dim=max(1, units // heads),
        qk_norm=model_config["attention_qk_norm"],
        project_values=model_config["attention_project_values"],
    )


def sampling_schedule(train_config):
    import layers

    if train_config["sampling_schedule"] == "none":
        return None
    return layers.SamplingSchedule(
        train_config["sampling_schedule"],
        probability=train_config["sampling_probability"],
        decay_steps=train_config["sampling_decay_steps"],
    )


def build_encoder(model_config, source_vocab_size):
    import layers

    if model_config["encoder_type"] == "transformer":
        return layers.SelfAttentionEncoder(
            source_vocab_size,
            model_config["embedding_dim"],
            num_layers=model_config["encoder_layers"],
            num_heads=model_config["encoder_heads"],
            ffn_dim=model_config["encoder_ffn_dim"],
            dropout=model_config["dropout"],
            name="encoder",
        )
    if model_config["encoder_type"] == "convolutional":
        return layers.ConvolutionalEncoder(
            source_vocab_size,
            model_config["embedding_dim"],
            num_layers=model_config["encoder_layers"],
            kernel_size=model_config["encoder_kernel_size"],
            dropout=model_config["dropout"],
            name="encoder",
        )
    return layers.RecurrentEncoder(
        source_vocab_size,
        model_config["embedding_dim"],
        model_config["encoder_units"],
        num_layers=model_config["encoder_layers"],
        cell_type=model_config["cell_type"],
        bidirectional=model_config["bidirectional"],
        merge_mode=model_config["merge_mode"],
        dropout=model_config["dropout"],
        output_dropout=model_config["encoder_output_dropout"],
        residual=model_config["residual"],
        reverse_source=model_config["reverse_source"],
        name="encoder",
    )


def build(properties, source_vocab_size, target_vocab_size, for_training, train=None):
    import layers
    from pipeline.model_types.training_twins import TrainingRecurrentSeq2Seq

    encoder = build_encoder(properties, source_vocab_size)
    decoder = layers.AttentionDecoder(
        target_vocab_size,
        properties["embedding_dim"],
        properties["decoder_units"],
        num_layers=properties["decoder_layers"],
        cell_type=properties["cell_type"],
        attention=build_attention(properties),
        input_feeding=properties["input_feeding"],
        attention_vector_size=properties["attention_vector_size"],
        dropout=properties["dropout"],
        residual=properties["residual"],
        name="decoder",
    )
    model_class = TrainingRecurrentSeq2Seq if for_training else layers.RecurrentSeq2Seq
    return model_class(
        encoder,
        decoder,
        bridge=properties["bridge"],
        label_smoothing=train["label_smoothing"] if train else 0.0,
        scheduled_sampling=sampling_schedule(train) if train else None,
        share_embeddings=properties["share_embeddings"],
        name="seq2seq",
    )


RECURRENT = ModelType(
    name="rnn",
    keys=KEYS,
    check=check,
    build=build,
    attends=lambda properties: properties["attention"] != "none",
    unfit_formats={"ctranslate2": "CTranslate2 has no recurrent encoder-decoder"},
    bfloat16_without_amx=True,
)
