"""The packages of the wheel: the code, plus the recipes (configs/) and the bundled corpus
(data/multi30k/) as package data under `seq2seq_tf/`, laid out as in a checkout so that the
recipes' `../data/...` paths resolve (`pipeline.config.RECIPES`). Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

BUNDLED = {"seq2seq_tf.configs": "configs", "seq2seq_tf.data.multi30k": "data/multi30k"}

setup(
    packages=find_packages(include=["layers*", "pipeline*", "export*"]) + list(BUNDLED),
    package_dir=BUNDLED,
    package_data={
        "export": ["tf_serving_ops.txt"],
        "seq2seq_tf.configs": ["*.yaml"],
        "seq2seq_tf.data.multi30k": ["*.gz", "README.md"],
    },
)
