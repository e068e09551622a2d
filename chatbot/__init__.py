"""The runbook chatbot: answers from the runbooks and live state, always with citations (docs/chatbot.md)."""
