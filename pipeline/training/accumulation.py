"""Gradient accumulation: the micro-batches of one update, from `train.accumulate_steps` or
from an effective batch that holds whatever the replicas (as OpenNMT-tf's
`effective_batch_size`): one recipe makes the same updates on one CPU and on eight devices."""

from pipeline.core.errors import UserError

# (the effective batch's key, the per-replica batch's key, its unit)
EFFECTIVE_BATCHES = (
    ("effective_batch_tokens", "batch_tokens", "tokens"),
    ("effective_batch_size", "batch_size", "pairs"),
)


def accumulation_configured(train):
    """Whether `train` sets an accumulation or an effective batch (then the log says it)."""
    return train["accumulate_steps"] > 1 or any(train[key] for key, _, _ in EFFECTIVE_BATCHES)


def micro_batches_per_update(train, replicas):
    """Micro-batches of one update on each replica; an effective batch that replicas x the
    per-replica batch does not divide is a `UserError`."""
    for effective_key, batch_key, unit in EFFECTIVE_BATCHES:
        effective = train[effective_key]
        if not effective:
            continue
        per_step = train[batch_key] * replicas
        if effective % per_step:
            raise UserError(
                f"train.{effective_key} ({effective:,}) is not a multiple of {replicas} "
                f"replica(s) x train.{batch_key} ({train[batch_key]:,} {unit}); choose a "
                f"multiple of {per_step:,}"
            )
        return effective // per_step
    return train["accumulate_steps"]


def describe(train, replicas, count):
    """The log line saying what one update is made of."""
    if train["batch_tokens"]:
        per_replica, unit = train["batch_tokens"], "tokens (at most)"
    else:
        per_replica, unit = train["batch_size"], "pairs"
    origin = next((f" (train.{key})" for key, _, _ in EFFECTIVE_BATCHES if train[key]), "")
    return (
        f"Updates of {count} micro-batch(es) x {replicas} replica(s) x {per_replica:,} {unit}"
        f" = {count * replicas * per_replica:,}{origin}"
    )
