"""`RecordsArguments`: a layer's configuration is every argument its constructor took, by
name, defaults included, and the most derived constructor's where constructors chain."""

import keras

from layers.recorded_arguments import RecordsArguments


class Scaled(RecordsArguments, keras.layers.Layer):
    def __init__(self, factor, offsets=(1, 2), inner=None, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor
        self.inner = keras.layers.Dense(2) if inner is None else inner


class Shifted(Scaled):
    LAYER_ARGUMENTS = ("inner",)

    def __init__(self, shift, factor=3.0, **kwargs):
        super().__init__(factor, **kwargs)
        self.shift = shift


def test_every_argument_is_in_the_configuration_with_its_default():
    config = Scaled(2.0, name="scaled").get_config()
    assert {k: config[k] for k in ("name", "factor", "offsets", "inner")} == {
        "name": "scaled", "factor": 2.0, "offsets": [1, 2], "inner": None,
    }  # fmt: skip
    assert Scaled.from_config(config).get_config() == config


def test_the_most_derived_constructors_arguments_are_kept_and_sublayers_saved_as_they_are():
    layer = Shifted(0.5)
    config = layer.get_config()
    assert config["shift"] == 0.5 and config["factor"] == 3.0 and "offsets" not in config
    # `inner` was not given: it is saved as the sublayer the constructor made.
    assert config["inner"]["class_name"] == "Dense" and config["inner"]["config"]["units"] == 2
    assert dict(layer.recorded_arguments) == {"shift": 0.5, "factor": 3.0}
