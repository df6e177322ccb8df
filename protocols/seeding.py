"""Per-purpose seed derivation: every randomized step gets its own generator.

Seeds are derived from the run's root seed and a purpose path, e.g.
``derive_seed(root, "negatives", round, client)``, so adding a new random step never shifts
the stream of another one, and a resumed run reproduces the same draws.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_MASK63 = (1 << 63) - 1


def derive_seed(root: int, *path: str | int) -> int:
    """Derive a 63-bit seed from ``root`` and a purpose path with SHA-256.

    Args:
        root: The run's root seed, an integer in ``[0, 2**128)`` (it is hashed as 16 bytes).
        *path: Purpose labels and indices, e.g. ``("noise", round_index)``.

    Returns:
        A non-negative integer below 2**63, usable by numpy and torch generators.
    """
    if root < 0:
        raise ValueError(f"root seed must be non-negative, got {root!r}")
    if root >= 1 << 128:
        raise ValueError(f"root seed must be below 2**128, got {root!r}")
    h = hashlib.sha256()
    h.update(b"securefed-seed-v1")
    h.update(int(root).to_bytes(16, "little", signed=False))
    for part in path:
        token = repr(part).encode()
        h.update(len(token).to_bytes(4, "little"))
        h.update(token)
    return int.from_bytes(h.digest()[:8], "little") & _MASK63


def numpy_generator(root: int, *path: str | int) -> np.random.Generator:
    """A numpy ``Generator`` (PCG64) seeded by :func:`derive_seed`."""
    return np.random.default_rng(derive_seed(root, *path))


def torch_generator(
    root: int, *path: str | int, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A torch ``Generator`` on ``device`` seeded by :func:`derive_seed`."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(root, *path))
    return g


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def keyed_uniforms(root: int, *path: str | int, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """One uniform float64 in ``[0, 1)`` per row of the integer columns ``keys``, a keyed hash
    (SplitMix64 over :func:`derive_seed`'s seed and the row's values).

    Unlike a draw from one stream, row ``i``'s value depends only on the seed, the path and
    row ``i``'s own keys: removing or changing other rows changes nothing else. Where one
    party's data must not move another's draws (a user's split under user-level DP), draw
    with this instead of ``numpy_generator(...).random(n)``.
    """
    if not keys:
        raise ValueError("keyed_uniforms needs at least one key column")
    n = len(keys[0])
    h = np.full(n, np.uint64(derive_seed(root, *path)), dtype=np.uint64)
    for column in keys:
        values = np.asarray(column, dtype=np.int64).astype(np.uint64)
        if values.shape != (n,):
            raise ValueError("keyed_uniforms: every key column must have the same length")
        h = _splitmix(h ^ (_splitmix(values + _GOLDEN) + _GOLDEN))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
