"""`graph_function`: `tf.function` without AutoGraph, for the toolkit's own graphs."""

import functools

import tensorflow as tf

# The search, scoring and serving graphs write their loops and branches as tf.while_loop,
# tf.cond and tf.where already: AutoGraph would re-parse their source at each process's first
# trace (seconds of every command) and change nothing. A Python `if` on a tensor raises when
# traced instead of becoming a branch silently.
graph_function = functools.partial(tf.function, autograph=False)
