"""`specdiff generate --ray`: the same prompts, results and records, decoded by a Ray actor pool
(specdiff.ray). Ray's own logging is kept to warnings; --stats adds Ray's timings."""

from __future__ import annotations

import functools
import logging

import click

WORKER_OPTIONS = ("ray", "workers", "cpus_per_worker", "gpus_per_worker")


def ray_options(command):
    """--ray [ADDRESS], --workers, --cpus-per-worker, --gpus-per-worker."""
    options = [
        click.option("--ray", metavar="ADDRESS", is_flag=False, flag_value="", default=None,
                     help="Decode on Ray: 'local' starts a local Ray, an address joins a cluster, no "
                          "value: $RAY_ADDRESS, else local (needs the specdiff[ray] extra)."),
        click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
                     help="With --ray: actors, each loading the models once."),
        click.option("--cpus-per-worker", type=click.FloatRange(min=0), default=1.0, show_default=True,
                     help="With --ray: CPUs each actor reserves (fractions allowed)."),
        click.option("--gpus-per-worker", type=click.FloatRange(min=0), default=0.0, show_default=True,
                     help="With --ray: GPUs each actor reserves (use --device cuda)."),
    ]
    return functools.reduce(lambda c, option: option(c), reversed(options), command)


def check_ray_flags(ray, workers, cpus_per_worker, gpus_per_worker, stream) -> None:
    """The worker flags mean nothing without --ray; --stream needs the local loop."""
    if ray is None:
        if (workers, cpus_per_worker, gpus_per_worker) != (2, 1.0, 0.0):
            raise click.UsageError("--workers, --cpus-per-worker and --gpus-per-worker go with --ray")
        return
    if stream:
        raise click.UsageError("--stream prints text as one process decodes it; it does not go with --ray")


def run_on_ray(prompts: list[str], options: dict, address: str, workers: int, cpus: float, gpus: float,
               threads: int | None, truncate_prompt: bool):
    """-> specdiff.ray.RayResult, Ray quiet but for its warnings."""
    import specdiff.ray as sray

    sray.init(address or None, logging_level=logging.WARNING)
    from ray.data import DataContext

    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its progress lines, once per second
    DataContext.get_current().print_on_execution_start = False
    threads = threads or max(1, int(cpus))
    return sray.generate(prompts, workers=workers, cpus_per_worker=cpus, gpus_per_worker=gpus,
                         threads=threads, truncate_prompt=truncate_prompt, **options)
