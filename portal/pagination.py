"""The one pagination of the REST API's lists: `page` (1, 2, ... or `last`) and `page_size` (1 to
MAX_PAGE_SIZE, default the settings' PAGE_SIZE), each refused with a 400 that names it and its
rule rather than ignored, and a page past the last a 404 that says how many there are."""

from __future__ import annotations

from django.core.paginator import InvalidPage
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination

MAX_PAGE_SIZE = 500
PAGE_RULE = "page: must be a page number (1 or more) or last."
PAGE_SIZE_RULE = f"page_size: must be a whole number from 1 to {MAX_PAGE_SIZE}."
PAST_THE_LAST = "page {page}: past the last page ({last})."


def _whole_number(value: str) -> int | None:
    return int(value) if value.isascii() and value.isdigit() else None


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request) -> int:
        asked = request.query_params.get(self.page_size_query_param)
        if asked is None:
            return self.page_size
        size = _whole_number(asked)
        if size is None or not 1 <= size <= self.max_page_size:
            raise ValidationError({self.page_size_query_param: [PAGE_SIZE_RULE]})
        return size

    def get_page_number(self, request, paginator) -> int:
        asked = request.query_params.get(self.page_query_param, "1")
        if asked in self.last_page_strings:
            return paginator.num_pages
        page = _whole_number(asked)
        if page is None or page < 1:
            raise ValidationError({self.page_query_param: [PAGE_RULE]})
        return page

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        paginator = self.django_paginator_class(queryset, self.get_page_size(request))
        page = self.get_page_number(request, paginator)
        try:
            self.page = paginator.page(page)
        except InvalidPage:
            raise NotFound(
                {self.page_query_param: [PAST_THE_LAST.format(page=page, last=paginator.num_pages)]}
            ) from None
        return list(self.page)
