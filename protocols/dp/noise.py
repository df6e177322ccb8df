"""Noise samplers: hardened continuous Gaussian and exact-by-rejection discrete Gaussian.

Every sampler takes an explicit ``torch.Generator`` (reproducible research runs) or, with
``secure=True``, refuses one and draws from the operating system's randomness: every call for
uniforms takes a fresh 256-bit key from ``os.urandom`` and expands it with AES-256-CTR
(:func:`os_uniform`). No sampler touches a global RNG.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.cores import usable_cores
from protocols.dp.table_sampler import block_table
from protocols.dp.table_sampler import fill as fill_from_table
from protocols.errors import ConfigError

_TWO_M53 = 2.0**-53
_SHIFT = np.uint64(11)  # a 64-bit word's top 53 bits
#: Bytes of ``os.urandom`` that key one :func:`os_uniform` call (an AES-256 key).
OS_KEY_BYTES = 32
_ZERO_NONCE = bytes(16)

#: Largest ``|N(0, 1)|`` draw, with margin: Box-Muller on 53-bit uniforms gives at most
#: ``sqrt(-2 log 2**-53) = 8.6``, the secure sum of four halved at most twice that, and
#: torch's sampler stays below it as well. ``std * NOISE_HEADROOM`` must fit the dtype.
NOISE_HEADROOM = 64.0
#: Valid discrete-Gaussian sigmas. Below the minimum, ``1 / (2 sigma**2)`` overflows a
#: float64 (sigma**2 leaves the normal range); above the maximum, a proposal
#: ``floor(-t log U)`` (``t = floor(sigma) + 1``, ``-log U <= 36.8`` for 53-bit uniforms) can
#: exceed 2**53, where float64 no longer holds every integer.
DISCRETE_SIGMA_MIN = 2.0**-500
DISCRETE_SIGMA_MAX = 2.0**47


def _shape(shape: int | Sequence[int] | torch.Size) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in dims):
        raise ConfigError(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(s) for s in dims)


def check_std(std: float, dtype: torch.dtype) -> float:
    """Return ``std`` as float if Gaussian noise of that std is finite in ``dtype``.

    Raises:
        ConfigError: if ``std`` is not a real number in ``[0, finfo(dtype).max / 64]`` (a
            larger std would turn draws into +-inf) or ``dtype`` is not floating point.
    """
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(f"noise dtype must be a floating torch dtype, got {dtype!r}")
    limit = torch.finfo(dtype).max / NOISE_HEADROOM
    if not (
        isinstance(std, numbers.Real)
        and not isinstance(std, bool)
        and math.isfinite(std)
        and 0 <= std <= limit
    ):
        raise ConfigError(
            f"noise std must be a finite number in [0, {limit:.3g}] for {dtype} (larger draws "
            f"overflow to infinity), got {std!r}; lower the noise multiplier or the clip, or "
            "use dtype=torch.float64"
        )
    return float(std)


def _check_source(generator: torch.Generator | None, secure: bool) -> None:
    if secure and generator is not None:
        raise ConfigError(
            "secure=True draws DP noise from OS randomness and refuses a generator; "
            "pass generator=None"
        )
    if not secure and generator is None:
        raise ConfigError(
            "pass an explicit torch.Generator (derive it with protocols.seeding), "
            "or set secure=True to use OS randomness"
        )


def os_cipher() -> Any:
    """An AES-256-CTR encryptor under a fresh key from ``os.urandom`` (zero nonce).

    A CSPRNG seeded from the OS, in the way the kernel's own generator behind ``os.urandom`` is
    (a ChaCha20 stream keyed from its entropy pool): encrypting zeros gives a keystream that is
    computationally indistinguishable from uniform bytes as long as the key is secret (AES's
    security as a pseudorandom permutation; a fresh key per encryptor, so no (key, counter)
    pair repeats and the all-zero nonce is safe). The key lives only inside the encryptor: it
    is not returned, stored or derived from anything a run records, so nothing in a run
    directory regenerates the stream. Why not ``os.urandom`` itself: a getrandom system call
    per request ran at about 0.2 GB/s here against several GB/s for OpenSSL's AES-CTR
    (docs/benchmarks.md), and a distributed-DP round of FedRAP on MovieLens 100K draws about
    2 GB of uniforms.
    """
    return Cipher(algorithms.AES(os.urandom(OS_KEY_BYTES)), modes.CTR(_ZERO_NONCE)).encryptor()


#: 64-bit words of keystream :func:`os_uniform` turns into uniforms per pass: its scratch
#: (keystream and shifted words, 512 KiB) and the piece of output stay in a core's cache, and
#: no call allocates more than its output (the whole-call version made a ``bytes`` keystream
#: and two more temporaries of the output's size). As fast in a warm process (2.1-2.8 ns a
#: uniform here either way); what it buys is ``out=``, which the discrete Gaussian sampler
#: uses to reuse its buffers (docs/benchmarks.md).
UNIFORM_PIECE = 1 << 15

_scratch = threading.local()


def _uniform_scratch() -> tuple[memoryview, bytearray, np.ndarray]:
    """This thread's zeros, keystream buffer and word buffer for :func:`os_uniform`."""
    found = getattr(_scratch, "buffers", None)
    if found is None:
        words = np.empty(UNIFORM_PIECE, dtype=np.uint64)
        # update_into needs block_size - 1 spare bytes in its output.
        found = (memoryview(bytes(8 * UNIFORM_PIECE)), bytearray(8 * UNIFORM_PIECE + 16), words)
        _scratch.buffers = found
    return found


def os_uniform(n: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``n`` float64 uniforms on the grid ``{k * 2**-53 : k = 1..2**53}`` from OS randomness.

    Uniform ``i`` is the top 53 bits of little-endian 64-bit word ``i`` of the keystream of
    one :func:`os_cipher` (a fresh OS key per call), plus one, times ``2**-53``: the values
    lie in (0, 1], so ``log(u)`` is always finite. The keystream is made and converted
    :data:`UNIFORM_PIECE` words at a time in this thread's scratch buffers, which hold the
    last piece's keystream until the thread's next call (the uniforms themselves are in the
    returned tensor). ``out``: a contiguous float64 tensor of ``n`` elements to fill.
    """
    if out is None:
        out = torch.empty(n, dtype=torch.float64)
    elif out.dtype != torch.float64 or out.numel() != n or not out.is_contiguous():
        raise ConfigError(
            f"out must be a contiguous float64 tensor of {n} elements, got {out.dtype} "
            f"{tuple(out.shape)}"
        )
    if n == 0:
        return out
    dst = out.view(-1).numpy()
    cipher = os_cipher()
    zeros, stream, words = _uniform_scratch()
    signed = words.view(np.int64)
    for lo in range(0, n, UNIFORM_PIECE):
        w = min(UNIFORM_PIECE, n - lo)
        cipher.update_into(zeros[: 8 * w], stream)
        np.right_shift(np.frombuffer(stream, dtype="<u8", count=w), _SHIFT, out=words[:w])
        piece = dst[lo : lo + w]
        np.copyto(piece, signed[:w], casting="unsafe")  # exact: < 2**53
        piece *= _TWO_M53  # exact: a power of two
        piece += _TWO_M53  # exact: (k + 1) 2**-53 <= 1
    return out


#: Elements processed per pass by the batched samplers. Their float64 temporaries (a few
#: per element) then stay in cache; one pass over a whole 50M-element update instead goes to
#: memory a dozen times and was 2-5x slower here (see docs/benchmarks.md).
CHUNK = 1 << 20

#: Elements per chunk of the discrete Gaussian sampler on OS randomness, where chunks are
#: independent (a fresh key each) and run on :data:`SECURE_WORKERS` threads: half of
#: :data:`CHUNK` keeps two threads' temporaries in this machine's caches (50.7 M samples
#: 1.32-1.44 s at CHUNK, 1.09-1.16 s at half, 1.15-1.28 at a quarter; docs/benchmarks.md). A
#: generator's draws keep :data:`CHUNK`, so replayed noise is unchanged.
SECURE_CHUNK = CHUNK // 2

#: Threads of the discrete Gaussian sampler on OS randomness (one per core, up to 4): a
#: distributed-DP round of FedRAP on MovieLens 100K draws 50.7 M samples, 2.8 s on one
#: thread here and 2.2 s on two before the copy below, 1.6 s after (docs/benchmarks.md).
SECURE_WORKERS = min(4, usable_cores())


def _uniform(
    n: int, generator: torch.Generator | None, secure: bool, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Float64 uniforms in (0, 1] from the OS (secure) or from ``generator``; ``out``: a
    contiguous float64 tensor of ``n`` elements to draw them into (the same draws)."""
    if secure:
        return os_uniform(n, out=out)
    # torch.rand is in [0, 1); 1 - u is in (0, 1].
    return torch.rand(n, generator=generator, dtype=torch.float64, out=out).neg_().add_(1.0)


def below(
    p: torch.Tensor,
    generator: torch.Generator | None,
    secure: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Independent Bernoulli(``p``) draws: ``U < p`` for one float64 uniform per element.

    ``P[True]`` is ``p`` rounded up to the 53-bit uniform grid (at most ``2**-53`` off).
    ``out``: a contiguous float64 tensor of ``p.numel()`` elements for the uniforms.
    """
    if secure:
        return os_uniform(p.numel(), out=out).view(p.shape) <= p
    u = out.view(p.shape) if out is not None else None
    return torch.rand(p.shape, generator=generator, dtype=torch.float64, out=u) < p


def _os_standard_normal(n: int) -> torch.Tensor:
    """``n`` float64 standard normals by Box-Muller from OS uniforms."""
    half = (n + 1) // 2
    u = os_uniform(2 * half).view(2, half)
    r = torch.sqrt(-2.0 * torch.log(u[0]))
    theta = (2.0 * math.pi) * u[1]
    return torch.cat([r * torch.cos(theta), r * torch.sin(theta)])[:n]


def gaussian_noise(
    shape: int | Sequence[int] | torch.Size,
    std: float,
    *,
    generator: torch.Generator | None,
    secure: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draw i.i.d. N(0, std**2) noise, hardened against floating-point attacks when secure.

    Unit of privacy and sensitivity are the caller's: for DP-FedAvg the noise on the sum of
    user updates clipped to C uses ``std = noise_multiplier * C`` (McMahan et al. 2018,
    Sec. 2), giving the Gaussian mechanism with L2 sensitivity C for user-level DP.

    The floating-point attack (Mironov, CCS 2012, "On significance of the least significant
    bits for differential privacy"; for Gaussian samplers and Opacus specifically, Jin et
    al., "Are we there yet? Timing and floating-point attacks on differential privacy
    systems", IEEE S&P 2022, arXiv:2112.05307): a textbook sampler maps a finite set of
    uniform bit patterns through ``log``/``sqrt``/``cos`` into doubles, so the set of noise
    values it can produce is sparse and irregular. The set of reachable outputs
    ``f(D) + noise`` then depends on ``f(D)``, and an observer who sees the exact float can
    rule out neighbouring inputs whose output set does not contain it: epsilon becomes
    infinite although the accountant reports a small value. The defence used here follows
    Holohan and Braghin, "Secure random sampling in differential privacy" (ESORICS 2021,
    arXiv:2107.10138, Sec. 5.1) as adopted by Opacus (``_generate_noise`` with
    ``secure_mode``): draw ``2n = 4`` Gaussians of the target std and return their sum
    divided by ``sqrt(4) = 2``. The sum has exactly the target distribution, while an
    attacker must now invert ``2n - 1`` independent samples jointly, raising the attack's
    work from about ``2**53`` to ``2**(53 * 3) = 2**159``. In secure mode the uniforms come
    from OS randomness (53 bits each, :func:`os_uniform`), are turned into normals by
    Box-Muller in float64,
    summed in float64 and only then cast to ``dtype``.

    Args:
        shape: Output shape.
        std: Standard deviation (>= 0); 0 returns zeros.
        generator: The ``torch.Generator`` to draw from; must be ``None`` when ``secure``.
        secure: Draw from OS randomness with the 4-sample hardening described above.
        dtype: Floating dtype of the result.

    Returns:
        A tensor of ``shape`` and ``dtype``.

    Raises:
        ConfigError: If ``std`` is negative, not finite or so large that draws overflow
            ``dtype`` (see :func:`check_std`), or the generator/secure combination is invalid.
    """
    dims = _shape(shape)
    std = check_std(std, dtype)
    _check_source(generator, secure)
    if std == 0:
        return torch.zeros(dims, dtype=dtype)
    if not secure:
        return torch.randn(dims, generator=generator, dtype=dtype).mul_(std)
    n = math.prod(dims)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(4):
        total += _os_standard_normal(n)
    return (total * (0.5 * std)).to(dtype).reshape(dims)


def discrete_gaussian(
    shape: int | Sequence[int] | torch.Size,
    sigma: float,
    *,
    generator: torch.Generator | None,
    secure: bool = False,
) -> torch.Tensor:
    """Draw i.i.d. samples of the discrete Gaussian N_Z(0, sigma**2) as int64.

    ``P[X = x]`` is proportional to ``exp(-x**2 / (2 sigma**2))`` on the integers.

    Two samplers of the same distribution. On OS randomness (``secure``) with ``sigma`` up
    to :data:`~protocols.dp.table_sampler.TABLE_SIGMA_MAX` (4.8e6), an alias table over
    blocks of integers with rejection inside a block
    (:mod:`protocols.dp.table_sampler`: two keystream words and one exponential a sample,
    within about 1e-15 in total variation of N_Z(0, sigma**2); 2x faster). With a
    ``generator`` (replay, whose draws stay bit for bit what they were) or a larger sigma,
    Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
    Privacy" (NeurIPS 2020), Algorithm 3 (rejection from a discrete Laplace proposal with
    scale ``t = floor(sigma) + 1``) with Algorithm 2's discrete Laplace drawn as the
    difference of two geometric variables. It is batched: within each chunk of
    :data:`CHUNK` coordinates (:data:`SECURE_CHUNK` on OS randomness) all pending ones draw a
    proposal at once and only the rejected ones are redrawn, so the number of Python-level
    iterations grows with ``numel / CHUNK + log(CHUNK)``, not with ``numel``.

    Exactness: the algorithm is exact in real arithmetic. Here the geometric draws
    (``floor(-t * log(U))``) and the acceptance test (``U' < exp(-(|Y| - sigma**2/t)**2 /
    (2 sigma**2))``) use float64 with 53-bit uniforms, so every probability is realised to
    within about 2**-52 relative error and the proposal's support is truncated at
    ``|Y| <~ 37 t`` (mass below 1e-290). The resulting total variation distance from
    N_Z(0, sigma**2) is below 1e-13 per sample, which is negligible next to any delta used
    here. Outputs are integers, so the floating-point-gap attack on continuous samplers
    (see :func:`gaussian_noise`) does not apply. This is not CKS's rational-arithmetic
    variant of Algorithm 1; timing of the loop is not constant (the noise is added by
    clients locally, outside an observer's timing view).

    Args:
        shape: Output shape.
        sigma: The scale sigma, in ``[DISCRETE_SIGMA_MIN, DISCRETE_SIGMA_MAX]`` (2**-500 to
            2**47; the variance is slightly below ``sigma**2``).
        generator: The ``torch.Generator`` to draw from; must be ``None`` when ``secure``.
        secure: Draw uniforms from OS randomness (:func:`os_uniform`) instead.

    Returns:
        An int64 tensor of ``shape``.

    Raises:
        ConfigError: If ``sigma`` is not a number in the valid range above (float64 cannot
            run the sampler outside it) or the generator/secure combination is invalid.
    """
    dims = _shape(shape)
    if not (
        isinstance(sigma, numbers.Real)
        and not isinstance(sigma, bool)
        and DISCRETE_SIGMA_MIN <= sigma <= DISCRETE_SIGMA_MAX  # also rejects NaN
    ):
        raise ConfigError(
            f"discrete Gaussian sigma must be a number in [{DISCRETE_SIGMA_MIN:.3g}, "
            f"{DISCRETE_SIGMA_MAX:.3g}] (float64 cannot sample it outside), got {sigma!r}; "
            "rescale the noise (e.g. a smaller fixed-point scale) into that range"
        )
    _check_source(generator, secure)
    n = math.prod(dims)
    sigma = float(sigma)
    out = torch.empty(n, dtype=torch.int64)
    step = SECURE_CHUNK if secure else CHUNK
    starts = range(0, n, step)
    workers = min(len(starts), SECURE_WORKERS) if secure else 1
    if workers > 1:
        # OS randomness: every chunk draws from its own fresh key, so chunks are independent
        # and can run on several threads (AES-CTR, numpy and torch release the GIL); a
        # generator's draws stay in one order (replay), on one thread.
        with ThreadPoolExecutor(max_workers=workers) as threads:
            for done in [
                threads.submit(_discrete_gaussian_into, out[lo : lo + step], sigma, None, True)
                for lo in starts
            ]:
                done.result()
        return out.reshape(dims)
    for lo in starts:
        _discrete_gaussian_into(out[lo : lo + step], sigma, generator, secure)
    return out.reshape(dims)


def _discrete_gaussian_into(
    out: torch.Tensor, sigma: float, generator: torch.Generator | None, secure: bool
) -> None:
    """Fill the 1-D int64 ``out`` with N_Z(0, sigma**2) samples (the loop of
    :func:`discrete_gaussian`, on one cache-sized chunk)."""
    if secure:
        table = block_table(sigma)
        if table is not None:
            fill_from_table(out.numpy(), table, os_cipher())
            return
    t = math.floor(sigma) + 1
    shift = sigma * sigma / t
    minus_inv_two_var = -1.0 / (2.0 * sigma * sigma)
    pending: torch.Tensor | None = None  # None: every element of out is pending
    k = out.numel()
    # The uniforms go into one buffer reused across the passes instead of fresh multi-MB
    # tensors per pass (docs/benchmarks.md); a generator's draws are the same either way.
    drawn = torch.empty(3 * k, dtype=torch.float64)
    while k > 0:
        u = _uniform(2 * k, generator, secure, out=drawn[: 2 * k]).view(2, k)
        # Two geometric(1 - exp(-1/t)) draws; their difference is discrete Laplace(t).
        g = u.log_().mul_(-t).floor_()
        y = g[0].sub_(g[1])
        accept_p = y.abs().sub_(shift).square_().mul_(minus_inv_two_var).exp_()
        # P[accept] = exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)), up to the 53-bit grid.
        accepted = below(accept_p, generator, secure, out=drawn[2 * k : 3 * k])
        # Every pending element takes its proposal; the rejected ones are overwritten by a
        # later round (a plain copy, not a masked one: the same outputs, a fraction of the
        # time).
        if pending is None:
            out.copy_(y)
            pending = torch.nonzero(~accepted).squeeze(1)
        else:
            out.index_copy_(0, pending, y.to(torch.int64))
            pending = pending[~accepted]
        k = pending.numel()
