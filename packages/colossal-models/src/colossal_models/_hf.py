"""What the Hugging Face adapters share: reading config attributes without importing
``transformers`` (it is the optional extra ``hf``) and importing it with a useful error."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from colossal_contracts import ConfigError

__all__ = ["check_keys", "hf_attr", "import_transformers"]


def import_transformers() -> Any:
    """The ``transformers`` module; ``ConfigError`` saying how to install it when missing."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "Hugging Face interop needs transformers: pip install 'colossal-models[hf]'"
        ) from exc
    return transformers


def hf_attr(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, or ``default`` when the attribute is absent or None."""
    value = getattr(config, name, None)
    return default if value is None else value


def check_keys(
    got: Iterable[str], expected: set[str], *, what: str, ignore: tuple[str, ...] = ()
) -> None:
    """``ConfigError`` listing missing and unexpected keys (ignoring names ending in ``ignore``)."""
    names = {k for k in got if not (ignore and k.endswith(ignore))}
    missing, extra = sorted(expected - names), sorted(names - expected)
    if missing or extra:
        raise ConfigError(
            f"{what}: state dict does not match the config; missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
            f"{'...' if len(extra) > 5 else ''}; build the config from the same checkpoint's "
            "config (config_from_hf)"
        )
