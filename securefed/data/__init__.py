"""The data layer: loading, synthetic data, the leave-one-out split and negative sampling."""

from securefed.data.loaders import filter_min_interactions
from securefed.data.negatives import NegativeSampler, NegativeSource, sample_train_negatives
from securefed.data.registry import KNOWN_DATASETS, ProgressCallback, load_dataset
from securefed.data.split import leave_one_out
from securefed.data.synthetic import make_synthetic
from securefed.data.types import Interactions, LoadReport, Split

__all__ = [
    "KNOWN_DATASETS",
    "Interactions",
    "LoadReport",
    "NegativeSampler",
    "NegativeSource",
    "ProgressCallback",
    "Split",
    "filter_min_interactions",
    "leave_one_out",
    "load_dataset",
    "make_synthetic",
    "sample_train_negatives",
]
