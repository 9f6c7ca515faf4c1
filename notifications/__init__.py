"""Notifications: people subscribe to what happens to their jobs and shares
(docs/notifications.md)."""
