"""Searching a model's translations: the search options, greedy, sampling and beam search,
translation, scoring and evaluation."""
