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


def _finite(obj, prefix: str = "") -> None:
    """Every float of a config tree is a finite number: `inf` passes `> 0` and then breaks a rank far from here
    (an infinite learning rate makes the first sampling distribution nan)."""
    import math
    from dataclasses import fields, is_dataclass

    for f in fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(v):
            _finite(v, key + ".")
        elif isinstance(v, float):
            _check(math.isfinite(v), key, v, "must be a finite number")
        elif isinstance(v, (list, tuple)) and any(isinstance(x, float) and not math.isfinite(x) for x in v):
            raise ConfigError(f"{key}={v!r}: every element must be a finite number")


def _one_folder_name(key: str, value: str) -> None:
    """A name that becomes one folder under another: no separator, not '.' or '..', nothing that climbs out."""
    ok = value == "" or (value not in (".", "..") and "/" not in value and "\\" not in value and "\0" not in value)
    _check(ok, key, value, "must be a single folder name (no '/', not '.' or '..')")


def refuse_non_finite(tree, prefix: str = "") -> None:
    """The same rule on a plain mapping of the config (a composed or saved one), before any schema's own checks
    run, so that the error names the key that is infinite rather than one compared with it."""
    import math

    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        key = f"{prefix}{k}" if isinstance(tree, dict) else f"{prefix[:-1]}[{k}]"
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key}={v!r}: must be a finite number")
        refuse_non_finite(v, f"{key}.")
