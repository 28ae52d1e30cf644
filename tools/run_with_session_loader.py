"""Runs an exported SavedModel's signatures through the TF1 session loader (TF Serving's path).

Prints the outputs as JSON, so that two TensorFlow versions can be compared, e.g. the one that
trained the model and the tensorflow 2.12.1 + tensorflow-text 2.12.1 that TF Serving links:

    /tmp/tf212/bin/python tools/run_with_session_loader.py OUT/saved_model/NAME/1 "Ein Hund."
"""

import json
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops, as TF Serving does)


def run(saved_model_dir, sentences):
    tf.compat.v1.disable_eager_execution()
    results = {"tensorflow": tf.__version__}
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], saved_model_dir)
        for key, feeds in (
            ("serving_default", {"sentences": sentences}),
            ("beam_search", {"source_ids": [[10, 11, 12, 13], [14, 15, 0, 0]], "n_best": 2}),
        ):
            signature = meta_graph.signature_def[key]
            outputs = session.run(
                {name: info.name for name, info in signature.outputs.items()},
                {signature.inputs[name].name: value for name, value in feeds.items()},
            )
            results[key] = {
                name: [v.decode() for v in value] if value.dtype == object else value.tolist()
                for name, value in outputs.items()
                if name != "attention"
            }
    return results


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2:] or ["Ein Hund läuft über eine Wiese."])))
