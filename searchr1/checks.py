"""The error every config schema raises, and the range checks they share (searchr1/config.py,
searchr1/cluster/config.py)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config value that is out of range, or a key no schema has; the message names the key and the value."""


def _check(ok: bool, key: str, value, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {why}")


def _one_of(key: str, value, choices) -> None:
    _check(value in choices, key, value, f"must be one of {sorted(choices)}")


def _positive(obj, prefix: str, *names: str, strict: bool = True) -> None:
    for k in names:
        v = getattr(obj, k)
        _check(v > 0 if strict else v >= 0, f"{prefix}.{k}", v, "must be > 0" if strict else "must be >= 0")


def _compute_dtype(obj, key: str) -> None:
    """`obj.compute_dtype` under its full name (fp32 -> float32, bf16 -> bfloat16), one of the registry's."""
    from searchr1 import registry

    obj.compute_dtype = registry.DTYPE_ALIASES.get(obj.compute_dtype, obj.compute_dtype)
    _one_of(key, obj.compute_dtype, registry.COMPUTE_DTYPES)
