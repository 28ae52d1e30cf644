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
