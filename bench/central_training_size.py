"""How long one central training (LabelDP-Pro) takes for its size, the unit of ``max_central_training_size``
(labels_party/runtime/settings.py): steps × (padded batch + the denoiser's rows) × model parameters.

    python -m bench.central_training_size DENOISER STEPS BATCH HIDDEN   # e.g. altconv 400 2000 64,64

On 2,000 examples × 8 features, 2 classes; prints the size, wall and CPU seconds and the peak RSS."""

from __future__ import annotations

import resource
import sys
import time

import numpy as np

from labels_party.core import labeldp_pro
from shared import models


def main(denoiser: str, steps: int, batch: int, hidden: tuple[int, ...]) -> None:
    n, d, k = 2000, 8, 2
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, k, n)
    config = labeldp_pro.ProConfig(denoiser=denoiser, epsilon=1.0, delta=1e-6, steps=steps,
                                   batch_size=min(batch, n), hidden=hidden)
    params = models.num_params(models.ModelSpec(d, (), 4, hidden, k))
    per_step, total = labeldp_pro.training_size(config, n, params)
    wall, cpu = time.perf_counter(), time.process_time()
    labeldp_pro.train_labeldp_pro(config, x, y, k, rng, sigma=1.0)
    print(f"{denoiser} steps={steps} batch={batch} hidden={list(hidden)} parameters={params:,} size={total:.3g} "
          f"step={per_step:.3g}: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), tuple(int(h) for h in sys.argv[4].split(",") if h))
