"""A model property is one declaration (`pipeline.model_types`): every one round-trips from
config.yaml through the built model and its `get_config` to model.json's description, and a
model rebuilt from model.json alone is the same model."""

import json
import re
import types

import pytest

from export.exporter import model_description
from pipeline.config import PROJECT_ROOT, load_config, save_config
from pipeline.model_types import COMMON_KEYS, MODEL_TYPES
from pipeline.model_types.builder import build_model
from pipeline.workdir import CONFIG_FILE

CONFIGS = PROJECT_ROOT / "configs"
SOURCE_VOCAB, TARGET_VOCAB = 40, 40  # one vocabulary: share_embeddings takes it

# Every Transformer property away from its default (a property added without a value here
# fails the first test), with the settings they need.
TRANSFORMER_PROPERTIES = {
    "encoder_layers": 2, "decoder_layers": 3, "dropout": 0.1, "share_embeddings": True,
    "model_dim": 24, "num_heads": 3, "ffn_dim": 40, "positions": "learned", "max_positions": 64,
    "tie_embeddings": False, "normalize_first": False, "attention_dropout": 0.05,
    "ffn_dropout": 0.15, "activation": "gelu", "decoder_num_heads": 4, "decoder_ffn_dim": 48,
    "scale_embeddings": False, "output_bias": True, "source_eos": True, "suppressed_ids": [4, 5],
    "embedding_norm": True,
}  # fmt: skip
TRANSFORMER_SETTINGS = ["data.shared_vocabulary=true", "decode.max_source_length=40",
                        "data.source_language_tags={de: __de__}",
                        "data.target_language_tokens={en: __en__}"]  # fmt: skip
RNN_PROPERTIES = {
    "encoder_layers": 2, "cell_type": "lstm", "embedding_dim": 12, "encoder_units": 10,
    "decoder_units": 14, "attention": "luong_general", "attention_units": 8, "residual": True,
    "input_feeding": True, "attention_vector_size": 18, "bridge": "zero", "merge_mode": "sum",
}  # fmt: skip
CASES = {
    "transformer": ("smoke_transformer.yaml", TRANSFORMER_PROPERTIES, TRANSFORMER_SETTINGS),
    "rnn": ("smoke.yaml", RNN_PROPERTIES, []),
}


def saved_config(tmp_path, name):
    """A work directory's config.yaml with `name`'s properties set, and it as loaded back."""
    recipe, properties, settings = CASES[name]
    overrides = [f"model.{key}={json.dumps(value)}" for key, value in properties.items()]
    config = load_config(CONFIGS / recipe, overrides + settings + ["train.label_smoothing=0"])
    save_config(config, tmp_path / CONFIG_FILE)
    return load_config(tmp_path / CONFIG_FILE, saved=True)


def unnumbered(layer_config):
    """A layer configuration as JSON, the numbers Keras appends to unnamed layers' names cut."""
    return re.sub(r'("name": "[a-z_]+?)(_\d+)?"', r'\1"', json.dumps(layer_config, sort_keys=True))


def test_every_transformer_property_is_tried_away_from_its_default():
    transformer = MODEL_TYPES["transformer"]
    assert set(TRANSFORMER_PROPERTIES) == set(COMMON_KEYS) | set(transformer.keys)
    for key, value in TRANSFORMER_PROPERTIES.items():
        field = COMMON_KEYS.get(key) or transformer.keys[key]
        assert value != field.default, key


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_property_round_trips_through_the_model_and_model_json(tmp_path, name):
    model_type = MODEL_TYPES[name]
    config = saved_config(tmp_path, name)
    properties = model_type.properties(config)
    assert set(properties) == set(COMMON_KEYS) | set(model_type.keys) | set(model_type.derived)
    for key, value in CASES[name][1].items():
        assert properties[key] == value, key
    model = build_model(config, SOURCE_VOCAB, TARGET_VOCAB)
    layer_config = model.get_config()
    if name == "transformer":  # one layer: each property is its argument, by the same name
        assert {key: layer_config[key] for key in properties} == properties
        assert properties["target_language_first"] and model.target_language_first

    description = json.loads(json.dumps(model_description([tmp_path], model)))
    assert description["type"] == name
    assert description["properties"] == properties
    assert description["parameters"] == model.count_params()

    rebuilt = model_type.build(description["properties"], SOURCE_VOCAB, TARGET_VOCAB, False)
    rebuilt.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    assert unnumbered(rebuilt.get_config()) == unnumbered(layer_config)
    assert [w.shape for w in rebuilt.weights] == [w.shape for w in model.weights]


def test_an_ensembles_model_json_describes_each_member(tmp_path):
    workdirs = []
    for name in sorted(CASES):
        (tmp_path / name).mkdir()
        saved_config(tmp_path / name, name)
        workdirs.append(tmp_path / name)
    description = model_description(workdirs, types.SimpleNamespace(members=[]))
    assert description["name"] == "ensemble of rnn, transformer"
    assert [m["type"] for m in description["members"]] == ["rnn", "transformer"]
    assert description["members"][1]["properties"]["ffn_dim"] == 40


def test_a_model_saved_under_the_earlier_argument_names_loads():
    import layers

    model = layers.Transformer(30, 30, model_dim=8, num_heads=2, ffn_dim=16, decoder_ffn_dim=12)
    config = model.get_config()
    earlier = {("intermediate_dim" if k == "ffn_dim" else
                "decoder_intermediate_dim" if k == "decoder_ffn_dim" else k): v
               for k, v in config.items()}  # fmt: skip
    assert layers.Transformer.from_config(earlier).get_config() == config


def test_target_language_first_is_stated_by_the_data_section_only(tmp_path):
    from pipeline.core.errors import UserError

    with pytest.raises(UserError, match="model.target_language_first is no longer a key: "
                                        "data.target_language_tokens states it"):  # fmt: skip
        load_config(CONFIGS / "smoke_transformer.yaml", ["model.target_language_first=true"])
    # A work directory an earlier release saved with the key loads without it.
    config = load_config(CONFIGS / "smoke_transformer.yaml", TRANSFORMER_SETTINGS)
    config["model"]["target_language_first"] = True
    save_config(config, tmp_path / CONFIG_FILE)
    loaded = load_config(tmp_path / CONFIG_FILE, saved=True)
    assert "target_language_first" not in loaded["model"]
    assert MODEL_TYPES["transformer"].properties(loaded)["target_language_first"]


def test_the_schemas_positions_are_those_the_layer_builds():
    from layers.transformer import POSITION_LAYERS
    from pipeline.model_types.transformer import POSITIONS

    assert POSITIONS == tuple(POSITION_LAYERS)
