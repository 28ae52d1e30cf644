"""StateBridge: dense, copy and zero bridges (serialisation and gradients: test_layer_harness)."""

import numpy as np
import pytest

import layers

SOURCE_STATES = (
    (np.ones((3, 6), "float32"), np.full((3, 6), 2.0, "float32")),
    (np.full((3, 6), 3.0, "float32"), np.full((3, 6), 4.0, "float32")),
)


def test_dense_bridge_maps_any_structure():
    bridge = layers.StateBridge("dense", target_state_sizes=((5,),))
    states = bridge(SOURCE_STATES)
    assert [[tuple(s.shape) for s in layer] for layer in states] == [[(3, 5)]]
    assert bridge.projection.kernel.shape == (24, 5)
    assert np.all(np.abs(np.asarray(states[0][0])) <= 1.0)  # tanh


def test_copy_bridge_passes_states_through():
    bridge = layers.StateBridge("copy", target_state_sizes=((6, 6), (6, 6)))
    states = bridge(SOURCE_STATES)
    for layer, source_layer in zip(states, SOURCE_STATES):
        for s, source in zip(layer, source_layer):
            np.testing.assert_array_equal(s, source)


def test_copy_bridge_refuses_mismatched_structures():
    bridge = layers.StateBridge("copy", target_state_sizes=((6,),))
    with pytest.raises(ValueError, match="same structure"):
        bridge(SOURCE_STATES)


def test_zero_bridge():
    states = layers.StateBridge("zero", target_state_sizes=((4, 4),))(SOURCE_STATES)
    assert all(np.all(np.asarray(s) == 0) and s.shape == (3, 4) for s in states[0])


def test_state_sizes_become_tuples_and_bad_bridges_are_refused():
    """A config read back from JSON gives lists."""
    assert layers.StateBridge("dense", [[5, 5], [5]]).target_state_sizes == ((5, 5), (5,))
    with pytest.raises(ValueError, match="bridge"):
        layers.StateBridge("mlp")
