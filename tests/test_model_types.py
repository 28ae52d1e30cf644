"""Model types as plug-ins (`pipeline.model_types`): the `model` section holds the chosen
type's keys only, a key of another type is named, work directories saved with every type's
keys still load, and a new type is one module and one registration."""

import pytest

from pipeline.config import PROJECT_ROOT, defaults, load_config
from pipeline.core.errors import UserError
from pipeline.core.fields import positive_int
from pipeline.model_types import COMMON_KEYS, MODEL_TYPES, ModelType
from pipeline.model_types.builder import build_model

CONFIGS = PROJECT_ROOT / "configs"
OLD_SAVED_CONFIG = PROJECT_ROOT / "tests" / "fixtures" / "config_with_every_model_key.yaml"


@pytest.mark.parametrize("name", sorted(MODEL_TYPES))
def test_the_model_section_holds_its_types_keys_only(name):
    model = defaults(name)["model"]
    assert set(model) == {"type"} | set(COMMON_KEYS) | set(MODEL_TYPES[name].keys)
    assert model["type"] == name


def test_a_key_of_another_model_type_is_named(tmp_path):
    config = tmp_path / "config.yaml"
    text = (CONFIGS / "smoke_transformer.yaml").read_text()
    config.write_text(text.replace("  model_dim: 16\n", "  model_dim: 16\n  cell_type: gru\n"))
    with pytest.raises(UserError, match="model.cell_type is a key of rnn models; this model's "
                                        "model.type is transformer"):  # fmt: skip
        load_config(config)
    with pytest.raises(UserError, match="model.num_heads is a key of transformer models"):
        load_config(CONFIGS / "smoke.yaml", ["model.num_heads=2"])


def test_set_model_type_replaces_the_files_type_and_its_keys():
    config = load_config(CONFIGS / "smoke.yaml", ["model.type=transformer", "model.num_heads=2"])
    assert config["model"]["type"] == "transformer" and "cell_type" not in config["model"]
    assert config["model"]["num_heads"] == 2
    assert config["model"]["dropout"] == 0.0  # the file's common keys stay


def test_a_work_directory_saved_with_every_model_key_still_loads():
    with pytest.raises(UserError, match="model.cell_type is a key of rnn models"):
        load_config(OLD_SAVED_CONFIG)  # as an experiment's file: refused
    config = load_config(OLD_SAVED_CONFIG, saved=True)
    assert set(config["model"]) == set(defaults("transformer")["model"])
    assert config["model"]["model_dim"] == 16 and config["model"]["num_heads"] == 2


def test_export_formats_follow_the_model_type():
    with pytest.raises(UserError, match="ctranslate2 needs model.type: transformer, got rnn"):
        load_config(CONFIGS / "smoke.yaml", ["export.formats=ctranslate2"])
    load_config(CONFIGS / "smoke_transformer.yaml", ["export.formats=ctranslate2"])


def test_a_new_model_type_is_one_registration(monkeypatch):
    """A type declares its keys and checks in its module and registers: the config then
    takes `model.type: <it>` with its keys (and its checks), and nothing else changes."""

    def check(config, where):
        if config["model"]["width"] % 2:
            raise UserError(f"{where}: model.width must be even")

    keys = {"width": positive_int(8, "the toy's width")}
    toy = ModelType("toy", keys, check, build=None, attends=bool)
    monkeypatch.setitem(MODEL_TYPES, "toy", toy)
    config = load_config(CONFIGS / "smoke.yaml", ["model.type=toy", "model.width=4"])
    assert config["model"] == {**defaults("toy")["model"], "width": 4, "dropout": 0.0}
    with pytest.raises(UserError, match="model.width must be even"):
        load_config(CONFIGS / "smoke.yaml", ["model.type=toy", "model.width=3"])
    with pytest.raises(UserError, match="model.width is a key of toy models"):
        load_config(CONFIGS / "smoke.yaml", ["model.width=4"])


@pytest.mark.parametrize("name", sorted(MODEL_TYPES))
def test_each_types_model_implements_the_decoding_contract(name):
    import layers

    config = load_config(CONFIGS / "smoke.yaml", [f"model.type={name}"])
    model = build_model(config, 20, 30)
    assert isinstance(model, layers.EncoderDecoderModel)
    for method in ("encode", "initial_decoder_state", "decode_step"):
        assert getattr(type(model), method) is not getattr(layers.EncoderDecoderModel, method)
    assert (model.source_vocab_size, model.target_vocab_size) == (20, 30)


def test_a_recurrent_models_transformer_encoder_is_configured_and_checked():
    import layers

    settings = ["model.encoder_type=transformer", "model.encoder_heads=4"]
    config = load_config(CONFIGS / "smoke.yaml", settings + ["model.encoder_layers=2"])
    model = build_model(config, 20, 30)
    assert isinstance(model.encoder, layers.SelfAttentionEncoder)
    assert (model.encoder.num_layers, model.encoder.num_heads) == (2, 4)
    assert model.encoder.output_dim == config["model"]["embedding_dim"]
    with pytest.raises(UserError, match="model.embedding_dim \\(16\\) must be divisible by "
                                        "model.encoder_heads \\(3\\)"):  # fmt: skip
        load_config(CONFIGS / "smoke.yaml", ["model.encoder_type=transformer",
                                             "model.encoder_heads=3"])  # fmt: skip
    with pytest.raises(UserError, match="model.reverse_source needs model.encoder_type "
                                        "recurrent"):  # fmt: skip
        load_config(CONFIGS / "smoke.yaml", settings + ["model.reverse_source=true"])


def test_a_recurrent_models_convolutional_encoder_is_configured_and_checked():
    import layers

    settings = ["model.encoder_type=convolutional", "model.encoder_kernel_size=5"]
    config = load_config(CONFIGS / "smoke.yaml", settings + ["model.encoder_layers=3"])
    model = build_model(config, 20, 30)
    assert isinstance(model.encoder, layers.ConvolutionalEncoder)
    assert (model.encoder.num_layers, model.encoder.kernel_size) == (3, 5)
    assert model.encoder.output_dim == config["model"]["embedding_dim"]
    with pytest.raises(UserError, match="model.encoder_kernel_size must be odd .*got 4"):
        load_config(CONFIGS / "smoke.yaml", ["model.encoder_type=convolutional",
                                             "model.encoder_kernel_size=4"])  # fmt: skip
    with pytest.raises(UserError, match="model.reverse_source needs model.encoder_type "
                                        "recurrent \\(a convolutional encoder"):  # fmt: skip
        load_config(CONFIGS / "smoke.yaml", settings + ["model.reverse_source=true"])
