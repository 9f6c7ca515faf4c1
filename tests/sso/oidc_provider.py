"""The real OpenID provider that the single sign-on tests log in through: panva's oidc-provider
run with node (provider/provider.mjs), on a fixed port, its users and groups in a JSON file
it reads at each request."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import requests

PROVIDER_DIR = Path(__file__).resolve().parent / "provider"
PORT = 18411
CLIENT_ID = "gpu-portal"
CLIENT_SECRET = "test-client-secret"
NOT_INSTALLED = (
    "the test OpenID provider is not installed: run tests/sso/provider/install.sh "
    "(node >= 20 and npm)"
)


def provider_missing() -> str | None:
    """Why the provider cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed: " + NOT_INSTALLED
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        return NOT_INSTALLED
    return None


class OidcProvider:
    """One provider process; `users` and `break_id_tokens` rewrite what it reads next."""

    def __init__(
        self,
        state_file: Path,
        redirect_uri: str,
        log_file: Path,
        post_logout_redirect_uris: tuple[str, ...] = (),
    ) -> None:
        self.state_file = state_file
        self.redirect_uri = redirect_uri
        self.post_logout_redirect_uris = post_logout_redirect_uris
        self.log_file = log_file
        self.issuer = f"http://127.0.0.1:{PORT}"
        self.process: subprocess.Popen | None = None
        self.reset()

    def reset(self) -> None:
        self._write({"users": {}, "id_token": "genuine"})

    def _write(self, state: dict) -> None:
        partial = self.state_file.with_suffix(".tmp")
        partial.write_text(json.dumps(state))
        partial.replace(self.state_file)  # the provider never reads half a file

    def _read(self) -> dict:
        return json.loads(self.state_file.read_text())

    def set_user(self, username: str, *, password: str, groups: list[str]) -> None:
        """Creates `username`, or changes their password and groups from the next token on."""
        state = self._read()
        state["users"][username] = {"password": password, "groups": groups}
        self._write(state)

    def break_id_tokens(self, how: str) -> None:
        """From now on the token endpoint's ID tokens are `how`: expired, tampered or
        wrong-issuer (genuine again with "genuine")."""
        state = self._read()
        state["id_token"] = how
        self._write(state)

    def go_down_after_the_code(self) -> None:
        """The provider stops as it sends the browser back with a code: the portal cannot
        exchange it."""
        state = self._read()
        state["down_after_code"] = True
        self._write(state)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        env = dict(
            os.environ,
            PORT=str(PORT),
            CLIENT_ID=CLIENT_ID,
            CLIENT_SECRET=CLIENT_SECRET,
            REDIRECT_URI=self.redirect_uri,
            POST_LOGOUT_REDIRECT_URIS=" ".join(self.post_logout_redirect_uris),
            STATE_FILE=str(self.state_file),
        )
        log = self.log_file.open("ab")
        self.process = subprocess.Popen(
            ["node", "provider.mjs"], cwd=PROVIDER_DIR, env=env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the OpenID provider exited: {self.log_file.read_text()}")
            try:
                requests.get(f"{self.issuer}/jwks", timeout=1).raise_for_status()
                return
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError(f"the OpenID provider did not answer: {self.log_file.read_text()}")

    def stop(self) -> None:
        if self.running:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None
        # Nothing answers on the port any more: the portal must meet a provider that is down.
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", PORT)) != 0

    @property
    def end_session_endpoint(self) -> str:
        """Its end_session_endpoint, for OIDC_OP_LOGOUT_ENDPOINT."""
        return f"{self.issuer}/session/end"

    def portal_settings(self) -> dict:
        """The portal's OIDC_* settings for this provider, as docs/sso.md has them."""
        return {
            "OIDC_ENABLED": True,
            "OIDC_PROVIDER_NAME": "Test IdP",
            "OIDC_OP_ISSUER": self.issuer,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.issuer}/auth",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.issuer}/token",
            "OIDC_OP_USER_ENDPOINT": f"{self.issuer}/me",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.issuer}/jwks",
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_RP_SCOPES": "openid email profile groups",
            "PASSWORD_LOGIN": "admins",
        }
