"""A pretrained checkpoint's vocabulary in the toolkit's id convention.

A checkpoint's tokenizer segments text with a SentencePiece model and maps each piece to a
row of the embedding through a table of its own (Marian's vocab.json), with special ids of
its own. The toolkit instead takes SentencePiece ids as model ids, with `<pad>` 0, `<unk>` 1,
`<s>` 2 and `</s>` 3 (`layers.special_tokens`), in every runtime. So an import writes, for
each side, a SentencePiece model whose piece ids are the toolkit's ids, and reorders the
embedding rows to match:

- ids 0-3 are the toolkit's special tokens: `<pad>` a new row (masked, never output), `<unk>`
  and `</s>` the checkpoint's, `<s>` the row the checkpoint starts decoding from;
- then every other token of the checkpoint's table, in its order;
- then each piece a side's SentencePiece model can produce that the table lacks, which the
  checkpoint's tokenizer maps to `<unk>`: its row is `<unk>`'s, so the model sees what the
  checkpoint sees.

A table token that a side's model cannot produce (the other side's pieces, language tags) is
an unused piece of that side's model: never produced by segmentation, still decoded. Pieces
keep their scores and the normaliser is the checkpoint's, so segmentation is unchanged: the
Viterbi search over the pieces does not depend on their order. No TensorFlow here.
"""

import dataclasses

import numpy as np
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from layers.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

Piece = model_pb2.ModelProto.SentencePiece
SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
SPECIAL_TYPES = {PAD_ID: Piece.CONTROL, UNK_ID: Piece.UNKNOWN, BOS_ID: Piece.CONTROL,
                 EOS_ID: Piece.CONTROL}  # fmt: skip
NEW_ROW = -1  # an id whose embedding row is zeros (the toolkit's <pad>)
BLOCK_ROWS = 8192  # an embedding table is reordered and assigned this many ids at a time
PRODUCIBLE = (Piece.NORMAL, Piece.USER_DEFINED)


@dataclasses.dataclass
class IdSpace:
    """The toolkit's ids of one embedding table: `pieces[i]` is id i's piece and `rows[i]` the
    checkpoint row it takes (`NEW_ROW`: zeros). `suppressed` are the ids a decoder never
    outputs: the new `<pad>`, `<s>` (the checkpoint's start row) and the `<unk>` copies.
    `control`: pieces that decode to nothing (the checkpoint's own special tokens, renamed
    where the toolkit's take their names, and rows no token owns)."""

    pieces: list
    rows: np.ndarray
    suppressed: list
    control: frozenset = frozenset()

    @property
    def size(self):
        return len(self.pieces)

    def gather(self, table):
        """`table` (`[checkpoint rows, ...]`) reordered to these ids; zeros for new rows."""
        return np.concatenate([block for _, block in self.blocks(table.__getitem__)])

    def blocks(self, read_rows):
        """(first id, rows of the reordered table) for each block of `BLOCK_ROWS` ids, read
        through `read_rows(checkpoint rows)`: a large table is never whole twice."""
        for start in range(0, self.size, BLOCK_ROWS):
            rows = self.rows[start : start + BLOCK_ROWS]
            block = read_rows(np.where(rows == NEW_ROW, 0, rows))
            block[rows == NEW_ROW] = 0
            yield start, block


def id_space(table, unk, eos, start, producible=(), table_rows=None):
    """The `IdSpace` of a checkpoint's `table` ({piece: row}) with its `<unk>`, `</s>` and
    start rows; `producible`: the pieces the sides' SentencePiece models can produce, in
    their order (those missing from `table` are appended as `<unk>` copies). `table_rows`:
    the embedding's rows, where some have no token (each then gets a control piece, so that
    the softmax still counts it, as the checkpoint's does)."""
    owned = {row: piece for piece, row in table.items()}
    control = {f"<row{row}>" for row in range(table_rows or 0) if row not in owned}
    owned.update({row: f"<row{row}>" for row in range(table_rows or 0) if row not in owned})
    specials = {PAD_ID: NEW_ROW, UNK_ID: unk, BOS_ID: start, EOS_ID: eos}
    pieces = [SPECIAL_PIECES[i] for i in range(len(SPECIAL_PIECES))]
    rows = [specials[i] for i in range(len(SPECIAL_PIECES))]
    taken = set(specials.values())
    for row, piece in sorted(owned.items()):
        if row in taken:
            continue
        if piece in SPECIAL_PIECES.values():  # the checkpoint's own <s> or <pad>
            piece = f"{piece}@{row}"
            control.add(piece)
        pieces.append(piece)
        rows.append(row)
    known = set(pieces) | set(table)
    copies = [piece for piece in dict.fromkeys(producible) if piece not in known]
    suppressed = [PAD_ID, BOS_ID, *range(len(pieces), len(pieces) + len(copies))]
    return IdSpace(pieces + copies, np.array(rows + [unk] * len(copies)), suppressed,
                   frozenset(control))  # fmt: skip


def side_model(space, spm_proto, user_defined=()):
    """A serialised SentencePiece model whose piece i is `space.pieces[i]`, with the
    normaliser and the pieces' scores of `spm_proto` (the side's own model, serialised).
    Pieces that model cannot produce are unused; `user_defined` ({piece: spelling}) makes
    pieces such as language tags whole symbols, spelled as given."""
    own = model_pb2.ModelProto()
    own.ParseFromString(spm_proto)
    scores = {p.piece: (p.score, p.type) for p in own.pieces if p.type in PRODUCIBLE}
    # The checkpoint's tokenizer looks a span of characters its model does not know up by
    # its text: a table piece made of such characters alone is that span's id. Scored just
    # above an unknown span (SentencePiece's penalty is 10 below the lowest score), it is
    # segmented where the span was.
    known = {character for piece in scores for character in piece}
    lowest = min((score for score, _ in scores.values()), default=0.0)
    for piece in space.pieces[len(SPECIAL_PIECES) :]:
        if piece not in scores and "\u2581" not in piece and not known.intersection(piece):
            scores[piece] = (lowest - 5.0, Piece.NORMAL)
    rewritten = model_pb2.ModelProto()
    rewritten.CopyFrom(own)
    del rewritten.pieces[:]
    for index, piece in enumerate(space.pieces):
        entry = rewritten.pieces.add()
        if index in SPECIAL_PIECES:
            entry.piece, entry.type, entry.score = SPECIAL_PIECES[index], SPECIAL_TYPES[index], 0
        elif piece in space.control:
            entry.piece, entry.type, entry.score = piece, Piece.CONTROL, 0
        elif piece in user_defined:
            entry.piece, entry.type, entry.score = user_defined[piece], Piece.USER_DEFINED, 0
        elif piece in scores:
            entry.piece = piece
            entry.score, entry.type = scores[piece]
        else:
            entry.piece, entry.type, entry.score = piece, Piece.UNUSED, 0
    spec = rewritten.trainer_spec
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    spec.pad_piece, spec.unk_piece = SPECIAL_PIECES[PAD_ID], SPECIAL_PIECES[UNK_ID]
    spec.bos_piece, spec.eos_piece = SPECIAL_PIECES[BOS_ID], SPECIAL_PIECES[EOS_ID]
    spec.vocab_size = space.size
    return rewritten.SerializeToString()


def all_pieces(spm_proto):
    """Every piece of a SentencePiece model (serialised), in its order."""
    model = model_pb2.ModelProto()
    model.ParseFromString(spm_proto)
    return [p.piece for p in model.pieces]


def producible_pieces(spm_proto):
    """The pieces a SentencePiece model (serialised) can produce, in its order."""
    model = model_pb2.ModelProto()
    model.ParseFromString(spm_proto)
    return [p.piece for p in model.pieces if p.type in PRODUCIBLE]
