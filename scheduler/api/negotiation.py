"""Content negotiation that answers the common case without parsing: most API clients send no
Accept header (or `*/*`) and no `?format=`, and then DRF picks the view's first renderer."""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation


class ApiContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, with its answer to "anything will do" given at once: the first
    renderer and its media type, as DefaultContentNegotiation returns for `*/*`, without parsing
    the header and matching it against every renderer on every request."""

    def select_renderer(self, request, renderers, format_suffix=None):
        meta = request.META
        if (
            renderers
            and meta.get("HTTP_ACCEPT", "*/*") == "*/*"
            and not format_suffix
            # Without a query string, no ?format= (and no QueryDict to build to find out).
            and (
                not meta.get("QUERY_STRING")
                or self.settings.URL_FORMAT_OVERRIDE not in request.query_params
            )
        ):
            return renderers[0], renderers[0].media_type
        return super().select_renderer(request, renderers, format_suffix)
