"""Pretrained checkpoints in the Hugging Face layout, imported as work directories: one module
a checkpoint family (its config, weight names and tokenizer, as data), `imported` for what
they share. `python -m pipeline.import_model` is the command."""

from pipeline.pretrained import m2m100, marian, mbart

# model_type (config.json) -> the module converting it.
FAMILIES = {marian.MODEL_TYPE: marian, m2m100.MODEL_TYPE: m2m100, mbart.MODEL_TYPE: mbart}
