"""Corpora, SentencePiece tokenizers and the `tf.data` batches made of them."""
