"""Conversion jobs: a supervised worker subprocess per job, a queue, the quality check."""

from quantdeck.core.convert.jobs import METHODS, JobQueue, QuantSpec, compare_quality, run_job

__all__ = [
    "compare_quality",
    "JobQueue",
    "METHODS",
    "QuantSpec",
    "run_job",
]
