"""`train.precision: auto`: mixed bfloat16 where the hardware computes bfloat16 natively and it
pays, float32 elsewhere, decided once per run.

Mixed bfloat16 trains faster on CPUs with AMX (Intel's tile units) and on GPUs of compute
capability 8.0 and above. On a CPU with AVX512-BF16 but no AMX it depends on the model type,
which declares it (`ModelType.bfloat16_without_amx`): on such a CPU (an AMD EPYC) the recurrent
recipes trained faster in mixed bfloat16 in every round measured, the Transformer recipe in two
rounds of five (docs/training.md). A run keeps the precision it began with: the resolved value
is what the work directory's configuration holds, and a resumed `auto` run reads it from there.
"""

from pathlib import Path

import yaml

from pipeline.core.errors import UserError

AUTO = "auto"
NATIVE_BFLOAT16_CPU_FLAG = "amx_bf16"  # /proc/cpuinfo's flag for AMX's bfloat16 products
VECTOR_BFLOAT16_CPU_FLAG = "avx512_bf16"  # bfloat16 dot products in AVX-512 registers
MIN_BFLOAT16_GPU = (8, 0)  # compute capability with bfloat16 tensor cores (Ampere)


def cpu_flags(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags")
            for flag in line.partition(":")[2].split()}  # fmt: skip


def gpu_capabilities():
    """Each visible GPU's compute capability, as (major, minor)."""
    import tensorflow as tf

    details = [tf.config.experimental.get_device_details(gpu)
               for gpu in tf.config.list_physical_devices("GPU")]  # fmt: skip
    return [tuple(d["compute_capability"]) for d in details if d.get("compute_capability")]


def choose(flags, gpus, model_type):
    """(precision, why) for `auto` on hardware with CPU `flags` and GPU capabilities `gpus`,
    training a model of `model_type` (a `ModelType`)."""
    if gpus:
        best = max(gpus)
        if best >= MIN_BFLOAT16_GPU:
            return "mixed_bfloat16", f"a GPU of compute capability {best[0]}.{best[1]}"
        return "float32", (f"GPUs of compute capability {best[0]}.{best[1]}, below "
                           f"{MIN_BFLOAT16_GPU[0]}.{MIN_BFLOAT16_GPU[1]}")  # fmt: skip
    if NATIVE_BFLOAT16_CPU_FLAG in flags:
        return "mixed_bfloat16", "the CPU has AMX"
    if VECTOR_BFLOAT16_CPU_FLAG in flags:
        if model_type.bfloat16_without_amx:
            return "mixed_bfloat16", (f"the CPU has AVX512-BF16 without AMX, where bfloat16 "
                                      f"trains {model_type.name} models faster")  # fmt: skip
        return "float32", (f"the CPU has AVX512-BF16 but no AMX, where bfloat16 does not train "
                           f"{model_type.name} models faster")  # fmt: skip
    return "float32", "the CPU has no bfloat16 arithmetic"


def resolve(requested, saved_config, model_type, flags=None, gpus=None):
    """(precision, the log line) for a run of a `model_type` model asking `requested`
    (`train.precision`) whose work directory holds `saved_config` (a path; it may not exist).
    `flags` and `gpus` default to this machine's."""
    if requested != AUTO:
        return requested, f"Precision: {requested} (train.precision)"
    gpus = gpu_capabilities() if gpus is None else gpus
    kept = _saved_precision(saved_config)
    if kept == "mixed_float16" and not gpus:
        raise UserError(
            f"{saved_config}: this run began in mixed_float16 (train.precision: auto on a GPU), "
            "which needs a GPU; resume it on one, or set train.precision to continue in another"
        )
    if kept:
        return kept, f"Precision: {kept} (train.precision: auto, as the run began)"
    precision, why = choose(cpu_flags() if flags is None else flags, gpus, model_type)
    return precision, f"Precision: {precision} (train.precision: auto; {why})"


def _saved_precision(path):
    path = Path(path)
    if not path.is_file():
        return None
    saved = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("train", {})
    precision = saved.get("precision")
    return None if precision in (None, AUTO) else precision
