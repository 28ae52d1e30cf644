"""What a model type declares: its properties (the config's `model` keys, and those another
section states), their checks, its builder and the export formats that cannot hold it.

A property is declared once, here in its type's module: its name is the YAML key, the layer's
constructor argument and its `get_config` key, and model.json's; its `Field` gives the type,
default, range and meaning that the config's check and docs/configuration.md use. The builder
passes `ModelType.properties(config)` to the layer by name, so a new property is its `Field`
and the layer's code that uses it (docs/architecture.md shows such a change)."""

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
class DerivedProperty:
    """A model property that another section of the configuration already states (so that
    no fact is written twice): not a `model` key."""

    meaning: str
    value: Callable  # config -> the property's value


@dataclasses.dataclass(frozen=True)
class ModelType:
    name: str  # the value of model.type
    keys: dict  # its own model keys: {name: Field}
    # (config, where) -> None: refuses, with a `UserError`, settings that cannot go together.
    check: Callable
    # (properties, source_vocab_size, target_vocab_size, for_training, train) -> the unbuilt
    # model of `properties` (`ModelType.properties`); `train`: the config's `train` section
    # (label smoothing, scheduled sampling), None where the model is not trained. With
    # `for_training`, its twin that trains under any `tf.distribute` strategy.
    build: Callable
    # model properties -> whether its decoder attends to the source (attention images need it).
    attends: Callable
    # {name: DerivedProperty}: its properties that are not `model` keys.
    derived: dict = dataclasses.field(default_factory=dict)
    # {export format: why it cannot hold this type}, of `pipeline.config.EXPORT_FORMATS`.
    unfit_formats: dict = dataclasses.field(default_factory=dict)
    # Whether mixed bfloat16 trains it faster than float32 on a CPU with AVX512-BF16 and no
    # AMX, as measured (`train.precision: auto` chooses it there if so).
    bfloat16_without_amx: bool = False

    def properties(self, config):
        """{name: value} of every property of `config`'s model: what the builder passes and
        model.json's `description.properties` holds."""
        keys = {key: config["model"][key] for key in (*COMMON_KEYS, *self.keys)}
        return {**keys, **{name: p.value(config) for name, p in self.derived.items()}}
