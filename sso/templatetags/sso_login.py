"""The login pages' single sign-on button, and whether they show the password form."""

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("sso/login_button.html")
def sso_login_button(next_url: str = "") -> dict:
    """The "Log in with <provider>" button, back to `next_url` afterwards; nothing when single
    sign-on is off."""
    return {
        "enabled": settings.OIDC_ENABLED,
        "provider_name": settings.OIDC_PROVIDER_NAME,
        "password_login": settings.PASSWORD_LOGIN,
        "next": next_url,
    }


@register.simple_tag
def password_form_shown(page: str) -> bool:
    """Whether the login page `page` ("admin" or "dashboards") shows a password form: the
    admin's while any local password may log in; the dashboards' only when everyone's may."""
    if page == "admin":
        return settings.PASSWORD_LOGIN != "none"
    return settings.PASSWORD_LOGIN == "all"
