"""Translation quality: BLEU and chrF with sacreBLEU (with their signatures), and perplexity."""

import sacrebleu


def score_translations(hypotheses, references):
    """BLEU (cased and lowercased) and chrF of `hypotheses` against one reference each."""
    bleu = sacrebleu.metrics.BLEU()
    bleu_lower = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    refs = [references]
    bleu_score = bleu.corpus_score(hypotheses, refs)
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_lowercase": round(bleu_lower.corpus_score(hypotheses, refs).score, 2),
        "chrf": round(chrf.corpus_score(hypotheses, refs).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def score_directions(hypotheses, corpus):
    """{direction: `score_translations`} of each direction a multilingual split holds ({}
    for a bilingual one)."""
    return {
        str(direction): score_translations(hypotheses[start:end], corpus.targets[start:end])
        for direction, start, end in corpus.directions
    }


def direction_table(scores):
    """`score_directions`' figures as a Markdown table, a row a direction."""
    rows = [f"| {direction} | {s['bleu']} | {s['bleu_lowercase']} | {s['chrf']} |"
            for direction, s in scores.items()]  # fmt: skip
    return "\n".join(["| direction | BLEU | BLEU lowercased | chrF |", "|---|---:|---:|---:|",
                      *rows])  # fmt: skip


def corpus_perplexity(model, corpus, source_tokenizer, target_tokenizer, config, name, log=print):
    """The model's teacher-forced perplexity on `corpus` (a `pipeline.data.corpus` split named
    `name`), over its pairs within the training length limits, batched as in training.

    Returns (perplexity, pairs), or None when no pair is within the limits.
    """
    from pipeline.data.dataset import (
        batching_options,
        encode_corpus,
        make_dataset,
        with_known_length,
    )

    encoded = encode_corpus(
        corpus, source_tokenizer, target_tokenizer, config["data"], name, log=log
    )
    if not len(encoded):
        return None
    batches = with_known_length(make_dataset(encoded, **batching_options(config)))
    model.compile()
    metrics = model.evaluate(batches, verbose=0, return_dict=True)
    return float(metrics["perplexity"]), len(encoded)
