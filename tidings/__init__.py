"""Tidings: transactional email and SMS, audiences, broadcasts and signed webhooks."""

__version__ = "0.1.0"
