"""Privacy attacks on federated recommenders and the empirical DP audit.

Reads only what an observer sees (per-client uploads, per-round aggregates, released models)
under an explicit :class:`~attacks.threat.ThreatModel` and scores attacks; the public entry
point is :func:`attacks.audit.audit`, and :mod:`attacks.registry` is where an attack is
added. Each attack module names the paper it implements.
"""

from attacks.canaries import Canaries, clopper_pearson_bound, one_run_bound, plant_canaries
from attacks.metrics import binary_metrics, membership_report
from attacks.recorder import AttackRecorder, RecordPlan
from attacks.threat import ThreatModel, UploadChannel, upload_channel

__all__ = [
    "AttackRecorder",
    "Canaries",
    "RecordPlan",
    "ThreatModel",
    "UploadChannel",
    "binary_metrics",
    "clopper_pearson_bound",
    "membership_report",
    "one_run_bound",
    "plant_canaries",
    "upload_channel",
]
