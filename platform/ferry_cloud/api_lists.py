"""Lists in the REST API: declared query parameters, cursor pages, one answer shape.

Every list declares its query parameters as a serializer (a subclass of ListQuery): limit,
cursor, ordering and its own filters. A parameter the list does not declare, or one given
twice, is a 400 naming it: a typo in a filter must not silently answer the whole fleet.
Pages are cursor pages ({"next", "previous", "results"}); ``next`` is the URL of the next page
with the same filters, null on the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

MAX_LIMIT = 500
DEFAULT_LIMIT = 100


class ListQuery(serializers.Serializer):
    """The query parameters every list takes. Subclasses add filters and set ORDERING (the first
    is the default); orderings name fields that never change or are null, so cursors stay valid."""

    ORDERING: Sequence[str] = ("-created_at",)
    LIST_PARAMETERS: frozenset[str] = frozenset()  # filters that may be repeated (?state=a&state=b)

    limit = serializers.IntegerField(
        min_value=1, max_value=MAX_LIMIT, required=False, default=DEFAULT_LIMIT, help_text="Rows per page."
    )
    cursor = serializers.CharField(
        required=False, max_length=1000, help_text="Opaque: take it from the previous page's next link."
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["ordering"] = serializers.ChoiceField(
            choices=list(self.ORDERING),
            required=False,
            default=self.ORDERING[0],
            help_text="A field to order by; a leading '-' orders descending.",
        )
        return fields

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        errors = {}
        for name in data:
            if name not in self.fields:
                errors[name] = [
                    f"Unknown query parameter; this list takes: {', '.join(sorted(self.fields))}."
                ]
            elif name not in self.LIST_PARAMETERS and len(data.getlist(name)) > 1:
                errors[name] = ["Given more than once; give it once."]
        try:
            values = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            errors = {**exc.detail, **errors}
        if errors:  # every bad parameter at once, not one per round trip
            raise serializers.ValidationError(errors)
        return values


def list_query(query_class: type[ListQuery], request: Request) -> dict[str, Any]:
    """The validated query parameters (400 naming each bad one)."""
    query = query_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data


class InvalidCursor(serializers.ValidationError):
    pass


class Page(CursorPagination):
    """A cursor page in the ordering and of the size the validated query asked for."""

    def __init__(self, *, ordering: str, limit: int) -> None:
        self._ordering = ordering
        self._limit = limit

    def get_page_size(self, request: Request) -> int:
        return self._limit

    def get_ordering(self, request: Request, queryset: QuerySet, view: Any) -> tuple[str, ...]:
        # the primary key breaks ties, so a page boundary inside equal values stays stable
        tiebreak = "-pk" if self._ordering.startswith("-") else "pk"
        return (self._ordering, tiebreak)

    def decode_cursor(self, request: Request):
        try:
            return super().decode_cursor(request)
        except Exception:  # DRF answers a bad cursor 404; it is a bad parameter
            raise InvalidCursor({"cursor": ["Invalid cursor: take it from a next link."]}) from None


def paginated(
    request: Request, queryset: QuerySet, query: dict[str, Any], serialize: Callable[[list], list]
) -> Response:
    """One page of ``queryset`` per the validated ``query``, serialized by ``serialize``."""
    page = Page(ordering=query["ordering"], limit=query["limit"])
    rows = page.paginate_queryset(queryset, request)
    return page.get_paginated_response(serialize(list(rows)))


@cache  # one component per name, however many endpoints answer it
def page_of(output: type[serializers.Serializer], name: str) -> serializers.Serializer:
    """The OpenAPI schema of a page of ``output`` rows."""
    return inline_serializer(
        name=name,
        fields={
            "next": serializers.URLField(allow_null=True, help_text="The next page; null on the last."),
            "previous": serializers.URLField(allow_null=True),
            "results": output(many=True),
        },
    )
