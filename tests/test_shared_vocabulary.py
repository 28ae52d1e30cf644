"""`data.shared_vocabulary` and `model.share_embeddings`: one vocabulary file, one matrix."""

import json

import numpy as np
import onnxruntime
import pytest
import tensorflow as tf

from helpers import padded_ids, real_sentences, search_onnx
from pipeline import train
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.data.tokenizer import PAD_ID
from pipeline.decoding.search import beam_search, decode_length_limits
from pipeline.workdir import load_trained


@pytest.fixture(scope="module", params=["smoke.yaml", "smoke_transformer.yaml"])
def shared_workdir(tmp_path_factory, request):
    workdir = tmp_path_factory.mktemp("shared")
    config = PROJECT_ROOT / "configs" / request.param
    train.main(["--config", str(config), "--workdir", str(workdir),
                "--set", "data.shared_vocabulary=true", "--set", "model.share_embeddings=true",
                "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
                "--set", "data.test_target=null", "--set", "export.after_training=true",
                "--set", "export.formats=onnx", "--set", "export.onnx_int8=false"])  # fmt: skip
    return workdir


@pytest.mark.slow
def test_a_shared_vocabulary_is_one_file_and_the_embeddings_one_matrix(shared_workdir):
    assert sorted(p.name for p in (shared_workdir / "vocab").iterdir()) == [
        "shared.model", "shared.vocab"
    ]  # fmt: skip
    config, model, source_tokenizer, target_tokenizer = load_trained(shared_workdir)
    assert source_tokenizer.model_proto == target_tokenizer.model_proto
    embeddings = [w for w in model.weights if "embedding" in w.path]
    if config["model"]["type"] == "transformer":
        assert model.source_embedding is model.target_embedding
    else:
        assert model.encoder.embedding is model.decoder.embedding
    assert len(embeddings) == 1
    # Trained on both sides: frequent German and English words alike are pieces of it.
    pieces = {source_tokenizer.processor.id_to_piece(i) for i in range(300)}
    assert {"▁und", "▁mit", "▁the", "▁with"} <= pieces

    onnx_dir = shared_workdir / "export" / "onnx"
    metadata = json.loads((onnx_dir / "model.json").read_text())
    assert metadata["source_vocabulary"] == metadata["target_vocabulary"] == "shared.model"
    assert not (onnx_dir / "source.model").exists()
    session = onnxruntime.InferenceSession(
        str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    source_ids = padded_ids(shared_workdir, real_sentences(5))
    decode = config["decode"]
    limits = decode_length_limits(
        tf.constant(source_ids), PAD_ID, decode["max_length_ratio"],
        decode["max_length_offset"], decode["max_length_cap"],
    )  # fmt: skip
    keras_ids = beam_search(
        model, tf.constant(source_ids), limits, 5, alpha=decode["length_penalty"]
    )[0].numpy()
    np.testing.assert_array_equal(search_onnx(session, source_ids)["ids"], keras_ids)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["model.type=transformer", "model.share_embeddings=true"],
      "model.share_embeddings needs data.shared_vocabulary"),
     (["data.shared_vocabulary=true", "data.target_vocab_size=200"],
      "data.shared_vocabulary needs data.source_vocab_size (300) equal")],
)  # fmt: skip
def test_inconsistent_sharing_settings_are_refused(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)
