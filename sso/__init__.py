"""Single sign-on with OpenID Connect (docs/sso.md): the organisation's identity provider logs
people in to the admin, the dashboards and the API's pages; its group claims decide their teams
and roles through GroupMapping, at each login, and every login is recorded."""
