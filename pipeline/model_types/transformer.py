"""Transformers (`model.type: transformer`; Vaswani et al., 2017)."""

from pipeline.core.errors import UserError
from pipeline.core.fields import Field, positive_int, rate
from pipeline.model_types.model_type import ModelType

KEYS = {
    "model_dim": positive_int(512),
    "num_heads": positive_int(8),
    "ffn_dim": positive_int(2048),  # the feed-forward networks' hidden size
    "positions": Field(str, "sinusoidal", choices=("sinusoidal", "learned")),
    "max_positions": positive_int(512),  # learned positions only
    "tie_embeddings": Field(bool, True),  # output projection = target embedding^T
    "normalize_first": Field(bool, True),  # pre-norm layers
    # The rates on the self-attention weights and on the decoder's feed-forward hidden
    # activations (null: dropout's); fairseq's defaults are 0.
    "attention_dropout": rate(None, nullable=True),
    "ffn_dropout": rate(None, nullable=True),
}


def check(config, where):
    model = config["model"]
    if model["model_dim"] % model["num_heads"]:
        raise UserError(
            f"{where}: model.model_dim ({model['model_dim']}) must be divisible by "
            f"model.num_heads ({model['num_heads']})"
        )
    if config["train"]["sampling_schedule"] != "none":
        raise UserError(
            f"{where}: train.sampling_schedule needs a recurrent model (model.type: rnn)"
        )
    if model["positions"] == "learned":
        longest = max(
            config["data"]["max_source_length"],
            config["data"]["max_target_length"] + 1,
            config["decode"]["max_source_length"],
            config["decode"]["max_length_cap"],
        )
        if model["max_positions"] < longest:
            raise UserError(
                f"{where}: model.max_positions ({model['max_positions']}) must cover the "
                f"longest sequence the model sees ({longest}: the data and decode length limits)"
            )


def build(config, source_vocab_size, target_vocab_size, for_training):
    import layers
    from pipeline.model_types.training_twins import TrainingTransformer

    model_config = config["model"]
    model_class = TrainingTransformer if for_training else layers.Transformer
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
        name="transformer",
    )


TRANSFORMER = ModelType(
    name="transformer",
    keys=KEYS,
    check=check,
    build=build,
    attends=lambda model_config: True,
)
