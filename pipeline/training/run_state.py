"""What a training run keeps across a resume beside its model and optimizer (`RunState`), the
checkpoint that holds them, and reading the checkpoints of every earlier format.

Adding a persisted counter is one variable in `RunState.__init__` and its entry in
`RunState.entries`; checkpoints written before it resume with its initial value.
"""

import math

import tensorflow as tf

from pipeline.core.errors import UnusableFileError, first_line

# The checkpoint's entries, named as every format since the first has them.
EPOCHS = "epochs"
STREAM = "stream"
EPOCH_STEPS = "epoch_steps"
TRAINING_TIME = "training_time"
TIME_BUDGET = "time_budget"
EARLY_STOPPING = "early_stopping"


def _counter():
    return tf.Variable(0, dtype=tf.int64, trainable=False)


class EarlyStoppingState(tf.Module):
    """What `callbacks.EarlyStopping` keeps, so that a resumed run stops where an
    uninterrupted one would: the best value of its metric so far (`best`, as "lower is
    better": the validation loss, or BLEU or chrF negated), the epochs since (`wait`), the
    epoch that reached it (`best_epoch`, 0 before any) and copies of `model`'s weights at that
    epoch (`copies`)."""

    def __init__(self, model):
        super().__init__()
        self.best = tf.Variable(math.inf, dtype=tf.float64, trainable=False)
        self.wait = _counter()
        self.best_epoch = _counter()
        self.copies = [tf.Variable(tf.zeros_like(w), trainable=False) for w in model.weights]

    def restore_best(self, model):
        """Gives `model` the best epoch's weights; returns that epoch (0: none yet)."""
        best_epoch = int(self.best_epoch.numpy())
        if best_epoch:
            model.set_weights([copy.numpy() for copy in self.copies])
        return best_epoch


class RunState:
    """A training run's persisted state, as variables that the callbacks update and the
    checkpoint keeps.

    - `completed_epochs`: epochs finished;
    - `epoch_steps`: the run's epoch length, fixed when it began (0: not begun);
    - `training_seconds`: training time across every command of the run;
    - `positions`: per training corpus, lines read since the first pass began;
    - `last_epoch`: the last epoch once a time budget has decided it (0: undecided);
    - `early_stopping`: an `EarlyStoppingState` when the run stops early (else None): it
      holds a copy of the weights, so only such runs carry it.
    """

    def __init__(self, corpora_count, early_stopping_model=None):
        self.completed_epochs = _counter()
        self.epoch_steps = _counter()
        self.training_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.positions = [_counter() for _ in range(corpora_count)]
        self.last_epoch = _counter()
        self.early_stopping = None
        if early_stopping_model is not None:
            self.early_stopping = EarlyStoppingState(early_stopping_model)

    def entries(self):
        """{checkpoint entry: what it holds}."""
        entries = {
            EPOCHS: self.completed_epochs,
            STREAM: tf.train.Checkpoint(
                **{f"corpus_{i}": position for i, position in enumerate(self.positions)}
            ),
            EPOCH_STEPS: self.epoch_steps,
            TRAINING_TIME: self.training_seconds,
            TIME_BUDGET: tf.train.Checkpoint(last_epoch=self.last_epoch),
        }
        if self.early_stopping is not None:
            entries[EARLY_STOPPING] = self.early_stopping
        return entries

    @property
    def variables(self):
        """Every variable, in a fixed order (the chief's values are shared in it)."""
        stopping = self.early_stopping.variables if self.early_stopping is not None else ()
        return [self.completed_epochs, self.epoch_steps, self.training_seconds, *self.positions,
                self.last_epoch, *stopping]  # fmt: skip


def training_checkpoint(model, optimizer, state=None):
    """The `tf.train.Checkpoint` that training saves: the model, its optimizer and, when
    given, the run's `state`."""
    checkpoint = tf.train.Checkpoint(
        model=model, optimizer=optimizer, **(state.entries() if state is not None else {})
    )
    # Restoring would create the save counter, and under multi_worker creating a variable is a
    # collective op every worker must join; only the chief restores, so create it here.
    checkpoint.save_counter  # noqa: B018
    return checkpoint


def restore_run(path, model, optimizer, state):
    """Restores the training checkpoint `path`, of any format, into `model`, `optimizer` and
    `state`; returns the names of the entries it lacked (their variables keep their initial
    values, and the next checkpoint holds them).

    The formats, oldest first, by what they added: the model, optimizer, epochs and stream;
    `epoch_steps`; `time_budget` (runs with a budget: its decision and the training time);
    `early_stopping` (runs that stop early); `training_time` (every run; the budget's entry
    then holds its decision only); the budget's entry in every run. A damaged or foreign
    checkpoint is an `UnusableFileError`, with nothing changed.
    """
    try:
        held = {key.split("/", 1)[0]
                for key in tf.train.load_checkpoint(path).get_variable_to_shape_map()}  # fmt: skip
        entries = {name: entry for name, entry in state.entries().items() if name in held}
        if TIME_BUDGET in held and TRAINING_TIME not in held:  # the budget kept the time
            entries[TIME_BUDGET] = tf.train.Checkpoint(
                last_epoch=state.last_epoch, seconds=state.training_seconds
            )
        # `read`, not `restore`: it creates no save counter, a variable that under multi_worker
        # every worker would have to create, where only the chief restores.
        reader = tf.train.Checkpoint(model=model, optimizer=optimizer, **entries)
        reader.read(path).expect_partial().assert_existing_objects_matched()
    except Exception as error:  # the checkpoint reader raises many types for a damaged file
        raise UnusableFileError(
            path,
            "cannot restore this checkpoint: it is damaged or belongs to another model or "
            f"vocabulary ({first_line(error)}); nothing was changed",
        ) from None
    lacked = set(state.entries()) - held
    if TIME_BUDGET in held:
        lacked.discard(TRAINING_TIME)
    return lacked
