"""Transformers (`model.type: transformer`; Vaswani et al., 2017)."""

from pipeline.core.errors import UserError
from pipeline.core.fields import Field, positive_int, rate
from pipeline.model_types.model_type import DerivedProperty, ModelType

ACTIVATIONS = ("relu", "gelu", "silu")  # Keras' names; gelu is the exact (erf) one
# What layers.Transformer's `positions` takes (its POSITION_LAYERS: test_model_properties).
POSITIONS = ("sinusoidal", "learned", "sinusoidal_halves", "sinusoidal_fairseq")

KEYS = {
    "model_dim": positive_int(512, "size of the embeddings and of every layer's output"),
    "num_heads": positive_int(8, "heads of every attention layer (model_dim must divide by it)"),
    "ffn_dim": positive_int(2048, "hidden size of the position-wise feed-forward networks"),
    "positions": Field(str, "sinusoidal", "position encodings: fixed sinusoids, learned "
                       "embeddings, or sinusoids with the sines first (Marian's, fairseq's)",
                       choices=POSITIONS),
    "max_positions": positive_int(512, "positions other than sinusoidal: the longest sequence "
                                  "they cover (at least the data and decode length limits)"),
    "tie_embeddings": Field(bool, True, "the output projection is the transposed target "
                            "embedding"),
    "normalize_first": Field(bool, True, "pre-norm layers (each sublayer's input normalised, "
                             "and each stack's output); false: post-norm"),
    # fairseq's defaults for these two are 0.
    "attention_dropout": rate(None, "dropout rate on the self-attention weights (null: "
                              "model.dropout's)", nullable=True),
    "ffn_dropout": rate(None, "dropout rate on the decoder's feed-forward hidden activations "
                        "(null: model.dropout's)", nullable=True),
    # The keys below describe imported checkpoints (pipeline.import_model) as well as new models.
    "activation": Field(str, "relu", "the feed-forward networks' activation",
                        choices=ACTIVATIONS),
    "decoder_num_heads": positive_int(None, "the decoder's attention heads (null: num_heads)",
                                      nullable=True),
    "decoder_ffn_dim": positive_int(None, "the decoder's feed-forward hidden size (null: "
                                    "ffn_dim)", nullable=True),
    "scale_embeddings": Field(bool, True, "embeddings multiplied by sqrt(model_dim) before the "
                              "positions are added"),
    "output_bias": Field(bool, False, "a learned bias on the output logits"),
    "source_eos": Field(bool, False, "</s> appended to every source, in every runtime"),
    "suppressed_ids": Field(list, [], "target ids never output nor counted in the search's "
                            "softmax (an imported vocabulary's rows that no token owns)"),
    "embedding_norm": Field(bool, False, "a layer normalisation of each side's embeddings, "
                            "positions added, before the first layer (mBART's)"),
}  # fmt: skip


def check(config, where):
    model = config["model"]
    if config["train"]["sampling_schedule"] != "none":
        raise UserError(
            f"{where}: train.sampling_schedule needs a recurrent model (model.type: rnn)"
        )
    for key, heads in (
        ("num_heads", model["num_heads"]),
        ("decoder_num_heads", model["decoder_num_heads"] or 1),
    ):
        if model["model_dim"] % heads:
            raise UserError(f"{where}: model.model_dim ({model['model_dim']}) must be divisible "
                            f"by model.{key} ({heads})")  # fmt: skip
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
               for i in model["suppressed_ids"]):  # fmt: skip
        raise UserError(f"{where}: model.suppressed_ids must be a list of token ids, got "
                        f"{model['suppressed_ids']!r}")  # fmt: skip
    if model["positions"] != "sinusoidal":
        source_eos = int(model["source_eos"])
        longest = max(
            config["data"]["max_source_length"] + source_eos,
            config["data"]["max_target_length"] + 1,
            config["decode"]["max_source_length"] + source_eos,
            config["decode"]["max_length_cap"],
        )
        if model["max_positions"] < longest:
            raise UserError(
                f"{where}: model.max_positions ({model['max_positions']}) must cover the "
                f"longest sequence the model sees ({longest}: the data and decode length limits)"
            )


def build(properties, source_vocab_size, target_vocab_size, for_training, train=None):
    import layers
    from pipeline.model_types.training_twins import TrainingTransformer

    model_class = TrainingTransformer if for_training else layers.Transformer
    smoothing = train["label_smoothing"] if train else 0.0
    return model_class(source_vocab_size, target_vocab_size, **properties,
                       label_smoothing=smoothing, name="transformer")  # fmt: skip


TARGET_LANGUAGE_FIRST = DerivedProperty(
    "the first target token names the target language (data.target_language_tokens): forced by "
    "the request, scored 0, not output",
    lambda config: bool(config["data"]["target_language_tokens"]),
)

TRANSFORMER = ModelType(
    name="transformer",
    keys=KEYS,
    check=check,
    build=build,
    attends=lambda properties: True,
    derived={"target_language_first": TARGET_LANGUAGE_FIRST},
)
