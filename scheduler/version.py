"""The portal's version, in one place: the wheel's (pyproject.toml reads it), the agent's and the
server's `--version`, and what an agent tells the portal when it registers."""

VERSION = "0.2.0"
