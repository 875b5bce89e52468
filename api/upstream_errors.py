"""What a failed call to Triton raises, apart from :mod:`api.upstream` so that the streamed
reply (:mod:`api.upstream_stream`), which the client's module opens, raises it too."""

from __future__ import annotations


class UpstreamUnavailableError(Exception):
    """Triton could not be reached or dropped the connection."""
