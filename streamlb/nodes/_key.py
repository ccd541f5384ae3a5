"""streamlb's ``key_by`` node, in a module of its own: the keyed operators' modules
(``_nodes_join``, ``nodes``) check their upstream against it without importing each other."""
from __future__ import annotations

from streamz import Stream

from ._base import _check_name, _Described
from ..exceptions import PipelineError


@Stream.register_api()
class key_by(_Described):
    """Keyed exchange: route each row to the instance owning its key group.

    Parameters
    ----------
    key : str or callable
        A column name, or a function of the batch (DataFrame) returning one key per row.
    name : str, optional
        Column that holds the keys a function returns (default ``"key"``).

    Examples
    --------
    >>> from streamz import Stream
    >>> s = Stream.from_iterable([{"word": "a"}, {"word": "b"}])
    >>> s.key_by("word").aggregate({"n": ("word", "count")})  # doctest: +ELLIPSIS
    <aggregate...>
    """

    def __init__(self, upstream, key, name=None, **kwargs):
        if not (isinstance(key, str) or callable(key)):
            raise PipelineError(f"key_by: key must be a column name or a function, got {key!r}")
        _check_name(name, "key_by")
        self.key = key
        self.key_name = key if isinstance(key, str) else (name or "key")
        super().__init__(upstream, **kwargs)
