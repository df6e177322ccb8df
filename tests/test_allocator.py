"""The allocator setting that keeps FedRAP's large per-round buffers out of fresh mmap pages."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
if sys.argv[1] == "tuned":
    from securefed.allocator import keep_large_buffers
    assert keep_large_buffers() and keep_large_buffers()
def faults_of_reuse():
    x = torch.ones(64 * 2**20); del x          # 256 MiB, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        x = torch.ones(64 * 2**20); del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults_of_reuse())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_large_buffers_are_reused_instead_of_faulted_in_again() -> None:
    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout.strip())

    plain, tuned = faults("plain"), faults("tuned")
    # 3 x 256 MiB of 4 KiB pages is ~196k faults when every buffer is a fresh mmap.
    assert plain > 100_000
    assert tuned < plain / 2  # measured 65,536 vs 196,611: at most the first reuse faults
