"""Content negotiation: a client that accepts anything gets JSON; one that asks for a media type
gets it when the API has it, and a 406 when it does not."""

from __future__ import annotations

from tests.api.helpers import job_request

JOBS = "/api/v1/jobs/"


def test_a_client_that_accepts_anything_gets_json(world):
    """No Accept header, or `*/*`: JSON, as DRF's first renderer answers."""
    client = world.client("bob")
    for accept in ({}, {"HTTP_ACCEPT": "*/*"}):
        response = client.post(JOBS, job_request(), format="json", **accept)
        assert response.status_code == 201, response.content
        assert response["Content-Type"] == "application/json"
        assert response.json()["state"] == "RUNNABLE"


def test_a_client_that_names_a_media_type_gets_what_drf_negotiates(world):
    """Asking for JSON with parameters, or with ?format=, still goes through DRF's
    negotiation; a media type the API does not have is a 406."""
    client = world.client("bob")
    response = client.get(JOBS, HTTP_ACCEPT="application/json; indent=4")
    assert (response.status_code, response["Content-Type"]) == (200, "application/json")
    assert b'\n    "count"' in response.content  # the indent DRF read from the media type
    response = client.get(JOBS + "?format=json", HTTP_ACCEPT="*/*")
    assert (response.status_code, response["Content-Type"]) == (200, "application/json")
    response = client.get(JOBS, HTTP_ACCEPT="text/csv")
    assert response.status_code == 406
    assert response.json()["detail"] == "Could not satisfy the request Accept header."


def test_a_browser_gets_json_not_an_error(world):
    """A browser asks for HTML first and takes anything after it: the API answers JSON (it has
    no HTML pages; Swagger UI at /api/docs/ is the browsable view). Asking for HTML alone is a
    406, never a 500."""
    client = world.client("bob")
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    for path in (JOBS, "/api/v1/shares/", "/api/v1/queue/", "/api/v1/nodes/"):
        response = client.get(path, HTTP_ACCEPT=browser)
        assert (response.status_code, response["Content-Type"]) == (200, "application/json")
    assert client.get(JOBS, HTTP_ACCEPT="text/html").status_code == 406


def test_a_path_no_endpoint_matches_gets_json_even_with_a_newline_in_it(world):
    """An API path no endpoint matches is a JSON 404 naming the path, whatever characters it
    holds (Schemathesis found a share name with a newline getting Django's HTML page)."""
    client = world.client("root")
    for path in ("/api/v1/nothing/", "/api/v1/shares/%0A%169/", "/api/v1/jobs/%0A/"):
        response = client.patch(path, {}, format="json")
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json"
        assert "no API endpoint at" in response.json()["detail"]
