"""The `tf.distribute` strategy of a training run, and this process's place in the cluster.

    default        one device
    mirrored       all local GPUs (or, with cpu_replicas N, the CPU split into N devices)
    multi_worker   MultiWorkerMirroredStrategy over the cluster described by TF_CONFIG
    tpu            TPUStrategy (resolver settings from the configuration; untested here)

Only the chief writes checkpoints, logs, the model and exports to the work directory; other
workers write theirs to a scratch folder of their own, removed when training ends.
"""

import dataclasses
import json
import os
from pathlib import Path

from pipeline.core.errors import UserError

SCRATCH_DIR = "worker-scratch"
EXIT_RESTART = 75  # EX_TEMPFAIL: the same command, run again on every worker, resumes


class WorkerLost(Exception):
    """Another worker of a multi-worker run stopped; every worker must restart to resume."""


@dataclasses.dataclass(frozen=True)
class Task:
    """This process in the cluster: its type and index in TF_CONFIG, and whether it is chief."""

    type: str = "chief"
    index: int = 0
    is_chief: bool = True

    def output_dir(self, workdir):
        """Where this process writes: the work directory for the chief, else its scratch."""
        return Path(workdir) if self.is_chief else Path(workdir) / SCRATCH_DIR / str(self)

    def __str__(self):
        return f"{self.type}-{self.index}"


def read_tf_config():
    """The parsed TF_CONFIG, or None when it is not set."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        tf_config = json.loads(raw)
        tf_config["cluster"], tf_config["task"]["type"], tf_config["task"]["index"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(
            f"TF_CONFIG: expected JSON with 'cluster' and 'task': {{'type', 'index'}} ({error})"
        ) from None
    return tf_config


def current_task(distribute_config):
    """This process's `Task`: from TF_CONFIG under multi_worker, else the only (chief) one.

    In a cluster without an explicit "chief", worker 0 is the chief (as in TensorFlow).
    """
    if distribute_config["strategy"] != "multi_worker":
        return Task()
    tf_config = read_tf_config()
    if tf_config is None:
        raise UserError(
            "distribute.strategy multi_worker needs TF_CONFIG describing the cluster "
            "(see the README's 'Training on a cluster')"
        )
    task_type, index = tf_config["task"]["type"], int(tf_config["task"]["index"])
    first_worker = task_type == "worker" and index == 0 and "chief" not in tf_config["cluster"]
    return Task(task_type, index, is_chief=task_type == "chief" or first_worker)


def take_chiefs_state(strategy, variables, is_chief):
    """Under multi_worker, sets every worker's `variables` to the chief's values.

    Synchronous training keeps every worker's copy equal, so the chief's checkpoint is the
    whole cluster's: a worker killed while saving, or restarted on an empty disk, resumes from
    it all the same. Each value is the sum over workers of the chief's value and zeros, which is
    exact.
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    share = 1.0 if is_chief else 0.0

    @tf.function
    def chiefs_values():
        def contribution():
            # float64 holds every float32 and every integer below 2**53 (steps, epochs) exactly;
            # multiply_no_nan's 0 * inf is 0, so an infinite value (no loss seen yet) stays whole.
            mine = [
                tf.math.multiply_no_nan(tf.cast(variable, tf.float64), share)
                for variable in variables
            ]
            return tf.distribute.get_replica_context().all_reduce("SUM", mine)

        return strategy.run(contribution)

    for variable, value in zip(variables, chiefs_values(), strict=True):
        variable.assign(tf.cast(value, variable.dtype))


def make_strategy(distribute_config):
    """The `tf.distribute.Strategy` the configuration asks for. Call it before TensorFlow runs
    any op: splitting the CPU into logical devices is only possible until then."""
    import tensorflow as tf

    kind = distribute_config["strategy"]
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        replicas = distribute_config["cpu_replicas"]
        if not replicas:
            return tf.distribute.MirroredStrategy()
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
        except RuntimeError:
            pass  # already initialised with this split (a second run in one process)
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][:replicas]
        if len(devices) < replicas:
            raise UserError(
                f"distribute.cpu_replicas {replicas}: TensorFlow was initialised before the "
                f"CPU could be split (it has {len(devices)} CPU devices)"
            )
        # NCCL serves GPUs only; on CPU devices, reduce on one of them.
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    if kind == "multi_worker":
        current_task(distribute_config)  # TF_CONFIG must be there and well-formed
        implementation = {
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
        }[distribute_config["communication"]]
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation
            )
        )
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=distribute_config["tpu_name"] or "",
            zone=distribute_config["tpu_zone"],
            project=distribute_config["tpu_project"],
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise UserError(f"distribute.strategy: unknown strategy {kind!r}")
