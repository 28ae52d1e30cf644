"""How well the trainer's epoch length estimates one pass over the training data.

    python bench/epoch_length.py --config configs/X.yaml --workdir runs/X

With the vocabularies of a trained `--workdir`, prints the steps a pass is estimated to take
from the sample the trainer draws when it reuses vocabularies (`ESTIMATE_SAMPLE` pairs), and
from the one it draws when it builds them (`data.vocab_sample_size`), beside the batches of one
pass over the whole corpus (when the second sample holds it all), tokenised and batched by
length. The trainer's stream needs fewer: it mixes passes, so a length bucket's last, partial
batch fills up with the next pass's pairs rather than ending the pass.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True, help="whose vocabularies to use")
    args = parser.parse_args()
    from pipeline.config import load_config
    from pipeline.data.corpus import ParallelCorpus, scan_training_corpora
    from pipeline.data.dataset import (
        ESTIMATE_SAMPLE,
        batching_options,
        count_batches,
        encode_corpus,
        estimate_steps_per_pass,
        make_dataset,
    )
    from pipeline.data.tokenizer import prepare_tokenizers

    def quiet(message):
        del message

    config = load_config(args.config)
    data, batching = config["data"], batching_options(config)
    tokenizers = prepare_tokenizers(args.workdir, data, None, log=quiet)
    for name, size in (("reused", ESTIMATE_SAMPLE), ("built", data["vocab_sample_size"])):
        corpora, sources, targets = scan_training_corpora(
            data, size, config["train"]["seed"], log=quiet
        )
        steps = estimate_steps_per_pass(corpora, sources, targets, tokenizers, data, batching, 1)
        print(f"estimated, vocabularies {name} ({len(sources):,} pairs sampled): {steps} steps")
    if len(sources) < sum(corpus.lines for corpus in corpora):
        print("not counted: the corpus is larger than data.vocab_sample_size")
        return
    decoded = [[line.decode() for line in side] for side in (sources, targets)]
    everything = ParallelCorpus(*decoded, "the training corpus")
    encoded = encode_corpus(everything, *tokenizers, data, "train", log=quiet)
    print(f"one pass in corpus order, counted: {count_batches(make_dataset(encoded, **batching))}")


if __name__ == "__main__":
    main()
