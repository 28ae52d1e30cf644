"""The model types, one module each (`model.type` selects one): its `model` keys with their
meanings and checks, its builder (and training twin), the export formats that cannot hold it.
A new type is a new module here and its entry in `MODEL_TYPES`; `builder.build_model` builds
any. No TensorFlow is imported here: the configuration reads these declarations."""

from pipeline.core.fields import Field
from pipeline.model_types.model_type import COMMON_KEYS, ModelType
from pipeline.model_types.recurrent import RECURRENT
from pipeline.model_types.transformer import TRANSFORMER

MODEL_TYPES = {model_type.name: model_type for model_type in (RECURRENT, TRANSFORMER)}
DEFAULT_MODEL_TYPE = RECURRENT.name
TYPE_MEANING = "the architecture, which decides the other model keys: rnn (recurrent), transformer"

__all__ = ["COMMON_KEYS", "DEFAULT_MODEL_TYPE", "MODEL_TYPES", "ModelType", "model_keys"]


def model_keys(name):
    """{key: Field} of the `model` section of a model of type `name`, `type` included."""
    return {"type": Field(str, name, TYPE_MEANING, choices=tuple(MODEL_TYPES)), **COMMON_KEYS,
            **MODEL_TYPES[name].keys}  # fmt: skip
