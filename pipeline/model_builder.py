"""The model described by the `model` section of a configuration."""

import contextlib

import keras

import layers
from pipeline.distributed_training import TRAINING_TWINS
from pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID


def build_attention(model_config):
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
    if train_config["sampling_schedule"] == "none":
        return None
    return layers.SamplingSchedule(
        train_config["sampling_schedule"],
        probability=train_config["sampling_probability"],
        decay_steps=train_config["sampling_decay_steps"],
    )


@contextlib.contextmanager
def dtype_policy(name):
    """Keras' global dtype policy set to `name` while the block runs, then restored.

    Each layer takes the global policy when it is created, so a model built in this block
    keeps `name` and no model built outside it is affected.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(
    config, source_vocab_size, target_vocab_size, precision="float32", for_training=False
):
    """The model of `config["model"]["type"]`, built (its weights created).

    `precision` is its dtype policy (`pipeline.config.PRECISIONS`): training passes
    `train.precision`; translation and export keep the float32 default. The weights are
    float32 under every policy, so they move between the two with `set_weights`.
    `for_training` builds the model's twin that trains under any `tf.distribute` strategy
    (`pipeline.distributed_training`), with the same weights.
    """
    with dtype_policy(precision):
        if config["model"]["type"] == "transformer":
            model_class = layers.Transformer
            build = build_transformer
        else:
            model_class = layers.RecurrentSeq2Seq
            build = build_recurrent
        if for_training:
            model_class = TRAINING_TWINS[model_class]
        model = build(config, source_vocab_size, target_vocab_size, model_class)
        model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    return model


def build_transformer(config, source_vocab_size, target_vocab_size, model_class):
    model_config = config["model"]
    return model_class(
        source_vocab_size,
        target_vocab_size,
        model_dim=model_config["model_dim"],
        num_heads=model_config["num_heads"],
        intermediate_dim=model_config["ffn_dim"],
        encoder_layers=model_config["encoder_layers"],
        decoder_layers=model_config["decoder_layers"],
        dropout=model_config["dropout"],
        attention_dropout=model_config["attention_dropout"],
        ffn_dropout=model_config["ffn_dropout"],
        positions=model_config["positions"],
        max_positions=model_config["max_positions"],
        tie_embeddings=model_config["tie_embeddings"],
        normalize_first=model_config["normalize_first"],
        share_embeddings=model_config["share_embeddings"],
        label_smoothing=config["train"]["label_smoothing"],
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        name="transformer",
    )


def build_recurrent(config, source_vocab_size, target_vocab_size, model_class):
    model_config = config["model"]
    encoder = layers.RecurrentEncoder(
        source_vocab_size,
        model_config["embedding_dim"],
        model_config["encoder_units"],
        num_layers=model_config["encoder_layers"],
        cell_type=model_config["cell_type"],
        bidirectional=model_config["bidirectional"],
        merge_mode=model_config["merge_mode"],
        dropout=model_config["dropout"],
        residual=model_config["residual"],
        reverse_source=model_config["reverse_source"],
        pad_id=PAD_ID,
        name="encoder",
    )
    decoder = layers.AttentionDecoder(
        target_vocab_size,
        model_config["embedding_dim"],
        model_config["decoder_units"],
        num_layers=model_config["decoder_layers"],
        cell_type=model_config["cell_type"],
        attention=build_attention(model_config),
        input_feeding=model_config["input_feeding"],
        attention_vector_size=model_config["attention_vector_size"],
        dropout=model_config["dropout"],
        residual=model_config["residual"],
        name="decoder",
    )
    return model_class(
        encoder,
        decoder,
        bridge=model_config["bridge"],
        label_smoothing=config["train"]["label_smoothing"],
        scheduled_sampling=sampling_schedule(config["train"]),
        share_embeddings=model_config["share_embeddings"],
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        name="seq2seq",
    )
