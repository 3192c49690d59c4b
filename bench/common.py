"""What the Hydra-configured benchmarks share: their own `bench.*` keys beside Hydra's overrides of conf/ (which
`launch.compose_config` composes)."""
from __future__ import annotations

import difflib


def split_args(argv: list[str], keys: dict[str, type], prog: str) -> tuple[dict, list[str]]:
    """(the `bench.*` keys, typed; the Hydra overrides). An unknown or mistyped bench key stops before anything
    starts, naming it (and the nearest known one)."""
    own, overrides = {}, []
    for a in argv:
        key, _, value = a.partition("=")
        if not key.startswith("bench."):
            overrides.append(a)
            continue
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1)
            raise SystemExit(f"{prog}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                             + f"; its keys: {', '.join(keys)}")
        try:
            own[key] = keys[key](value)
        except ValueError:
            raise SystemExit(f"{prog}: {key}={value!r} is not an {keys[key].__name__}") from None
    return own, overrides
