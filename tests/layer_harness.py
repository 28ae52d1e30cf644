"""The checks every layer in `layers/` goes through, in the manner of keras-hub's
`run_layer_test`: serialisation, `.keras` saving, masking, step-by-step equivalence and
gradient flow. A layer configuration is described once, as a `LayerCase`; the test module
runs each check that applies to it (`CHECKS`).
"""

import dataclasses
import json
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

# Each case's forward, by case name: what a reloaded `HarnessModel` calls its layer with.
_FORWARDS = {}


@dataclasses.dataclass(frozen=True)
class Masking:
    """What a layer's padding is and what must not see it.

    perturb: (inputs, rng) -> the inputs with only their padding changed (noise in masked
        memory, other tokens at padded target positions, extra padding columns, ...).
    invariant: (inputs, outputs) -> a list of arrays: the outputs at real positions, which the
        perturbation must leave unchanged. `inputs` are always the unperturbed ones.
    weights: (outputs) -> attention weights `[batch, ..., src_len]` (or None), which must be
        0 at padded source positions and sum to 1 over the real ones.
    source_mask: (inputs) -> boolean `[batch, src_len]`, True at real source positions.
    """

    perturb: Callable
    invariant: Callable
    weights: Callable = lambda outputs: None
    source_mask: Callable = lambda inputs: None


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One layer configuration and how to feed it.

    name: the test id; also the key under which a reloaded `HarnessModel` finds `forward`.
    make_layer: () -> a new layer (or model) of this configuration.
    make_inputs: (rng) -> a dict of numpy inputs.
    forward: (layer, inputs) -> a nest of output tensors.
    masking: a `Masking`, for the "masking" check.
    steps: (layer, inputs) -> the outputs of `forward` computed one position at a time (a
        rank-2 query per step, or an incremental `step()`), for the "steps" check.
    gradient_inputs: names of the inputs that must receive a gradient; None for every
        floating-point input.
    skip: check name -> why that check does not apply to this layer.
    """

    name: str
    make_layer: Callable
    make_inputs: Callable
    forward: Callable
    masking: Masking | None = None
    steps: Callable | None = None
    gradient_inputs: tuple | None = None
    skip: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.name in _FORWARDS:
            raise ValueError(f"two layer cases are named {self.name!r}")
        _FORWARDS[self.name] = self.forward
        missing = [c for c in ("masking", "steps") if getattr(self, c) is None]
        unexplained = [c for c in missing if c not in self.skip]
        if unexplained:
            raise ValueError(f"case {self.name!r}: give {unexplained} or a reason to skip them")

    def checks(self):
        """The names of the checks that apply to this case."""
        return [name for name in CHECKS if name not in self.skip]


@keras.saving.register_keras_serializable(package="layer_harness")
class HarnessModel(keras.Model):
    """A subclassed model around one layer, to save and load it as part of a `.keras` file:
    it calls the layer as its case's `forward` does."""

    def __init__(self, layer, case_name, **kwargs):
        super().__init__(**kwargs)
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        self.layer = layer
        self.case_name = case_name

    def call(self, inputs):
        return _FORWARDS[self.case_name](self.layer, inputs)

    def get_config(self):
        config = super().get_config()
        layer = keras.saving.serialize_keras_object(self.layer)
        config.update(layer=layer, case_name=self.case_name)
        return config


def _flat_numpy(outputs):
    return [np.asarray(x) for x in tf.nest.flatten(outputs) if x is not None]


def _assert_same_outputs(actual, expected, atol, what):
    actual, expected = _flat_numpy(actual), _flat_numpy(expected)
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, {len(expected)} expected"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"{what}: output {i} has shape {a.shape}, {e.shape} expected"
        np.testing.assert_allclose(a, e, atol=atol, err_msg=f"{what}: output {i}")


def built_layer(case, inputs):
    """A new layer of `case`, built by one forward pass on `inputs`; and that pass's outputs."""
    layer = case.make_layer()
    return layer, case.forward(layer, inputs)


def check_serialization(case, rng, tmp_path):
    """`get_config` -> `from_config` gives the same config, and on the same weights the same
    outputs."""
    inputs = case.make_inputs(rng)
    layer, outputs = built_layer(case, inputs)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer)
    assert clone.get_config() == layer.get_config()
    case.forward(clone, inputs)  # builds the clone's weights
    clone.set_weights(layer.get_weights())
    _assert_same_outputs(case.forward(clone, inputs), outputs, 1e-6, "clone")


def check_save_and_load(case, rng, tmp_path):
    """Saved in a `.keras` file (a model as itself, a layer inside a `HarnessModel`) and loaded
    back, the layer gives the same config and outputs."""
    inputs = case.make_inputs(rng)
    layer, outputs = built_layer(case, inputs)
    is_model = isinstance(layer, keras.Model)
    saved = layer if is_model else HarnessModel(layer, case.name)
    if not is_model:
        _assert_same_outputs(saved(inputs), outputs, 0, "harness model")
    path = tmp_path / f"{case.name}.keras"
    saved.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode stays on
    loaded_layer = loaded if is_model else loaded.layer
    assert type(loaded_layer) is type(layer)
    # JSON is what a .keras file keeps: tuples come back as lists.
    assert json.dumps(loaded_layer.get_config(), sort_keys=True) == json.dumps(
        layer.get_config(), sort_keys=True
    )
    _assert_same_outputs(case.forward(loaded_layer, inputs), outputs, 1e-6, "loaded")


def check_masking(case, rng, tmp_path):
    """Changing only the padding (`Masking.perturb`) changes no output at a real position, and
    attention weights are 0 at padded source positions and sum to 1 over the real ones."""
    masking = case.masking
    inputs = case.make_inputs(rng)
    layer, outputs = built_layer(case, inputs)
    perturbed = masking.perturb(inputs, rng)
    assert any(
        perturbed[k].shape != v.shape or not np.array_equal(perturbed[k], v)
        for k, v in inputs.items()
    ), "the perturbation changed nothing"
    _assert_same_outputs(
        masking.invariant(inputs, case.forward(layer, perturbed)),
        masking.invariant(inputs, outputs),
        1e-5,
        "padding changed",
    )
    weights = masking.weights(outputs)
    if weights is None:
        return
    weights = np.asarray(weights)
    source_mask = masking.source_mask(inputs)
    source_mask = source_mask.reshape(
        source_mask.shape[:1] + (1,) * (weights.ndim - 2) + source_mask.shape[1:]
    )
    padded = np.broadcast_to(~source_mask, weights.shape)
    assert np.all(weights[padded] == 0.0), "attention weight at a padded source position"
    assert np.all(weights >= 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def check_steps(case, rng, tmp_path):
    """The outputs computed one position at a time (`LayerCase.steps`) equal the outputs of
    the whole sequence in one call."""
    inputs = case.make_inputs(rng)
    layer, outputs = built_layer(case, inputs)
    _assert_same_outputs(case.steps(layer, inputs), outputs, 1e-5, "step by step")


def check_gradients(case, rng, tmp_path):
    """A random projection of every output, as a loss, gives every trainable weight and every
    floating-point input (or those in `gradient_inputs`) a finite, non-zero gradient."""
    inputs = {k: tf.constant(v) for k, v in case.make_inputs(rng).items()}
    layer, _ = built_layer(case, inputs)
    names = case.gradient_inputs
    if names is None:
        names = [k for k, v in inputs.items() if v.dtype.is_floating]
    sources = {f"weight {v.path}": v.value for v in layer.trainable_variables}
    sources.update({f"input {name}": inputs[name] for name in names})
    assert sources, "nothing to differentiate"
    with tf.GradientTape() as tape:
        tape.watch(list(sources.values()))
        loss = 0.0
        for i, output in enumerate(tf.nest.flatten(case.forward(layer, inputs))):
            if output is None or not output.dtype.is_floating:
                continue
            projection = tf.random.stateless_normal(tf.shape(output), seed=(i, 7))
            loss += tf.reduce_sum(tf.cast(output, "float32") * projection)
    gradients = tape.gradient(loss, list(sources.values()))
    for what, gradient in zip(sources, gradients):
        assert gradient is not None, f"no gradient reaches {what}"
        gradient = tf.convert_to_tensor(gradient)  # an embedding's gradient comes sparse
        assert bool(tf.reduce_all(tf.math.is_finite(gradient))), f"non-finite gradient at {what}"
        assert float(tf.reduce_max(tf.abs(gradient))) > 0, f"zero gradient at {what}"


CHECKS = {
    "serialization": check_serialization,
    "save_and_load": check_save_and_load,
    "masking": check_masking,
    "steps": check_steps,
    "gradients": check_gradients,
}
