"""Shamir t-of-n secret sharing of 32-byte secrets over GF(p), p = 2**256 + 297.

The prime exceeds 2**256, so every 32-byte secret (an X25519 private key or a self-mask seed)
is one field element and a share is one 33-byte element (Bonawitz et al. 2017, §3.1).
Shares sit at x = client id + 1, never at 0. Any ``t`` shares reconstruct; ``t - 1`` reveal
nothing (information-theoretically), because the ``t - 1`` random coefficients are drawn
from the OS CSPRNG (``os.urandom``) with 128 bits of slack against modular bias.

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
    out = []
    for x in xs:
        acc = 0
        for c in coeffs:
            acc = (acc * x + c) % PRIME
        out.append(acc)
    return out


def combine(xs: Sequence[int], ys: Sequence[int]) -> bytes:
    """Reconstruct the secret from shares ``(x, y)`` by Lagrange interpolation at 0.

    Pass exactly ``t`` shares with distinct non-zero ``xs``. Shares that do not come from a
    valid sharing give an unrelated value; a value that is not a 32-byte secret raises
    :class:`IntegrityError`.
    """
    if len(xs) != len(ys) or not xs:
        raise ConfigError(f"need as many xs as ys (>= 1), got {len(xs)} and {len(ys)}")
    if len(set(xs)) != len(xs) or any(x % PRIME == 0 for x in xs):
        raise IntegrityError()
    # sum_i y_i * prod_{j != i} x_j / (x_j - x_i); one modular inversion for all (Montgomery).
    weights = []
    dens = []
    for i, xi in enumerate(xs):
        num = 1
        den = 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        weights.append(ys[i] * num % PRIME)
        dens.append(den)
    prefix = [1]
    for den in dens:
        prefix.append(prefix[-1] * den % PRIME)
    inv = pow(prefix[-1], -1, PRIME)
    secret = 0
    for i in range(len(dens) - 1, -1, -1):
        inv_den = inv * prefix[i] % PRIME  # 1 / dens[i]
        inv = inv * dens[i] % PRIME  # 1 / prod(dens[:i])
        secret = (secret + weights[i] * inv_den) % PRIME
    if secret >> (8 * SECRET_BYTES):
        raise IntegrityError()
    return secret.to_bytes(SECRET_BYTES, "big")


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
