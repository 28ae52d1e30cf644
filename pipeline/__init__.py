"""The training and translation pipeline, by concern, each sub-package importing only those
before it (`tests/test_structure.py`):

- `core`: errors, atomic writes, library output, configuration fields;
- `data`: corpora, SentencePiece tokenizers, `tf.data` batches;
- `model_types`: each model type's keys, checks and builder, and the training twins;
- `decoding`: the search options, the searches, translation, scoring, evaluation;
- `training`: the training run, its callbacks, state, checkpoints, optimizers, schedules and
  `tf.distribute` strategies.

At the top: the configuration (`config`), the work directory (`workdir`) and the commands,
`python -m pipeline.train`, `.translate`, `.evaluate`, `.score` and `.average`.
"""
