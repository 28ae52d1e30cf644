"""Translation quality: BLEU, chrF and TER with sacreBLEU (with their signatures), and
perplexity."""

import math

import sacrebleu


def score_translations(hypotheses, references):
    """BLEU (cased and lowercased), chrF and TER (Snover et al., 2006: edits per reference
    word, lower is better) of `hypotheses` against one reference each, as sacreBLEU computes
    them, with their signatures."""
    bleu = sacrebleu.metrics.BLEU()
    bleu_lower = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    ter = sacrebleu.metrics.TER()
    refs = [references]
    bleu_score = bleu.corpus_score(hypotheses, refs)
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_lowercase": round(bleu_lower.corpus_score(hypotheses, refs).score, 2),
        "chrf": round(chrf.corpus_score(hypotheses, refs).score, 2),
        "ter": round(ter.corpus_score(hypotheses, refs).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "ter_signature": str(ter.get_signature()),
        "sentences": len(hypotheses),
    }


def score_directions(hypotheses, corpus):
    """{direction: `score_translations` and the share of translations in the wrong language}
    of each direction a multilingual split holds ({} for a bilingual one)."""
    languages = {code for direction, _, _ in corpus.directions
                 for code in (direction.source, direction.target)}  # fmt: skip
    identify = LanguageIdentifier(languages)
    scores = {}
    for direction, start, end in corpus.directions:
        found = hypotheses[start:end]
        scores[str(direction)] = score_translations(found, corpus.targets[start:end])
        scores[str(direction)]["wrong_language"] = identify.wrong_share(found, direction.target)
    return scores


class LanguageIdentifier:
    """langid.py's model (py3langid, shipped in its package: nothing is downloaded), choosing
    among `languages` only; codes it does not know (beyond their first two letters) are left
    out, and with fewer than two left it identifies nothing."""

    def __init__(self, languages):
        from py3langid.langid import MODEL_FILE
        from py3langid.langid import LanguageIdentifier as Identifier

        self.identifier = Identifier.from_model_file(MODEL_FILE)
        self.codes = {language: language[:2] for language in languages
                      if language[:2] in self.identifier.nb_classes}  # fmt: skip
        if len(set(self.codes.values())) > 1:
            self.identifier.set_languages(sorted(set(self.codes.values())))

    def wrong_share(self, texts, language):
        """The share (in %, two decimals) of the non-blank `texts` identified as another of
        the languages than `language`; None when it cannot tell."""
        texts = [text for text in texts if text.strip()]
        if language not in self.codes or len(set(self.codes.values())) < 2 or not texts:
            return None
        wrong = sum(self.identifier.classify(text)[0] != self.codes[language] for text in texts)
        return round(100 * wrong / len(texts), 2)


def direction_table(scores):
    """`score_directions`' figures as a Markdown table, a row a direction."""
    rows = [
        f"| {direction} | {s['bleu']} | {s['bleu_lowercase']} | {s['chrf']} | {s['ter']} | "
        f"{'-' if s['wrong_language'] is None else s['wrong_language']} |"
        for direction, s in scores.items()
    ]
    return "\n".join(["| direction | BLEU | BLEU lowercased | chrF | TER | wrong language % |",
                      "|---|---:|---:|---:|---:|---:|", *rows])  # fmt: skip


def corpus_perplexity(model, corpus, source_tokenizer, target_tokenizer, config, name, log=print):
    """The model's teacher-forced perplexity on `corpus` (a `pipeline.data.corpus` split named
    `name`), over its pairs within the training length limits, batched as in training.

    Returns (perplexity, pairs), or None when no pair is within the limits.
    """
    import tensorflow as tf

    from pipeline.core.graph_function import graph_function
    from pipeline.data.dataset import batching_options, encode_corpus, make_dataset
    from pipeline.data.tokenizer import PAD_ID

    encoded = encode_corpus(
        corpus, source_tokenizer, target_tokenizer, config["data"], name, log=log
    )
    if not len(encoded):
        return None
    spec = tf.TensorSpec([None, None], tf.int32)

    @graph_function(input_signature=[spec, spec, spec], reduce_retracing=True)
    def negative_log_likelihood(source_ids, target_input_ids, target_output_ids):
        # Through `forward`, which a single model and an ensemble both have.
        logits, _ = model.forward(
            {"source_ids": source_ids, "target_input_ids": target_input_ids}, training=False
        )
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        real = tf.not_equal(target_output_ids, PAD_ID)
        token_log_probs = tf.gather(log_probs, target_output_ids, batch_dims=2)
        return -tf.reduce_sum(tf.where(real, token_log_probs, 0.0)), tf.reduce_sum(
            tf.cast(real, tf.float32)
        )

    total, tokens = 0.0, 0.0
    for inputs, labels in make_dataset(encoded, **batching_options(config)):
        nll, count = negative_log_likelihood(
            inputs["source_ids"], inputs["target_input_ids"], labels
        )
        total, tokens = total + float(nll), tokens + float(count)
    return math.exp(total / tokens), len(encoded)
