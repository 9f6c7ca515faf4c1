"""The project's documents as pages of the portal (/docs/): a page that points a person to a
document links to it, and the link leads there. Links between documents lead to their pages,
and to the heading their anchor names, as on the repository's own pages."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db

HREF = re.compile(r'href="([^"]*)"')


def ids_on(page: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', page))


def get(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def follows(client, href: str) -> None:
    """`href` leads to a document page with the heading its anchor names."""
    path, _, anchor = href.partition("#")
    page = get(client, path)
    assert not anchor or anchor in ids_on(page), f"{href}: no heading #{anchor}"


def test_every_document_is_listed_and_its_links_to_others_lead_to_them(client):
    index = get(client, "/docs/")
    listed = [h for h in HREF.findall(index) if re.fullmatch(r"/docs/[a-z0-9_-]+/", h)]
    names = sorted(p.stem for p in settings.DOCS_DIR.glob("*.md"))
    assert sorted(h.split("/")[2] for h in listed) == names
    links = set()
    for href in listed:
        page = get(client, href)
        assert re.search(r"<h1[^>]*>", page), f"{href}: no title"
        links |= {h for h in HREF.findall(page) if h.startswith("/docs/") and h != "/docs/"}
    assert "/docs/deploy/#sizing" in links  # docs/agent.md's link to deploy.md#sizing
    for href in sorted(links):
        follows(client, href)


def test_the_pages_that_point_to_a_document_link_to_it(client, carol, alice, vision_share):
    client.force_login(alice)
    notifications = get(client, "/dash/notifications/")
    assert '<a href="/docs/notifications/#the-payload">' in notifications
    assert 'href="/docs/"' in notifications  # the header, for everyone signed in
    client.force_login(carol)  # vision's lead
    team = get(client, f"/dash/teams/{vision_share.team.slug}/")
    hrefs = [h for page in (notifications, team) for h in HREF.findall(page)]
    to_docs = [h for h in hrefs if h.startswith("/docs/") and h != "/docs/"]
    assert {h.split("#")[0] for h in to_docs} >= {"/docs/notifications/", "/docs/chargeback/",
                                                  "/docs/dashboards/"}  # fmt: skip
    for href in to_docs:
        follows(client, href)


def test_a_document_s_own_html_is_shown_as_text_and_unknown_names_are_404(
    client, settings, tmp_path
):
    (tmp_path / "guide.md").write_text(
        "# A guide\n\n<script>alert(1)</script>\n\n[click](javascript:alert(1)) "
        "[the other](other.md#part-two) [absent](absent.md)\n\n## Part two\n\n## Part two\n"
    )
    (tmp_path / "other.md").write_text("# Other\n\n## Part two\n")
    settings.DOCS_DIR = tmp_path
    page = get(client, "/docs/guide/")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="javascript:' not in page  # shown as text, not a link
    assert 'href="/docs/other/#part-two"' in page
    assert 'href="absent.md"' in page  # not a document here: left as written
    assert {"a-guide", "part-two", "part-two-1"} <= ids_on(page)
    for name in ("absent", "Guide", "..%2Fsecret"):
        assert client.get(f"/docs/{name}/").status_code == 404
