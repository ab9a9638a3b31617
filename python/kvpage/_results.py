"""What the frozen result objects share: to_dict() and to_pandas()."""

from __future__ import annotations

from typing import Any, Dict, List


def optional_pandas() -> Any:
    """The pandas module, or ImportError saying that to_pandas() needs it."""
    try:
        import pandas
    except ImportError as error:  # pandas is not a dependency of kvpage
        raise ImportError("to_pandas() needs pandas: pip install pandas") from error
    return pandas


def records_frame(records: List[Dict[str, Any]]) -> Any:
    return optional_pandas().DataFrame.from_records(records)
