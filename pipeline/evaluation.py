"""Translation quality with sacreBLEU: BLEU and chrF, with their signatures."""

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
