"""Conversion jobs: a supervised worker subprocess per job, a queue, the quality check."""

from quantdeck.core.convert.jobs import Conversion, JobQueue, QuantSpec, compare_quality, run_job
from quantdeck.core.convert.serving import ServingNote, serving_note
from quantdeck.core.models import CONVERSION_METHODS as METHODS  # the table, by --method name

__all__ = [
    "Conversion",
    "compare_quality",
    "JobQueue",
    "METHODS",
    "QuantSpec",
    "run_job",
    "serving_note",
    "ServingNote",
]
