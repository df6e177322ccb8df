"""The privacy-utility report: a sweep of models x defenses x epsilons, its results table,
figures and documents.

- :mod:`securefed.report.sweep`: the plan, the estimate, the runs and audits of each cell,
  and the results table (``run_report``, ``collect_results``, ``build_report``);
- :mod:`securefed.report.html`: report.md / report.html and the baseline verdicts;
- :mod:`securefed.report.plots`: the figures.

``securefed report`` (:mod:`securefed.cli.report`) is a thin layer over this package.
"""

from securefed.report.sweep import (
    BASELINE_COLUMNS,
    CENTRALIZED,
    DEFENSES,
    DP_BASELINE_COLUMNS,
    REFERENCE_MAX_ITEMS,
    REPORT_MARKERS,
    REQUIRED_COLUMNS,
    Cell,
    ReportConfig,
    ReportResult,
    SkippedCell,
    SweepEstimate,
    SweepEvent,
    build_report,
    check_report_dependencies,
    check_sweep_disk,
    collect_results,
    estimate_sweep,
    plan_cells,
    run_report,
)

__all__ = [
    "BASELINE_COLUMNS",
    "CENTRALIZED",
    "DEFENSES",
    "DP_BASELINE_COLUMNS",
    "REFERENCE_MAX_ITEMS",
    "REPORT_MARKERS",
    "REQUIRED_COLUMNS",
    "Cell",
    "ReportConfig",
    "ReportResult",
    "SkippedCell",
    "SweepEstimate",
    "SweepEvent",
    "build_report",
    "check_report_dependencies",
    "check_sweep_disk",
    "collect_results",
    "estimate_sweep",
    "plan_cells",
    "run_report",
]
