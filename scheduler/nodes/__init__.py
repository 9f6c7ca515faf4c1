"""What node agents talk to: their HTTP endpoints (views, urls), registration, heartbeats and
orders (services), and what an attempt's end does to its job (attempts)."""
