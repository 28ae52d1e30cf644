"""The SavedModel's precision (`export.saved_model_precision`): every SavedModel runs in a TF
Serving started without flags (no function marked for XLA compilation), and a bfloat16
SavedModel of the recurrent and the Transformer smoke models holds bfloat16 weights, loads
through TF Serving's session loader with stock TF Serving's ops, and translates as the float32
one does, within a BLEU bound (not id for id)."""

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

import export.__main__ as export_cli
from export.serving_check import read_meta_graph, unsupported_ops
from export.signature import SENTENCES, SERVING_DEFAULT, TRANSLATIONS
from helpers import real_sentences

SENTENCE_COUNT = 150  # of test_2016_flickr
# How far the bfloat16 SavedModel's BLEU (against the references) may be from the float32
# one's on the smoke models, and how close its translations stay to the float32 ones.
BLEU_BOUND = 1.0
MIN_BLEU_AGAINST_FLOAT32 = 50.0


@pytest.fixture(scope="module", params=["exported_workdir", "exported_transformer_workdir"])
def exports(request, tmp_path_factory):
    """(float32 SavedModel, bfloat16 SavedModel) of a smoke model: the one its training
    exported, and one exported with `--saved-model-precision bfloat16` beside it."""
    workdir = request.getfixturevalue(request.param)
    output = tmp_path_factory.mktemp("bfloat16")
    paths = export_cli.main(["--workdir", str(workdir), "--formats", "saved_model",
                             "--saved-model-precision", "bfloat16",
                             "--output", str(output)])  # fmt: skip
    return workdir / "export" / "saved_model" / "translator" / "1", paths["saved_model"]


def session_translations(saved_model, sentences):
    """`serving_default`'s translations through the session loader TF Serving uses."""
    session = tf.compat.v1.Session(graph=tf.Graph())
    with session.graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(saved_model))
    signature = meta.signature_def[SERVING_DEFAULT]
    translations = session.run(
        signature.outputs[TRANSLATIONS].name, {signature.inputs[SENTENCES].name: sentences}
    )
    session.close()
    return [t.decode() for t in translations]


def marked_for_xla(graph_def):
    """The functions and nodes of `graph_def` that ask for XLA compilation."""
    marked = [f.signature.name for f in graph_def.library.function
              if f.attr["_XlaMustCompile"].b]  # fmt: skip
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return marked + [n.name for n in nodes if n.attr["_XlaMustCompile"].b]


def test_no_saved_model_asks_for_xla(exports):
    for saved_model in exports:
        assert marked_for_xla(read_meta_graph(saved_model).graph_def) == []


def test_a_bfloat16_saved_model_holds_bfloat16_weights_in_half_the_space(exports):
    float32, bfloat16 = exports
    dtypes = tf.train.load_checkpoint(str(bfloat16 / "variables" / "variables"))
    floats = {name: dtype for name, dtype in dtypes.get_variable_to_dtype_map().items()
              if dtype.is_floating}  # fmt: skip
    assert floats and set(floats.values()) == {tf.bfloat16}

    def size(saved_model):
        return sum(p.stat().st_size for p in (saved_model / "variables").iterdir())

    assert size(bfloat16) < 0.6 * size(float32)
    assert unsupported_ops(read_meta_graph(bfloat16).graph_def) == []


def test_a_bfloat16_saved_model_translates_as_the_float32_one_within_a_bleu_bound(exports):
    float32, bfloat16 = exports
    sentences = real_sentences(SENTENCE_COUNT)
    references = real_sentences(SENTENCE_COUNT, language="en")
    exact, half = (session_translations(m, np.array(sentences, object)) for m in exports)
    assert all(half), "every sentence gets a translation"
    scores = [sacrebleu.corpus_bleu(t, [references]).score for t in (exact, half)]
    assert abs(scores[0] - scores[1]) <= BLEU_BOUND, scores
    assert sacrebleu.corpus_bleu(half, [exact]).score >= MIN_BLEU_AGAINST_FLOAT32
