"""What the tests of imported checkpoints (`test_pretrained.py`, `test_pretrained_m2m.py`)
share: each fixture family's cases as transformers recorded them, the imports, the first
hypotheses of a search, and the mapping between a checkpoint's ids and ours."""

import json
import re

import numpy as np
import pytest

from pipeline.import_model import import_checkpoint
from pipeline.pretrained import vocabulary

LOGIT_TOLERANCE = 1e-4  # ours against transformers' logits


def expected_case(fixtures, name):
    """What transformers gave for the fixture `name` of the family under `fixtures`."""
    return json.loads((fixtures / name / "expected.json").read_text(encoding="utf-8"))


def import_fixtures(tmp_path_factory, fixtures, names):
    """{fixture name: its work directory}, each imported once, in blocks of a few rows so that
    the fixtures' embedding tables span many, as a real checkpoint's do."""
    root = tmp_path_factory.mktemp("imported")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vocabulary, "BLOCK_ROWS", 37)
        for name in names:
            import_checkpoint(fixtures / name, root / name, log=lambda _: None)
    return {name: root / name for name in names}


def first_hypotheses(ids, lengths):
    """Each row's first hypothesis, </s> included, as a list."""
    return [
        row[0, : length[0]].tolist() for row, length in zip(np.asarray(ids), np.asarray(lengths))
    ]


class IdMap:
    """A pretrained checkpoint's ids of a work directory's ids and back, from the pieces alone
    (an independent reading of the convention `pipeline.pretrained.vocabulary` writes): the
    specials by position, a row no token owns by its `<rowN>` name, a control piece
    `piece@row` by its piece, any other piece by its name, with or without its word-start mark.
    `table`: the checkpoint's {token: id}; `config`: its config.json."""

    ROW_PIECE = re.compile(r"<row(\d+)>")

    def __init__(self, tokenizer, table, config):
        processor = tokenizer.processor
        start = config.get("decoder_start_token_id", config["pad_token_id"])
        specials = {1: table["<unk>"], 2: start, 3: config["eos_token_id"]}
        self.to_checkpoint = {}
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if i in specials:
                self.to_checkpoint[i] = specials[i]
            elif i >= 4 and (row := self.ROW_PIECE.fullmatch(piece)):
                self.to_checkpoint[i] = int(row[1])
            elif i >= 4:
                name = piece.split("@")[0] if "@" in piece else piece.lstrip("\u2581")
                found = table.get(piece, table.get(name))
                self.to_checkpoint[i] = table["<unk>"] if found is None else found
        self.to_ours = {}
        for ours, theirs in sorted(self.to_checkpoint.items(), reverse=True):
            self.to_ours[theirs] = ours  # the lowest of our ids for a checkpoint id

    def checkpoint(self, ids):
        return [self.to_checkpoint[i] for i in ids]

    def ours(self, ids):
        return [self.to_ours[i] for i in ids]

    def output_columns(self, suppressed):
        """(our ids, the checkpoint's ids) of the logits a model may output: every id but the
        `suppressed` ones, which cover no checkpoint id but its decoder start (Marian's
        <pad>) when that is not its </s>."""
        pairs = sorted((ours, theirs) for ours, theirs in self.to_checkpoint.items()
                       if ours not in set(suppressed))  # fmt: skip
        covered = {theirs for _, theirs in pairs}
        assert set(self.to_ours) - covered <= {self.to_checkpoint[2]} - {self.to_checkpoint[3]}
        return [ours for ours, _ in pairs], [theirs for _, theirs in pairs]


def indices_by(keys):
    """{key: the indices where it stands in `keys`}, in order of first appearance."""
    groups = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return groups
