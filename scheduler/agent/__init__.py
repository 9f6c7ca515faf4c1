"""The node agent: runs on each GPU machine, talks only HTTP to the portal. No Django here.

`python -m scheduler.agent --help`; see docs/agent.md."""
