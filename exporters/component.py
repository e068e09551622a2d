"""Component declarations for the local stack (filled in by its issue)."""

from fleetsight.components import Component

COMPONENTS: list[Component] = []
