"""What a model type declares: its keys of the config's `model` section, their checks, its
builder and the export formats that cannot hold it."""

import dataclasses
from collections.abc import Callable

from pipeline.core.fields import Field, positive_int, rate

# The `model` keys of every type, besides `type` itself.
COMMON_KEYS = {
    "encoder_layers": positive_int(1, "stacked encoder layers"),
    "decoder_layers": positive_int(1, "stacked decoder layers"),
    "dropout": rate(0.2, "dropout rate: rnn on layer inputs, encoder outputs and readout; "
                    "transformer on embeddings and sublayer outputs"),
    "share_embeddings": Field(bool, False, "one embedding matrix for both sides (a Transformer's "
                              "tied output projection too); needs data.shared_vocabulary"),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModelType:
    name: str  # the value of model.type
    keys: dict  # its own model keys: {name: Field}
    # (config, where) -> None: refuses, with a `UserError`, settings that cannot go together.
    check: Callable
    # (config, source_vocab_size, target_vocab_size, for_training) -> the unbuilt model; with
    # `for_training`, its twin that trains under any `tf.distribute` strategy.
    build: Callable
    # model config -> whether its decoder attends to the source (attention images need it).
    attends: Callable
    # {export format: why it cannot hold this type}, of `pipeline.config.EXPORT_FORMATS`.
    unfit_formats: dict = dataclasses.field(default_factory=dict)
    # Whether mixed bfloat16 trains it faster than float32 on a CPU with AVX512-BF16 and no
    # AMX, as measured (`train.precision: auto` chooses it there if so).
    bfloat16_without_amx: bool = False
