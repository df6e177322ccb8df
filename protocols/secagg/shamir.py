"""Shamir t-of-n secret sharing of 32-byte secrets over GF(p), p = 2**256 + 297.

The prime exceeds 2**256, so every 32-byte secret (an X25519 private key or a self-mask seed)
is one field element and a share is one 33-byte element (Bonawitz et al. 2017, §3.1).
Shares sit at x = client id + 1, never at 0. Any ``t`` shares reconstruct; ``t - 1`` reveal
nothing (information-theoretically), because the ``t - 1`` random coefficients are drawn
from the OS CSPRNG (``os.urandom``) with 128 bits of slack against modular bias. With more
than ``t`` shares, :func:`reconstruct` checks every extra one against the polynomial through
the first ``t`` (Reed-Solomon error detection), so a wrong share is an error, never a wrong
secret.

Timing: Python integers are not constant-time. Splitting runs on the client's own secret and
its timing depends only on operand sizes, which are fixed here up to the leading zero bits of
random coefficients; reconstruction runs on the server over shares it is entitled to. A
deployment on hostile shared hardware should replace this module with a constant-time
implementation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from protocols.errors import ConfigError, IntegrityError

PRIME = (1 << 256) + 297
SECRET_BYTES = 32
SHARE_BYTES = 33
_COEFF_BYTES = 48  # 384 random bits reduced mod a 257-bit prime: bias < 2**-127


def split(secret: bytes, xs: Sequence[int], threshold: int) -> list[int]:
    """Split ``secret`` into shares at the points ``xs``.

    Args:
        secret: Exactly 32 bytes.
        xs: Distinct evaluation points in ``[1, 2**32]``.
        threshold: ``t``, the number of shares that reconstruct; ``1 <= t <= len(xs)``.

    Returns:
        The share values ``f(x)`` for each ``x`` in ``xs``, in the same order.
    """
    if len(secret) != SECRET_BYTES:
        raise ConfigError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)} bytes")
    if not 1 <= threshold <= len(xs):
        raise ConfigError(f"threshold must be in [1, {len(xs)}], got {threshold!r}")
    rand = os.urandom(_COEFF_BYTES * (threshold - 1))
    coeffs = [
        int.from_bytes(rand[i : i + _COEFF_BYTES], "big") % PRIME
        for i in range(0, len(rand), _COEFF_BYTES)
    ]
    coeffs.append(int.from_bytes(secret, "big"))  # highest degree first, secret is f(0)
    # Horner's rule without reducing between steps: the points are small integers, so the
    # accumulator grows by log2(x) bits a step and one reduction per share is enough.
    out = []
    for x in xs:
        acc = 0
        for c in coeffs:
            acc = acc * x + c
        out.append(acc % PRIME)
    return out


def combine(xs: Sequence[int], ys: Sequence[int]) -> bytes:
    """Reconstruct the secret from exactly ``t`` shares ``(x, y)`` by Lagrange interpolation.

    Pass exactly ``t`` shares with distinct non-zero ``xs``: with no redundant share nothing
    can be checked, so shares that do not come from a valid sharing give an unrelated value.
    Use :func:`reconstruct` whenever more than ``t`` shares are at hand. A value that is not
    a 32-byte secret raises :class:`IntegrityError`.
    """
    return reconstruct(xs, ys, threshold=len(xs))


def reconstruct(xs: Sequence[int], ys: Sequence[int], *, threshold: int) -> bytes:
    """Reconstruct the secret from all ``m >= t`` shares and verify every one of them.

    The polynomial of degree ``t - 1`` through the first ``t`` shares is evaluated at 0 (the
    secret) and at the ``x`` of every further share; a share off that polynomial raises
    :class:`IntegrityError`. The shares are a Reed-Solomon codeword of length ``m`` and
    dimension ``t`` (minimum distance ``m - t + 1``), so any ``1 .. m - t`` wrong shares,
    wherever they are, are detected; ``m = t`` detects nothing.

    Cost: one modular inversion and ``O(t**2 + (m - t) t)`` field multiplications
    (barycentric Lagrange form with prefix and suffix products).

    Args:
        xs: Distinct non-zero evaluation points.
        ys: Share values in ``[0, PRIME)``, one per point.
        threshold: ``t``; ``1 <= t <= len(xs)``.

    Returns:
        The 32-byte secret ``f(0)``.

    Raises:
        ConfigError: on mismatched lengths or a threshold outside ``[1, len(xs)]``.
        IntegrityError: on repeated or zero points, out-of-field values, shares that do not
            lie on one polynomial of degree ``< t``, or a secret that does not fit 32 bytes.
    """
    if len(xs) != len(ys) or not xs:
        raise ConfigError(f"need as many xs as ys (>= 1), got {len(xs)} and {len(ys)}")
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise ConfigError(f"threshold must be an int in [1, {len(xs)}], got {threshold!r}")
    if not 1 <= threshold <= len(xs):
        raise ConfigError(f"threshold must be in [1, {len(xs)}], got {threshold!r}")
    points = {x % PRIME for x in xs}
    if len(points) != len(xs) or 0 in points:  # repeated or zero points, modulo the prime
        raise IntegrityError()
    if any(not 0 <= y < PRIME for y in ys):
        raise IntegrityError()
    xs = [x % PRIME for x in xs]
    base = xs[:threshold]
    # f(z) = sum_i y_i w_i prod_{j != i} (z - x_j) with w_i = 1 / prod_{j != i} (x_i - x_j).
    # Share points are client ids + 1, so these products of differences are small integers
    # and are reduced once, not after every factor.
    dens = []
    for i, xi in enumerate(base):
        den = 1
        for j, xj in enumerate(base):
            if i != j:
                den *= xi - xj
        dens.append(den % PRIME)
    wy = [y * w % PRIME for y, w in zip(ys[:threshold], _batch_inverse(dens), strict=True)]
    for x, y in zip(xs[threshold:], ys[threshold:], strict=True):
        if _evaluate(base, wy, x) != y:
            raise IntegrityError()
    secret = _evaluate(base, wy, 0)
    if secret >> (8 * SECRET_BYTES):
        raise IntegrityError()
    return secret.to_bytes(SECRET_BYTES, "big")


def _batch_inverse(values: Sequence[int]) -> list[int]:
    """``1 / v mod PRIME`` for every (non-zero) ``v`` with one inversion (Montgomery's trick)."""
    prefix = [1]
    for v in values:
        prefix.append(prefix[-1] * v % PRIME)
    inv = pow(prefix[-1], -1, PRIME)  # 1 / prod(values)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % PRIME  # 1 / values[i]
        inv = inv * values[i] % PRIME  # 1 / prod(values[:i])
    return out


def _evaluate(xs: Sequence[int], wy: Sequence[int], z: int) -> int:
    """``sum_i wy_i prod_{j != i} (z - x_j) mod PRIME`` with prefix and suffix products."""
    diffs = [z - x for x in xs]  # small for small points: products reduced once at the end
    suffix = [1] * (len(diffs) + 1)
    for i in range(len(diffs) - 1, -1, -1):
        suffix[i] = suffix[i + 1] * diffs[i]
    acc = 0
    prefix = 1
    for i, d in enumerate(diffs):
        acc += wy[i] * (prefix * suffix[i + 1])
        prefix *= d
    return acc % PRIME


def share_to_bytes(y: int) -> bytes:
    """A share value as 33 big-endian bytes."""
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    """Parse a 33-byte share; values outside the field raise :class:`IntegrityError`."""
    if len(data) != SHARE_BYTES:
        raise IntegrityError()
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise IntegrityError()
    return y
