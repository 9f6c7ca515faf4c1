"""The words the node agent and the portal exchange (no Django: both sides import it).

The agent POSTs JSON to four endpoints: it registers, then long-polls for its orders (run and
stop) with what it has to report, asks to start the attempts whose run orders it got, and
reports on its own when it cannot wait for the next poll."""

REGISTER_PATH = "/api/v1/agent/register/"
POLL_PATH = "/api/v1/agent/poll/"
START_PATH = "/api/v1/agent/start/"
REPORT_PATH = "/api/v1/agent/report/"

# How long an agent waits for the portal's answer: to a poll, its wait and POLL_ANSWER_SECONDS
# more; to any other request, ANSWER_SECONDS (a connector's registration and starts, which carry
# a whole cluster's, CONNECTOR_ANSWER_SECONDS). Then it gives up and sends it again (what it
# reports it keeps until answered): the portal leaves undone the work of a request that waited
# longer than that for a database thread (portal.db.threads).
ANSWER_SECONDS = 10.0
POLL_ANSWER_SECONDS = 15.0
CONNECTOR_ANSWER_SECONDS = 30.0

# What an agent reports about an attempt.
EVENT_STARTED = "started"
EVENT_EXITED = "exited"
EVENT_LOG = "log"
# The job saved a checkpoint `age` seconds ago (by the node's clock): a preemption would lose
# only the work done since.
EVENT_CHECKPOINT = "checkpoint"
EVENT_TYPES = (EVENT_STARTED, EVENT_EXITED, EVENT_LOG, EVENT_CHECKPOINT)
# A job says it has saved a checkpoint by creating or replacing this file in its
# CHECKPOINT_DIR, once the checkpoint itself is complete (`portal_client.checkpoint_saved()`);
# its modification time is when. docs/agent.md.
CHECKPOINT_MARKER = ".portal-checkpoint"
# Why a process ended, as the agent saw it.
END_EXIT = "exit"  # it exited by itself, or after a stop order
END_TIMEOUT = "timeout"  # the agent stopped it at timeout_seconds
END_NEVER_STARTED = "never_started"  # stopped before it started, or could not start
END_LOST = "lost"  # the agent does not have it (restarted since)
# A connector's cluster manager would not start it on the GPUs the portal gave it (they were
# taken by something else): withdrawn, and the job requeued.
END_WITHDRAWN = "withdrawn"
END_REASONS = (END_EXIT, END_TIMEOUT, END_NEVER_STARTED, END_LOST, END_WITHDRAWN)
# A connector (`gpu-agent slurm`) speaks the same words for all the nodes of its cluster at
# once: it registers them together, and its polls, starts and reports are about all of them.
CONNECTOR_REGISTER_PATH = "/api/v1/agent/connector/register/"
CONNECTOR_POLL_PATH = "/api/v1/agent/connector/poll/"
CONNECTOR_START_PATH = "/api/v1/agent/connector/start/"
CONNECTOR_REPORT_PATH = "/api/v1/agent/connector/report/"
# A node's state, as a connector reports it from its cluster manager.
NODE_READY = "READY"
NODE_DRAINING = "DRAINING"
NODE_DOWN = "DOWN"
NODE_STATES = (NODE_READY, NODE_DRAINING, NODE_DOWN)

# Why an attempt never started where its job names a working directory the node does not have.
WORKING_DIR_MISSING = "working directory {path} is not a directory on node {node}"
WORKING_DIR_UNREADABLE = "working directory {path} cannot be looked up on node {node}: {error}"
# {where}: "node N" (an agent), "the host of connector C" (a connector).
CHECKPOINT_DIR_UNUSABLE = "could not make checkpoint directory {path} on {where}: {error}"

# A log tail is a log's last this many characters: the agent sends no more, the portal keeps
# no more.
LOG_TAIL_CHARS = 8000
