"""Prints the name of every op with a CPU (or device-independent) kernel in TensorFlow and
tensorflow-text, one a line.

Run it under the versions that TF Serving links (tensorflow 2.12.1 and tensorflow-text 2.12.1,
in a separate virtual environment) to write `export/tf_serving_ops.txt`:

    python3 -m venv /tmp/tf212 && /tmp/tf212/bin/pip install tensorflow==2.12.1 \
        tensorflow-text==2.12.1
    /tmp/tf212/bin/python tools/list_registered_ops.py > export/tf_serving_ops.txt
"""

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers its ops)
from tensorflow.python.framework import kernels

print(f"# tensorflow {tf.__version__}, tensorflow-text {tensorflow_text.__version__}")
# A DEFAULT kernel (Assert's, for one) runs on whatever device the op is placed on, the CPU too.
cpu_ops = {
    k.op for k in kernels.get_all_registered_kernels().kernel if k.device_type in ("CPU", "DEFAULT")
}
cpu_ops.add("NoOp")  # run by the executor itself; the kernel registry does not list it
print("\n".join(sorted(cpu_ops)))
