"""Controls that live in the URL: a link to a page shows the view its sender saw.

Each control is seeded from its ``?param=`` on the session's first run of the page (``from_url``
and the helpers for a choice, a flag, a text, texts and a number), then written back after the
widget (``to_url``), left out while it is the default so that a plain link stays short.  A value
from the URL is data: checked (against the choices, its length or its range), and a refused one is
said, as text, and the default used.  The pages' smoothing slider and log-y toggle are here once
(``smoothing_slider``, ``log_y_toggle``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from metrics_core.dashboard.display_text import md_text, shorten
from metrics_core.dashboard.views.chart_specs import SMOOTHING_DEFAULT, SMOOTHING_MAX, SMOOTHING_STEP, smoothing_error

URL_MAX_CHARS = 200  # the longest text a URL parameter may set (a filter, a key's name)
URL_MAX_VALUES = 40  # the most values a repeated URL parameter may set (config columns)


def from_url(param: str, key: str, *, default: object, refusal: Callable[[str], str | None]) -> None:
    """Seed the widget ``key`` with ``?param=`` on the session's first run of the page when
    ``refusal(value)`` finds nothing against it; else say what it found (as text) and start from
    ``default``.  Later runs keep what the user picked."""
    state = st.session_state
    if key in state:
        return
    asked = st.query_params.get(param)
    why = None if asked is None else refusal(asked)
    if why:
        st.warning(md_text(why))
    state[key] = default if asked is None or why else asked


def url_choice(
    param: str,
    key: str,
    choices: Sequence[str],
    *,
    default: str | None,
    refusal: Callable[[str], str | None] | None = None,
) -> None:
    """Seed the widget ``key`` with ``?param=`` on the session's first run of the page, when it
    is one of ``choices``; else say why not (``refusal(value)``, or a plain "not one of"), and
    start from ``default``.  Later runs keep what the user picked; a value that left ``choices``
    (a key the runs no longer log) falls back to ``default``."""

    def refused(asked: str) -> str | None:
        if asked in choices:
            return None
        return (refusal(asked) if refusal is not None else None) or (
            f"{param}={shorten(asked)!r} is not one of the choices here; ignored"
        )

    from_url(param, key, default=default, refusal=refused)
    if st.session_state[key] not in choices:
        st.session_state[key] = default


def url_flag(param: str, key: str, *, default: bool) -> None:
    """Seed the toggle ``key`` with ``?param=1`` or ``0`` on the session's first run of the page."""
    from_url(param, key, default=default, refusal=lambda asked: _refuse(asked not in ("0", "1"), f"{param}= is 1 or 0"))
    if isinstance(st.session_state[key], str):
        st.session_state[key] = st.session_state[key] == "1"


def url_text(param: str, key: str, *, max_chars: int = URL_MAX_CHARS, default: str | None = "") -> None:
    """Seed the text (or free choice) widget ``key`` with ``?param=``, refused beyond ``max_chars``."""
    too_long = f"{param}= is longer than {max_chars} characters"
    from_url(param, key, default=default, refusal=lambda asked: _refuse(len(asked) > max_chars, too_long))


def _refuse(refused: bool, why: str) -> str | None:
    return f"{why}; ignored" if refused else None


def url_number(param: str, key: str, *, default: float, refusal: Callable[[float], str | None]) -> None:
    """Seed the slider ``key`` with the number ``?param=`` when ``refusal(number)`` finds nothing
    against it, on the session's first run of the page."""

    def refused(asked: str) -> str | None:
        try:
            why = refusal(float(asked))
        except ValueError:
            why = "not a number"
        return None if why is None else f"{param}={shorten(asked)!r}: {why}; ignored"

    from_url(param, key, default=default, refusal=refused)
    if isinstance(st.session_state[key], str):
        st.session_state[key] = float(st.session_state[key])


def url_texts(param: str, key: str, *, default: Sequence[str] = ()) -> None:
    """Seed the multiselect ``key`` with every ``?param=`` (at most ``URL_MAX_VALUES``, each at most
    ``URL_MAX_CHARS`` long; the others are said and ignored), or ``default`` with none, on the
    session's first run of the page."""
    state = st.session_state
    if key in state:
        return
    if param not in st.query_params:
        state[key] = list(default)
        return
    asked = st.query_params.get_all(param)
    kept = list(dict.fromkeys(value for value in asked if len(value) <= URL_MAX_CHARS))[:URL_MAX_VALUES]
    if len(kept) < len(asked):
        st.warning(md_text(f"{len(asked) - len(kept)} {param}= values ignored: at most {URL_MAX_VALUES}, "
                           f"each at most {URL_MAX_CHARS} characters"))  # fmt: skip
    state[key] = kept


def to_url(param: str, value: str | Sequence[str] | None, *, default: str | Sequence[str] | None = None) -> None:
    """Write ``value`` to ``?param=`` (a sequence: the parameter repeated), or leave the parameter
    out while it is ``default`` (or empty)."""
    values = [value] if isinstance(value, str) else list(value or ())
    if not values or values == ([default] if isinstance(default, str) else list(default or ())):
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get_all(param) != values:
        st.query_params[param] = values if len(values) > 1 else values[0]


def smoothing_slider(default: float = SMOOTHING_DEFAULT) -> float:
    """The smoothing slider (key ``smoothing``), in the URL as ``?smoothing=0.8``."""
    url_number("smoothing", "smoothing", default=default, refusal=smoothing_error)
    smoothing = st.slider("Smoothing", 0.0, SMOOTHING_MAX, step=SMOOTHING_STEP, key="smoothing")
    to_url("smoothing", f"{smoothing:g}", default=f"{default:g}")
    return smoothing


def log_y_toggle(label: str) -> bool:
    """The log-scale y toggle (key ``log_y``), in the URL as ``?log=1``."""
    url_flag("log", "log_y", default=False)
    log_y = st.toggle(label, key="log_y")
    to_url("log", "1" if log_y else "0", default="0")
    return log_y
