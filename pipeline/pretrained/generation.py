"""A checkpoint's generation settings (`generation_config.json`, and the generation keys that
transformers 4 kept in config.json) as the toolkit's search: each key is mapped to a `decode`
key, known to leave the best translation alone, or refused in one line, so that an import
never translates differently from `generate()` without a word."""

from pipeline.core.errors import UserError
from pipeline.pretrained.checkpoint import GENERATION_CONFIG_FILE

# The flags beside the `decode` keys in `generate_settings`' result, which the import reports.
IMPORT_NOTES = frozenset({"renormalized", "sampled"})

# The keys `generate_settings` maps onto the search (or the family's importer reads: the
# special tokens' ids).
MAPPED = frozenset({
    "max_length", "max_new_tokens", "min_length", "min_new_tokens", "num_beams",
    "length_penalty", "early_stopping", "no_repeat_ngram_size", "bad_words_ids",
    "renormalize_logits", "forced_bos_token_id", "forced_eos_token_id", "pad_token_id",
    "bos_token_id", "eos_token_id", "decoder_start_token_id",
})  # fmt: skip

# Keys that change how `generate()` runs or what it returns beside its best sequence, never
# which sequence that is (caches, speculative decoding, compilation, returned extras).
INERT = frozenset({
    "use_cache", "cache_implementation", "cache_config", "max_cache_len", "low_memory",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate", "remove_invalid_values", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "assistant_lookbehind", "target_lookbehind", "compile_config", "disable_compile",
    "continuous_batching_config", "prefill_chunk_size", "_from_model_config",
    "transformers_version",
})  # fmt: skip

# Sampling's keys: `generate()` reads them only with do_sample true.
SAMPLING = frozenset({
    "do_sample", "temperature", "top_k", "top_p", "min_p", "top_h", "typical_p",
    "epsilon_cutoff", "eta_cutoff",
})  # fmt: skip

# {key: (the values with which it does nothing, what the toolkit's search does instead)}:
# refused at import with any other value.
REFUSED = {
    "repetition_penalty": (
        (1, 1.0),
        "no repetition penalty (no_repeat_ngram_size blocks repeated n-grams)",
    ),
    "encoder_repetition_penalty": ((1, 1.0), "no penalty on the source's tokens"),
    "num_beam_groups": ((1,), "one beam search, no groups"),
    "diversity_penalty": ((0, 0.0), "no diversity penalty between beams"),
    "encoder_no_repeat_ngram_size": ((0,), "no blocking of the source's n-grams"),
    "exponential_decay_length_penalty": ((), "the length penalty of `length_penalty` alone"),
    "suppress_tokens": (([],), "no tokens suppressed beyond the vocabulary's own"),
    "begin_suppress_tokens": (([],), "no tokens suppressed at the first step"),
    "forced_decoder_ids": (([],), "only the first target token forced (forced_bos_token_id)"),
    "sequence_bias": (({}, []), "no bias on token sequences"),
    "force_words_ids": (([],), "no constrained words"),
    "constraints": (([],), "no constraints"),
    "penalty_alpha": ((0, 0.0), "beam search, not contrastive search"),
    "dola_layers": ((), "the final layer's logits alone"),
    "guidance_scale": ((1, 1.0), "no classifier-free guidance"),
    "token_healing": ((False,), "the source as given"),
    "stop_strings": (([], ""), "stops at </s> and the length limit alone"),
    "max_time": ((), "no time limit: a translation runs to </s> or its length limit"),
    "watermarking_config": (({},), "no watermark"),
    "use_mtp": ((False,), "one token a step"),
}


def _check(config, generation):
    """Refuses the settings that would make `generate()` translate otherwise than the toolkit
    (generation_config.json's where it has the key, which `generate()` reads over
    config.json's) and generation_config.json's unknown keys; returns whether they ask for
    sampling."""
    merged = {**config, **generation}
    for key, value in merged.items():
        file = GENERATION_CONFIG_FILE if key in generation else "config.json"
        if key in REFUSED:
            neutral, instead = REFUSED[key]
            if value is not None and value not in neutral:
                raise UserError(f"{file}: {key} {value!r} is not supported; the toolkit's "
                                f"search would apply {instead}: remove the key to import "
                                "the checkpoint so")  # fmt: skip
        elif key in generation and key not in MAPPED | INERT | SAMPLING:
            raise UserError(f"{file}: {key} is no generation setting the importer knows: it "
                            "cannot tell whether generate() would translate otherwise")  # fmt: skip
    return bool(merged.get("do_sample"))


def _given(values, key, default):
    """`values[key]`, or `default` where it is missing or null (transformers 5's unset)."""
    value = values.get(key)
    return default if value is None else value


def generate_settings(config, generation):
    """The `decode` keys that make the toolkit's search what `generate()` does with this
    checkpoint's generation config (and config.json's defaults under it), with
    "renormalized" (renormalize_logits) and "sampled" (do_sample: the import says that the
    toolkit's search is beam search all the same)."""
    sampled = _check(config, generation)
    merged = {**config, **generation}
    # transformers' lengths count the decoder's start token; *_new_tokens, the tokens output.
    max_length = int(merged.get("max_length") or 20) - 1
    if merged.get("max_new_tokens") is not None:
        max_length = int(merged["max_new_tokens"])
    min_length = max(int(merged.get("min_length") or 0) - 1,
                     int(merged.get("min_new_tokens") or 0), 0)  # fmt: skip
    early_stopping = merged.get("early_stopping") or False
    bad_words = merged.get("bad_words_ids") or []
    start = merged.get("decoder_start_token_id", merged.get("pad_token_id"))
    if any(words != [start] for words in bad_words):
        raise UserError(f"{GENERATION_CONFIG_FILE}: bad_words_ids {bad_words} (only the start "
                        "token [[pad]] is supported)")  # fmt: skip
    return {
        "beam_size": int(merged.get("num_beams") or 1),
        "length_penalty": float(_given(merged, "length_penalty", 1.0)),
        "length_penalty_type": "average",
        "beam_stopping": {True: "k_finished", False: "no_improvement", "never": "never"}[
            early_stopping
        ],
        "force_eos_at_limit": merged.get("forced_eos_token_id") is not None,
        "capped_hypotheses": "rank",
        "min_length": min_length,
        "no_repeat_ngram_size": int(merged.get("no_repeat_ngram_size") or 0),
        "max_length_ratio": 0.0,
        "max_length_offset": max_length,
        "max_length_cap": max_length,
        "renormalized": bool(merged.get("renormalize_logits")),
        "sampled": sampled,
    }
