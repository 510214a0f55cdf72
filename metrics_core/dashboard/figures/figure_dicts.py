"""Plotly figures as plain dicts, and their JSON.

A figure here is plotly's own JSON structure (``Figure``: ``{"data": [...], "layout": {...}}``,
per-point properties as numpy arrays), built by ``figure_of`` without plotly: plotly's objects
validate every property and deep-copy every trace on construction and again on serialisation, a
cost paid on every live update of every chart.  ``tests/unit/test_figures.py`` validates the same dicts
with plotly and compares the JSON (``figure_json``), so a typo still fails there.  The dashboard
imports no plotly at all; plotly.js draws the JSON.  Nothing here reads files or knows Streamlit.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd


class Props:
    """A read-only view of a plotly property dict, read as plotly's objects read: ``trace.name`` is
    ``trace["name"]`` and None when unset; nested dicts and lists of dicts are views too."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _view(self._values.get(name))

    def __getitem__(self, name: str) -> Any:
        return _view(self._values.get(name))


def _view(value: Any) -> Any:
    if isinstance(value, dict):
        return Props(value)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [Props(item) for item in value]
    return value


class Figure(dict):
    """A figure as plotly's JSON structure: ``{"data": [trace dicts], "layout": {...}}``, per-point
    properties as numpy arrays.  Never changed once built: figures are memoised per snapshot and
    shared by every tab.  ``figure.data[0].name`` and ``figure.layout.yaxis.range`` read it as
    plotly's objects do (``Props``); ``st.plotly_chart`` takes it as the dict it is."""

    @property
    def data(self) -> list[Props]:
        return [Props(trace) for trace in self["data"]]

    @property
    def layout(self) -> Props:
        return Props(self["layout"])


def figure_of(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> Figure:
    """``traces`` and ``layout`` (plotly's own property names) as a figure, unvalidated and uncopied
    (see the module docstring); properties set to None are left out, as plotly leaves them out."""
    data = [
        {"type": "scatter", **{name: value for name, value in trace.items() if value is not None}} for trace in traces
    ]
    return Figure(data=data, layout=layout)


# numpy dtypes plotly.js reads from base64 ("typed arrays"), by the names plotly.py gives them.
TYPED_ARRAYS = {
    "int8": "i1",
    "uint8": "u1",
    "int16": "i2",
    "uint16": "u2",
    "int32": "i4",
    "uint32": "u4",
    "float32": "f4",
    "float64": "f8",
}
_UNPACKED_KEYS = ("range",)  # plotly.py leaves these lists as lists


def typed_array(values: np.ndarray) -> Any:
    """``values`` as plotly.py sends an array: base64 of its bytes in the narrowest integer type
    (plotly.js has no 64-bit integers), 8 or 4 bytes a float; else a plain list."""
    if values.size and values.dtype.kind in "iu" and values.dtype.itemsize == 8:
        low, high = int(values.min()), int(values.max())
        for kind in ("int8", "int16", "int32") if values.dtype.kind == "i" else ("uint8", "uint16", "uint32"):
            info = np.iinfo(kind)
            if info.min <= low and high <= info.max:
                values = values.astype(kind)
                break
    short = TYPED_ARRAYS.get(str(values.dtype))
    if not values.size or short is None:
        return values.tolist()
    packed = {"dtype": short, "bdata": base64.b64encode(np.ascontiguousarray(values)).decode("ascii")}
    if values.ndim > 1:
        packed["shape"] = str(values.shape)[1:-1]
    return packed


def _packed(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: item if key in _UNPACKED_KEYS else _packed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_packed(item) for item in value]
    if isinstance(value, np.ndarray):
        return typed_array(value)
    return value


def _plain(value: Any) -> Any:
    """What orjson cannot write itself: numpy object arrays, pandas timestamps."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_text(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` as JSON (NaN and infinities as null, as plotly.py writes them); numpy arrays as lists."""
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    return orjson.dumps(value, option=option, default=_plain).decode()


def figure_json(figure: dict[str, Any]) -> str:
    """``figure`` as the JSON plotly.py would send for it: numeric arrays packed (``typed_array``)."""
    return json_text(_packed(figure))
