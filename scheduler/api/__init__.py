"""The REST API (`/api/v1/`): jobs, shares, the queue snapshot and nodes. Thin: views call
selectors to read and services to write."""
