"""A training run: its phases, callbacks, persisted state, checkpoints, optimizers, learning
rate schedules and `tf.distribute` strategies."""
