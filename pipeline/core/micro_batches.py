"""Gradient accumulation's unit of data: the N micro-batches of one update, as one element.

A training step (one optimizer update) takes one element of the training stream. With
accumulation, that element holds N length-bucketed batches of different shapes, stacked by
`group` (each padded to the largest) and recovered exactly by `micro_batch`: a batch is padded
to its longest example only, every example has a source and ends in </s>, so the non-padding
extent of each part is that batch's own shape.

A group: `({"source_ids": [N, rows, src_len], "target_input_ids": [N, rows, tgt_len]},
target_output_ids [N, rows, tgt_len])`, int32, padded with `PAD_ID`.
"""

import tensorflow as tf

from layers.special_tokens import PAD_ID


def group(batches, count):
    """A `tf.data` stream of `(inputs, labels)` batches -> elements of `count` of them."""
    return batches.padded_batch(count, padding_values=PAD_ID)


def micro_batch(grouped, index):
    """The `index`-th batch of a group, with the shape it had before `group`."""
    inputs, labels = grouped
    source, target_input, target_output = (
        inputs["source_ids"][index], inputs["target_input_ids"][index], labels[index],
    )  # fmt: skip
    source_lengths = tf.reduce_sum(tf.cast(source != PAD_ID, tf.int32), axis=1)
    target_lengths = tf.reduce_sum(tf.cast(target_output != PAD_ID, tf.int32), axis=1)
    rows = tf.reduce_sum(tf.cast(source_lengths > 0, tf.int32))
    source_length, target_length = tf.reduce_max(source_lengths), tf.reduce_max(target_lengths)
    return (
        {"source_ids": source[:rows, :source_length],
         "target_input_ids": target_input[:rows, :target_length]},
        target_output[:rows, :target_length],
    )  # fmt: skip


def target_tokens(grouped):
    """The group's non-padding target tokens (float32): what a token-normalised loss divides by."""
    return tf.reduce_sum(tf.cast(grouped[1] != PAD_ID, tf.float32))


def sentences(grouped):
    """The group's sentence pairs (float32)."""
    return tf.reduce_sum(tf.cast(grouped[0]["source_ids"][:, :, 0] != PAD_ID, tf.float32))
