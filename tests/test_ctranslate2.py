"""The CTranslate2 export of the Transformer: the converted model scores every token as ours
does and its greedy search writes our greedy search's tokens; what it cannot hold is refused."""

import importlib
import shutil
import sys

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

import layers
from export import __main__ as export_cli
from export import exporter
from helpers import real_sentences
from pipeline.config import CTRANSLATE2_QUANTIZATIONS, PROJECT_ROOT, load_config, save_config
from pipeline.core.errors import UserError
from pipeline.data.tokenizer import BOS_ID, EOS_ID, Tokenizer, vocabulary_paths
from pipeline.decoding.search import beam_search, greedy_search
from pipeline.model_types.builder import build_model
from pipeline.workdir import CONFIG_FILE, MODEL_FILE, load_trained

ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed")

from export.ctranslate2_model import transformer_spec  # noqa: E402  (needs ctranslate2)

VOCAB = 40
TOKENS = ["<pad>", "<unk>", "<s>", "</s>", *(f"t{i}" for i in range(4, VOCAB))]
MAX_LENGTH = 20


def random_transformer(**overrides):
    """A tiny Transformer with every weight moved off its initial value, so that biases, gains
    and shifts (zeros and ones at first) are checked too."""
    options = dict(model_dim=16, num_heads=2, ffn_dim=32, encoder_layers=2,
                   decoder_layers=2, dropout=0.0)  # fmt: skip
    model = layers.Transformer(VOCAB, VOCAB, **{**options, **overrides})
    model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    rng = np.random.default_rng(3)
    for variable in model.weights:
        variable.assign(variable + rng.normal(0, 0.2, variable.shape).astype(np.float32))
    return model


def converted(model, directory):
    spec = transformer_spec(model, TOKENS, TOKENS)
    spec.validate()
    spec.optimize()
    spec.save(str(directory))
    return ctranslate2.Translator(str(directory))


def pieces(ids, tokens):
    """Token ids up to </s> (included) or the end, as tokens."""
    ids = list(ids)
    return [tokens[i] for i in ids[: ids.index(EOS_ID) + 1 if EOS_ID in ids else len(ids)]]


def translate_both(model, translator, source_ids, source_tokens, target_tokens, beam_size=1):
    """(ours, CTranslate2's): the best outputs as tokens (</s> included) and their scores
    (sums of log-probabilities: no length penalty), with the same limit and no minimum
    length."""
    if beam_size == 1:
        ids, _, scores, _ = greedy_search(model, source_ids, MAX_LENGTH)
    else:
        ids, _, scores, _ = (x[:, 0] for x in beam_search(model, source_ids, MAX_LENGTH, beam_size))
    ours = [pieces(row, target_tokens) for row in ids.numpy()], scores.numpy()
    results = translator.translate_batch(
        [[source_tokens[i] for i in row if i] for row in source_ids],
        beam_size=beam_size, max_decoding_length=MAX_LENGTH, min_decoding_length=0,
        return_end_token=True, return_scores=True, length_penalty=0,
    )  # fmt: skip
    theirs = [r.hypotheses[0] for r in results], np.array([r.scores[0] for r in results])
    return ours, theirs


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"normalize_first": False},
        {
            "positions": "learned",
            "max_positions": 32,
            "tie_embeddings": False,
            "embedding_norm": True,
        },
        {"share_embeddings": True, "encoder_layers": 1},
    ],
)
def test_converted_model_scores_and_translates_as_ours(tmp_path, overrides):
    model = random_transformer(**overrides)
    translator = converted(model, tmp_path)
    rng = np.random.default_rng(0)
    source = rng.integers(4, VOCAB, size=(6, 9)).astype(np.int32)
    source[1, 5:] = 0
    source[3, 1:] = 0
    target = rng.integers(4, VOCAB, size=(6, 8)).astype(np.int32)
    bos = np.full((6, 1), BOS_ID, np.int32)
    logits = model({"source_ids": source, "target_input_ids": np.concatenate([bos, target], 1)})
    labels = np.concatenate([target, np.full((6, 1), EOS_ID, np.int32)], 1)
    ours = np.take_along_axis(tf.nn.log_softmax(logits).numpy(), labels[..., None], -1)[..., 0]
    scored = translator.score_batch(
        [[TOKENS[i] for i in row if i] for row in source],
        [[TOKENS[i] for i in row] for row in target],
    )
    np.testing.assert_allclose([s.log_probs for s in scored], ours, atol=1e-4)

    (our_tokens, our_scores), (their_tokens, their_scores) = translate_both(
        model, translator, source, TOKENS, TOKENS
    )
    assert their_tokens == our_tokens
    np.testing.assert_allclose(their_scores, our_scores, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def workdir(exported_transformer_workdir):
    return exported_transformer_workdir


@pytest.fixture(scope="module")
def exported(workdir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ctranslate2_out")
    paths = exporter.export_model(workdir, out, ["ctranslate2"])
    return paths["ctranslate2"]


def test_export_writes_the_model_its_vocabularies_and_tokenizers(exported, workdir):
    files = sorted(p.name for p in exported.iterdir())
    assert files == ["config.json", "model.bin", "source.model", "source_vocabulary.json",
                     "target.model", "target_vocabulary.json"]  # fmt: skip
    for path in vocabulary_paths(workdir):
        assert (exported / path.name).read_bytes() == path.read_bytes()
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]


def test_trained_model_translates_real_sentences_as_ours(exported, workdir):
    _, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    sentences = real_sentences(16)
    source_ids = source_tokenizer.tokenize(tf.constant(sentences)).to_tensor(0).numpy()
    # Tokenised as a user would, with the SentencePiece model beside the CTranslate2 model.
    processor = sentencepiece.SentencePieceProcessor(model_file=str(exported / "source.model"))
    source_tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    assert [[source_tokens[i] for i in row if i] for row in source_ids] == processor.encode(
        sentences, out_type=str
    )
    target_tokens = [
        target_tokenizer.processor.id_to_piece(i) for i in range(model.target_vocab_size)
    ]
    translator = ctranslate2.Translator(str(exported))
    for beam_size in (1, 4):
        (our_tokens, our_scores), (their_tokens, their_scores) = translate_both(
            model, translator, source_ids, source_tokens, target_tokens, beam_size
        )
        assert their_tokens == our_tokens
        assert sum(len(t) > 3 for t in our_tokens) > 8  # real, multi-token outputs
        np.testing.assert_allclose(their_scores, our_scores, rtol=1e-4, atol=1e-4)


def test_quantised_export_is_smaller_and_translates(exported, workdir, tmp_path):
    _, model, _, _ = load_trained(workdir)
    int8 = exporter.export_ctranslate2(model, workdir, tmp_path, "int8", log=print)
    # Matrices are int8; the position table and the gains stay float32.
    assert (int8 / "model.bin").stat().st_size < 0.8 * (exported / "model.bin").stat().st_size
    processor = sentencepiece.SentencePieceProcessor(model_file=str(int8 / "source.model"))
    results = ctranslate2.Translator(str(int8)).translate_batch(
        processor.encode(real_sentences(4), out_type=str), beam_size=2
    )
    assert all(r.hypotheses[0] for r in results)
    # Exported again in float32: the directory is replaced whole.
    assert exporter.export_ctranslate2(model, workdir, tmp_path, "none", log=print) == int8
    assert (int8 / "model.bin").read_bytes() == (exported / "model.bin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctranslate2"]


def test_configuration_takes_the_format_and_ctranslate2s_weight_types():
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    assert set(CTRANSLATE2_QUANTIZATIONS) - {"none"} <= set(ACCEPTED_MODEL_TYPES)
    smoke = PROJECT_ROOT / "configs" / "smoke_transformer.yaml"
    config = load_config(smoke, ["export.formats=onnx,ctranslate2",
                                 "export.ctranslate2_quantization=int8_float16"])  # fmt: skip
    assert config["export"]["ctranslate2_quantization"] == "int8_float16"
    with pytest.raises(UserError, match="export.ctranslate2_quantization must be one of"):
        load_config(smoke, ["export.ctranslate2_quantization=int4"])


@pytest.fixture(scope="module")
def recurrent_workdir(workdir, tmp_path_factory):
    """An untrained recurrent model with the smoke vocabularies: all that export reads."""
    recurrent = tmp_path_factory.mktemp("recurrent")
    shutil.copytree(workdir / "vocab", recurrent / "vocab")
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    save_config(config, recurrent / CONFIG_FILE)
    sizes = [Tokenizer(path).vocab_size for path in vocabulary_paths(recurrent)]
    build_model(config, *sizes).save(recurrent / MODEL_FILE)
    return recurrent


def test_a_recurrent_model_is_refused_before_anything_is_written(recurrent_workdir, tmp_path):
    with pytest.raises(UserError, match="CTranslate2 has no recurrent encoder-decoder"):
        exporter.export_model(recurrent_workdir, tmp_path, ["saved_model", "ctranslate2"])
    assert not list(tmp_path.iterdir())
    smoke = PROJECT_ROOT / "configs" / "smoke.yaml"
    with pytest.raises(UserError, match="export.formats: ctranslate2 needs model.type"):
        load_config(smoke, ["export.formats=onnx,ctranslate2"])


def test_the_command_line_names_the_format_and_the_package(recurrent_workdir, workdir, tmp_path,
                                                           monkeypatch, capsys):  # fmt: skip
    argv = ["--workdir", str(recurrent_workdir), "--output", str(tmp_path), "--formats",
            "ctranslate2"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        export_cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CTranslate2 has no recurrent encoder-decoder" in err

    for name in ("ctranslate2", "ctranslate2.specs"):  # as if it were not installed
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "export.ctranslate2_model")
    with pytest.raises(UserError, match="pip install ctranslate2"):
        importlib.import_module("export.ctranslate2_model")
    argv[1] = str(workdir)
    with pytest.raises(SystemExit):
        export_cli.main(argv)
    assert "pip install ctranslate2" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
