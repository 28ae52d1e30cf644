"""The text of a translation as its model's family writes it. SentencePiece decodes a lone
word-boundary piece to a space, so a hypothesis cut at its length limit may end in one; the
tokenizers of some families strip such spaces (MarianTokenizer's and M2M100Tokenizer's
decoding), others keep them (NllbTokenizer's, SentencePiece's own). `data.strip_translation_spaces`
says which; every runtime applies it (the SavedModel graph with `EDGE_SPACES`, the JavaScript
examples in examples/shared/exported-model.mjs). Free of TensorFlow: the ONNX runtime uses it."""

EDGE_SPACES = "^ +| +$"  # the spaces stripped, as a regular expression (RE2 and JavaScript)


def translation_text(decoded, strip_translation_spaces):
    """`decoded` (SentencePiece's decoding of a hypothesis) as a translation: without spaces at
    either end where `strip_translation_spaces` (`data.strip_translation_spaces`)."""
    return decoded.strip(" ") if strip_translation_spaces else decoded
