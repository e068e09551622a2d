"""A passage an answer cites: its number, runbook file, section, anchor, quote and score.

Its own module because both the answerer (chatbot/answer.py), which makes citations, and the model's
guard (chatbot/llm.py), which checks that an answer cites only passages it was given, read it; neither
of those two modules imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Citation:
    n: int
    file: str
    section: str
    anchor: str
    quote: str
    score: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "file": self.file,
            "section": self.section,
            "anchor": self.anchor,
            "quote": self.quote,
            "score": round(self.score, 3),
        }
